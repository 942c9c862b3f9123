"""The host model's two rules, defined once (docs/simulator.md "The host model").

The simulator's shared host (``simulator/host.py``) and the calibration that measures it
(``core/calibration.py``, ``testbed/calibration/calibrate.py``) both apply them.
"""

from __future__ import annotations

__all__ = ["host_shared", "host_speed"]


def host_speed(cores: float, demand_cores: float) -> float:
    """The speed a host of ``cores`` leaves each engine when its engines demand ``demand_cores``:
    processor sharing, as Linux's fair scheduler gives runnable threads; 1 while the cores suffice."""
    return min(1.0, cores / demand_cores) if demand_cores > 0 else 1.0


def host_shared(cores: float, engines: int, gpus_per_engine: int, engine_cores: float = 1.0) -> bool:
    """Whether engines on one host compete for its cores: CPU engines (no GPU of their own) that
    together can demand more than it has. A GPU engine computes on its own device."""
    return gpus_per_engine == 0 and engines * engine_cores > cores
