"""The self-test run by ``accel test`` (``test_script.py``)."""
