"""Faults: typed specs, the ground-truth timeline, health labels and bandwidth telemetry.

The objects exported here are pure: they are given ``now`` and never read a
clock, so the simulator and the real testbed drive the same code.
"""

from faults.health import HealthLabelModel, LabelChange
from faults.schedule import FaultSchedule, FaultStep, ScheduledEvent
from faults.spec import ComputeFault, FaultSpec, HealthSpec, LinkFault, TelemetrySpec
from faults.telemetry import BandwidthTelemetry

__all__ = [
    "BandwidthTelemetry",
    "ComputeFault",
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
