"""The testbed's nodes: network namespaces joined by veth links (``netns``), the emulated cluster
on one machine (``emulated``; its nodes started and awaited in ``raynodes``, its processes found
in ``runprocs``) brought up through ``ray up`` (``rayup``), a real cluster's file
(``clusterfile``), acting on every node (``nodes``), a port into a namespace (``forward``), test
traffic between nodes (``traffic``), and what a run may leave behind (``leftovers``)."""
