"""Two sets of runs compared: the sim-vs-testbed comparison (`testbed compare`, `testbed twin`: fidelity.py),
the paired report, the engine-death comparison and the testbed's repeatability, each judged by the
verdict rule of analysis/rule/verdict.py."""
