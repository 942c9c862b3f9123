"""Calibration: the testbed's engines and links fitted into the simulator's parameters (fit.py),
and the parameters fitted once from named testbed runs and frozen (frozen.py)."""
