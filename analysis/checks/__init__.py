"""The testbed's instruments checked against a run: the calibration's fits against the run's
quiet requests, a calibration refitted under the run's load, the host's demand and window."""
