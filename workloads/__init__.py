"""Request streams for both worlds: synthetic (Poisson, bursty Gamma, length
distributions, presets) and trace replay (the native format and the public
Azure, BurstGPT and Mooncake traces, `workloads.formats`). Pure: given a spec and a
`numpy.random.Generator`, never a clock."""

from workloads.generate import Request, Workload, generate, sample_lengths
from workloads.spec import (
    CHAT,
    TRACE_FORMATS,
    LONG_CONTEXT,
    PRESETS,
    ArrivalSpec,
    ChoiceLength,
    FixedLength,
    GammaArrival,
    LengthSpec,
    LogNormalLength,
    PoissonArrival,
    Preset,
    TraceArrival,
    UniformLength,
    WorkloadError,
    WorkloadSpec,
    preset,
)
from workloads.trace import Trace, load_trace

__all__ = [
    "CHAT",
    "LONG_CONTEXT",
    "PRESETS",
    "TRACE_FORMATS",
    "ArrivalSpec",
    "ChoiceLength",
    "FixedLength",
    "GammaArrival",
    "LengthSpec",
    "LogNormalLength",
    "PoissonArrival",
    "Preset",
    "Request",
    "Trace",
    "TraceArrival",
    "UniformLength",
    "Workload",
    "WorkloadError",
    "WorkloadSpec",
    "generate",
    "load_trace",
    "preset",
    "sample_lengths",
]
