"""The host ports of an emulated cluster (testbed/cluster/forward.py, testbed/runs/launch.py _host_ports):
what listens on localhost in the head's namespace (the router's metrics exporter, serving: the ingress)
answers on the same address on the host, and a port taken on the host stops the command in one line.
A namespace of the test's own, a real server in it (prometheus_client's, as the router's exporter)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import types
import uuid

import httpx
import pytest

from builders import shipped_spec_dict
from core.spec.model import parse_spec
from testbed.machine.netns import create_namespace, kill_processes_in, missing_privileges, netns_exec_argv, \
    remove_namespace, run_prefix
from testbed.cluster.raynodes import free_ports
from testbed.runs.launch import _host_ports

pytestmark = pytest.mark.skipif(missing_privileges() is not None,
                                reason=f"needs root for network namespaces: {missing_privileges()}")

# An exporter on the namespace's localhost, as the router actor serves its metrics on the head node.
EXPORTER = """
import sys, time
from prometheus_client import Counter, start_http_server
Counter("testbed_decisions", "routing decisions", ["policy"]).labels("LC").inc(3)
start_http_server(int(sys.argv[1]), addr="127.0.0.1")
print("up", flush=True)
time.sleep(120)
"""


def _free_port() -> int:
    return free_ports(1)[0]


@pytest.fixture
def head():
    """A namespace standing for the emulated cluster's head, with its loopback up and an exporter on it."""
    from pyroute2 import IPRoute

    from testbed.machine.netns import in_netns

    ns = run_prefix(uuid.uuid4().hex[:10]) + "head"
    port = _free_port()
    try:
        create_namespace(ns)
        with in_netns(ns), IPRoute() as ipr:
            ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")
        proc = subprocess.Popen(netns_exec_argv(ns, [sys.executable, "-c", EXPORTER, str(port)]),
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
        yield types.SimpleNamespace(mode="netns", fabric=types.SimpleNamespace(head=types.SimpleNamespace(netns=ns))), port
    finally:
        kill_processes_in([ns])
        remove_namespace(ns)


def _spec(metrics_port: int, ingress_port: int = 8000):
    base = shipped_spec_dict("testbed.yaml", faults=[])
    return parse_spec({**base, "testbed": {**base["testbed"], "metrics_port": metrics_port, "ingress_port": ingress_port}})


def test_the_metrics_exporter_in_the_heads_namespace_answers_on_the_host(head):
    cluster, port = head
    with pytest.raises(httpx.ConnectError):  # only inside the namespace, before
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2)
    with _host_ports(_spec(port), cluster, serve=False):
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        assert 'testbed_decisions_total{policy="LC"} 3.0' in text
    time.sleep(0.2)
    with pytest.raises(httpx.ConnectError):  # and the host port is given back at the end
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_no_metrics_port_forwards_nothing_and_serving_adds_the_ingress(head):
    cluster, port = head
    # a port free on the host, other than the exporter's: that one is taken only in the namespace, so
    # the host can hand it out again (CI, 2026-11-26: the ingress got it and forwarded to the exporter)
    ingress = next(p for p in free_ports(2) if p != port)
    with _host_ports(_spec(0, ingress), cluster, serve=True):
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2)
        with socket.socket() as s:  # the ingress's port is the forwarder's now
            with pytest.raises(OSError):
                s.bind(("127.0.0.1", ingress))


def test_a_port_taken_on_the_host_is_one_line_naming_the_setting(head):
    cluster, port = head
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        with pytest.raises(OSError) as err:
            with _host_ports(_spec(port), cluster, serve=False):
                pass
    msg = str(err.value)
    assert "\n" not in msg and f"127.0.0.1:{port}" in msg and "another testbed." in msg and "metrics_port" in msg, msg
