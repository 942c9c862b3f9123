"""Fault injection that changes the host: NIC shaping with pyroute2 (``shaping``), compute
slow-down (``throttle``: CPU quota through cgroups in ``cpu``/``cgroups``, GPU clocks through NVML
in ``gpu``, the backend chosen in ``compute``), the NIC's own rate limit of the KV's traffic class
for RDMA (``dcb``), the per-node fault agent (``agent``) and its Ray actor (``agent_actor``), and the fault
timeline on the wall clock (``injector``).

The pure fault model (specs, timeline, health labels, telemetry) is the top-level ``faults``
package; this is where the real world acts on it.
"""
