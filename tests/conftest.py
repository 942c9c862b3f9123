"""What several test modules share."""

from __future__ import annotations

import copy
from typing import Any

import pytest

# A small run that takes every hot path of both worlds' shared code: KV flows on a throttled link
# (pod 1 at r = 0.01), requests failing at their deadline, health labels changing, the price.
_FAULTED_SPEC: dict[str, Any] = {
    "name": "faulted",
    "seeds": [0],
    "topology": {"pods": 4, "workers_per_pod": 4, "uplink_gbps": 400.0},
    "workload": {"arrival": {"kind": "poisson", "rate_rps": 6.0}, "profile": "long_context", "duration_s": 60},
    "faults": [{"kind": "link", "pods": [1], "residual_bw": 0.01, "start_s": 10.0, "duration_s": 30.0}],
    "deadline_s": 20.0,
    "health": {"model": "alert"},
    "policies": ["FaultAwareOTF-R"],
}


@pytest.fixture(scope="session")
def faulted_spec() -> dict[str, Any]:
    """:data:`_FAULTED_SPEC`, as a copy of its own."""
    return copy.deepcopy(_FAULTED_SPEC)
