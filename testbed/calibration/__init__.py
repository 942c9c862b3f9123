"""Measuring the running testbed's engines and links for the simulator (``calibrate``)."""
