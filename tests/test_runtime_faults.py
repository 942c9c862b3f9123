"""Fault agents as Ray actors on an emulated cluster: a fault outlives no one.

* the driver that set a throttle is SIGKILLed: the node's agent removes the
  qdisc by itself when the throttle's time to live runs out;
* SIGTERM to the agent's process clears its faults before it exits.

Needs root and Ray; slow (a cluster comes up). The cluster, its namespaces
and every qdisc in them are removed in a ``finally``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from testbed.faults import shaping
from testbed.machine.netns import in_netns, list_namespaces, missing_privileges, run_prefix

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(missing_privileges() is not None, reason=f"needs root: {missing_privileges()}"),
    pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="Ray is not installed"),
]

TTL_S = 8.0

_DRIVER = """
import json, sys, time
import ray
from testbed.faults.agent_actor import FaultAgents
ray.init(logging_level="ERROR", log_to_driver=False)
agents = FaultAgents(1, ["eth0"], "node:__internal_head__")
pod = agents.pods[0]
ray.get(pod.apply_link.remote("link", "eth0", ["uplink", "downlink"], 10e6, float(sys.argv[1])))
try:
    ray.get(pod.apply_link.remote("link2", "v-pod0", ["uplink"], 10e6, 60.0))
    refused = ""
except Exception as e:
    refused = str(e).strip().splitlines()[-1]
print(json.dumps({"info": ray.get(pod.info.remote()), "active": ray.get(pod.active.remote()), "refused": refused}),
      flush=True)
if sys.argv[2] == "wait":
    time.sleep(600)
"""


def _installed(netns: str) -> dict[str, float]:
    with in_netns(netns):
        return shaping.installed("eth0")


def _wait_gone(netns: str, within_s: float) -> float | None:
    """Seconds until the project's shaping is gone from pod0's eth0, or None."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < within_s:
        if not _installed(netns):
            return time.monotonic() - t0
        time.sleep(0.1)
    return None


def test_a_throttle_outlives_its_killed_driver_only_until_its_ttl_and_sigterm_clears(tmp_path):
    from testbed.cluster.emulated import EmulatedCluster

    # started directly, not through `ray up` (20 s more): the fault agents' time to live is the
    # matter here, and the e2e cluster and test_runtime_cluster.py cover `ray up`
    cluster = EmulatedCluster(1, tmp_path / "state", tmp_path / "run", run_id=uuid.uuid4().hex[:10], mode="netns",
                              launcher="direct")
    driver = None
    try:
        cluster.up()
        pod0 = cluster.fabric.node("pod0").netns
        driver = cluster.popen_in_head([sys.executable, "-c", _DRIVER, str(TTL_S), "wait"], stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True)
        line = driver.stdout.readline()
        assert line, driver.stderr.read()[-3000:]
        applied_at = time.monotonic()
        report = json.loads(line)
        assert set(report["active"]) == {"link"}
        # The core-side veth is not on the allowlist: refused, and nothing was set on it.
        assert "not on the fault allowlist" in report["refused"]
        with in_netns(cluster.fabric.core_netns):
            assert shaping.installed("v-pod0") == {}
        assert _installed(pod0) == {"egress": 10e6, "ingress": 10e6}

        driver.send_signal(signal.SIGKILL)
        driver.wait()
        time.sleep(1.0)
        assert _installed(pod0), "the throttle went with the driver: the TTL is what must remove it"
        gone = _wait_gone(pod0, TTL_S + 5)
        assert gone is not None, "the qdisc outlived its time to live"
        since_apply = time.monotonic() - applied_at
        assert since_apply <= TTL_S + 1.5, f"removed {since_apply:.1f} s after applying, TTL {TTL_S} s"
        with in_netns(pod0):
            assert not shaping.has_link(shaping.ifb_name("eth0"))

        # The detached agent is still there; a throttle with a long TTL, then SIGTERM to the agent.
        r = cluster.run_in_head([sys.executable, "-c", _DRIVER, "600", "exit"], capture_output=True, text=True,
                                timeout=120)
        assert r.returncode == 0, r.stderr[-3000:]
        info = json.loads(r.stdout.strip().splitlines()[-1])["info"]
        assert "SIGTERM" in info["signals"]
        assert _installed(pod0)
        os.kill(info["pid"], signal.SIGTERM)
        assert _wait_gone(pod0, 5.0) is not None, "SIGTERM must clear the agent's faults before it exits"
    finally:
        if driver is not None and driver.poll() is None:
            driver.kill()
        cluster.down()
    assert list_namespaces(run_prefix(cluster.run_id)) == []
