"""The testbed's ground floor: what its rooms read of the node they run on (processes in /proc,
network namespaces, interfaces, GPUs, the KV transport's ports). Every other room of testbed/ may
import it; it imports none of them (tests/test_architecture.py)."""
