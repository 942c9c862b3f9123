"""The real world: vLLM engines as Ray actors on the nodes of a cluster, the router actor, and the
faults that act on the host. Rooms by role:

| room | holds |
| --- | --- |
| ``testbed.machine`` | the ground floor, what the rooms read of their node: processes in /proc, network namespaces, interfaces, which GPU is which, the KV ports |
| ``testbed.cluster`` | the cluster's nodes: the emulated cluster, ``ray up``, the cluster file, acting on every node, the preflight, what a run may leave behind |
| ``testbed.engines`` | one vLLM engine as a plain object and its Ray actor, the tiny model, vLLM's in-process hooks, the host's CPU share |
| ``testbed.router`` | the router actor: a request's flow under its limits, the OpenAI-compatible ingress, the Prometheus exporter |
| ``testbed.faults`` | the injectors: NIC shaping with pyroute2, CPU quota through cgroups, GPU clocks through NVML, the per-node agent, the fault timeline on the wall clock |
| ``testbed.calibration`` | measuring the real engines and links for the simulator |
| ``testbed.runs`` | a run's two halves: the launcher in the user's namespace and the driver in the head's |

Like the simulator, this package imports only ``vocab``, ``core``, ``faults`` and ``workloads``; the
command line (``cli``) and the study (``study``) import both worlds. A "host" in this project is a
machine whose cores engines share (``engine.host_cores``); the cluster's members are its nodes.
"""
