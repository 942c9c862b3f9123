"""Faults: typed specs, the ground-truth timeline, health labels and bandwidth telemetry.

The objects exported here are pure: they are given ``now`` and never read a
clock, so the simulator and the real testbed drive the same code. Nothing here touches
the host: the injectors that act on it (NIC shaping with pyroute2, CPU quota through cgroups,
GPU clocks through NVML, the per-node fault agent) live in the real world's ``testbed.faults``,
and the simulator applies the same steps to its links and workers (``simulator/cluster.py``).
"""

from faults.health import HealthLabelModel, LabelChange
from faults.schedule import FaultSchedule, FaultStep, ScheduledEvent
from faults.spec import ComputeFault, EngineFault, FaultSpec, HealthSpec, LinkFault, TelemetrySpec
from faults.telemetry import BandwidthTelemetry

__all__ = [
    "BandwidthTelemetry",
    "ComputeFault",
    "EngineFault",
    "FaultSchedule",
    "FaultStep",
    "FaultSpec",
    "HealthLabelModel",
    "HealthSpec",
    "LabelChange",
    "LinkFault",
    "ScheduledEvent",
    "TelemetrySpec",
]
