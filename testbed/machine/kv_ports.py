"""Where the KV transport listens: the TCP port range every engine tells UCX to listen in
(``UCX_TCP_PORT_RANGE``, set in the engine's own environment, testbed/engines/engine.py), so every
KV connection has one end in it and a ``kv_only`` link fault (testbed/faults/shaping.py) can tell KV
from the rest of a node's traffic (Ray's control, ssh) on any node, emulated or real."""

from __future__ import annotations

# 0x5000-0x50ff: one u32 mask matches it (shaping's filter).
KV_PORT_BASE, KV_PORT_MASK = 0x5000, 0xFF00
KV_PORT_RANGE = f"{KV_PORT_BASE}-{KV_PORT_BASE + 0xFF}"
# NIXL's side channel (the handshake before a pair's first pull): engine w of the topology listens
# on this port plus w, on its node (testbed/engines/pool.py).
SIDE_CHANNEL_BASE_PORT = 5600
# Ray's own, for a firewall between the nodes (Ray's "Configuring Ports" docs): the GCS on the
# head (cluster.yaml's ray start --port) and each node's worker ports; its node and object
# managers take random ports unless `ray start` pins them.
RAY_GCS_PORT = 6379
RAY_WORKER_PORTS = "10002-19999"
