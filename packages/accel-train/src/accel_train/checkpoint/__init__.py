"""Checkpoint files: what may be loaded.

``integrity``: a damaged file (cut short, garbled) is found before anything is loaded and reported as
`CorruptCheckpointError`, told apart from a crafted one. ``numbering``: which
``checkpoint_<n>`` an automatic save writes, and when it must stop instead. ``layout``: which backend
reads which folder of a checkpoint (by its name), and the files a DeepSpeed engine folder's loaders
open. The other checkpoint modules (``checkpoint_io``, ``checkpoint_safety``, ``checkpointing``) still
stand at the package root; this package is where they are to gather (issue 35: one checkpoint package).
"""
