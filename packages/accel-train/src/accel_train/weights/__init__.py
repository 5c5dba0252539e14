"""Weights a prepared model may hold elsewhere than in its parameters.

``offloaded``: the real values of weights that accel-bigmodel's offload hooks keep off the model.
``unloaded``: the refusal, at ``prepare``, of ``meta`` weights that nothing holds (never loaded).
"""
