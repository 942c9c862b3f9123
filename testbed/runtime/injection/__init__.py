"""Fault injection that changes the host: NIC shaping with pyroute2, compute slow-down
(CPU quota through cgroups, GPU clocks through NVML) and the per-node fault agent.

The pure fault model (specs, timeline, health labels, telemetry) is the top-level
``faults`` package; this is where the real world acts on it.
"""
