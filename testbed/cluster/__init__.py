"""The testbed's nodes: the emulated cluster on one machine (``emulated``, its nodes in network
namespaces of testbed/machine/netns.py; its nodes started and awaited in ``raynodes``) brought up
through ``ray up`` (``rayup``), a real cluster's file (``clusterfile``), acting on every node
(``nodes``), a port into a namespace (``forward``), test traffic between nodes (``traffic``), and
what a run may leave behind (``leftovers``)."""
