"""What is on each node of a Ray cluster, and clearing faults on every node, on a real local Ray.

One local Ray node (module-scoped, shut down after). The qdisc tests need root: they make a
network namespace of their own (removed at the end, pass or fail) and put the project's
shaping on a veth in it, as an agent that died without clearing would leave it.
"""

from __future__ import annotations

import importlib.util
import io
import os
import socket
import time
import uuid
from collections.abc import Iterator

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="Ray is not installed")

from testbed.machine.netns import missing_privileges  # noqa: E402

needs_root = pytest.mark.skipif(missing_privileges() is not None,
                                reason=f"needs root for network namespaces: {missing_privileges()}")


@pytest.fixture(scope="module")
def ray_local() -> Iterator[str]:
    import ray

    if ray.is_initialized():  # another module's connection: this module wants its own node
        ray.shutdown()
    ray.init(address="local", num_cpus=1, include_dashboard=False, resources={"pod0": 1.0},
             object_store_memory=100 * 2**20, logging_level="ERROR", log_to_driver=False)
    try:
        yield ray.get_runtime_context().get_node_id()
    finally:
        ray.shutdown()


@pytest.fixture
def shaped_netns() -> Iterator[str]:
    """A testbed-named namespace whose eth0 carries the project's egress and ingress shaping."""
    from pyroute2 import IPRoute

    from testbed.faults import shaping
    from testbed.machine.netns import create_namespace, in_netns, kill_processes_in, remove_namespace, run_prefix

    ns = run_prefix(uuid.uuid4().hex[:10]) + "pod0"
    try:
        create_namespace(ns)
        with in_netns(ns):
            with IPRoute() as ipr:
                ipr.link("add", ifname="eth0", kind="veth", peer="eth0p")
                for name in ("eth0", "eth0p"):
                    ipr.link("set", index=ipr.link_lookup(ifname=name)[0], state="up")
            shaping.shape(shaping.Shaping("eth0", "egress", 10e6))
            shaping.shape(shaping.Shaping("eth0", "ingress", 20e6))
            assert shaping.installed("eth0") == {"egress": 10e6, "ingress": 20e6}
        yield ns
    finally:
        kill_processes_in([ns])
        remove_namespace(ns)


def _this_node(results, node_id):
    mine = [r for r in results if r.node_id == node_id]
    assert len(mine) == 1, results
    return mine[0]


# --------------------------------------------------------------------------- node_report, cluster_status


def test_cluster_status_lists_this_node_with_its_interfaces_pods_and_privileges(ray_local):
    from testbed.cluster.nodes import cluster_status

    report = cluster_status(["lo", "no-such-if0"])
    assert len(report.nodes) == 1
    node = report.nodes[0]
    assert node.node_id == ray_local and node.alive and node.head and node.error is None
    assert node.cpus == 1.0 and node.gpus == 0.0 and node.pods == ("pod0",)
    r = node.report
    assert r is not None and r.problems == ()
    assert r.root == (os.geteuid() == 0) and r.uid == os.geteuid()
    assert r.pid != os.getpid(), "the report comes from a Ray worker, not the driver"
    assert r.hostname == socket.gethostname() and r.ip == node.ip
    names = [i.name for i in r.interfaces]
    assert "lo" in names and sorted(names) == sorted(os.listdir("/sys/class/net"))
    lo = next(i for i in r.interfaces if i.name == "lo")
    assert "127.0.0.1/8" in lo.addresses and lo.index == 1
    assert lo.operstate == open("/sys/class/net/lo/operstate").read().strip()
    assert r.gpus == () and r.gpu_missing, "no GPU here, and the reason is given"
    # pods, and which allowlisted interfaces exist on each pod's node
    assert report.pods == ("pod0",) and report.allowlist == ("lo", "no-such-if0")
    (pl,) = report.placements
    assert (pl.pod, pl.node_id, pl.allowlisted, pl.missing) == ("pod0", ray_local, ("lo",), ("no-such-if0",))
    assert report.problems == ()
    assert cluster_status(["no-such-if0"]).problems == (
        f"pod0 on {node.ip}: none of the allowlisted interfaces (no-such-if0) exists there",)


def test_render_marks_allowlisted_interfaces_and_shows_the_pods(ray_local):
    from rich.console import Console

    from testbed.cluster.nodes import cluster_status, render

    buf = io.StringIO()
    report = cluster_status(["lo"])
    render(report, Console(file=buf, width=250, color_system=None))
    out = buf.getvalue()
    assert "lo* " in out and report.nodes[0].ip in out and "(head)" in out
    assert "no GPU (" in out and "pod0" in out
    assert ("yes" if os.geteuid() == 0 else "no (uid") in out


@needs_root
def test_node_report_sees_the_project_shaping_without_touching_it(shaped_netns):
    from testbed.faults import shaping
    from testbed.machine.netns import in_netns
    from testbed.cluster.nodes import node_report

    with in_netns(shaped_netns):
        r = node_report()
        assert shaping.installed("eth0") == {"egress": 10e6, "ingress": 20e6}, "reading changed nothing"
    by_name = {i.name: i for i in r.interfaces}
    assert set(by_name) == {"lo", "eth0", "eth0p", shaping.ifb_name("eth0")}, "the namespace's own interfaces"
    assert by_name["eth0"].project_shaping == ("egress", "ingress") and by_name["eth0"].kind == "veth"
    assert by_name["eth0p"].project_shaping == () and by_name["lo"].project_shaping == ()
    assert by_name["eth0"].speed_mbps is None, "sysfs describes another namespace: no speed from it"


class _FakeNvml:
    """Just what node_report reads from pynvml: two GPUs, the second one's clocks unreadable."""

    NVML_CLOCK_SM = 1

    class NVMLError(Exception):
        pass

    def __init__(self) -> None:
        self.inits = 0
        self.uuids = ["GPU-11111111-2222-3333-4444-555555555555", "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"]

    def nvmlInit(self) -> None:
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.inits -= 1

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUUID(self, h: int) -> bytes:
        return self.uuids[h].encode()

    def nvmlDeviceGetName(self, h: int) -> str:
        return "NVIDIA H200"

    def nvmlDeviceGetClockInfo(self, h: int, clock: int) -> int:
        if h == 1:
            raise self.NVMLError("Not Supported")
        return 990

    def nvmlDeviceGetMaxClockInfo(self, h: int, clock: int) -> int:
        if h == 1:
            raise self.NVMLError("Not Supported")
        return 1980


def test_node_report_lists_the_gpus_nvml_sees_and_which_the_project_locked(monkeypatch, tmp_path):
    import sys

    from testbed.faults import gpu
    from testbed.cluster.nodes import Gpu, node_report

    nvml = _FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setattr(gpu, "lock_dir", lambda: tmp_path)
    (tmp_path / nvml.uuids[1]).write_text("key pid 1\n")  # the marker a lock leaves
    r = node_report()
    assert r.gpu_missing is None and nvml.inits == 0, "every NVML init is paired with a shutdown"
    assert r.gpus == (Gpu(0, "NVIDIA H200", nvml.uuids[0], 990, 1980, False),
                      Gpu(1, "NVIDIA H200", nvml.uuids[1], None, None, True))

    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed
    r = node_report()
    assert r.gpus == () and r.gpu_missing.startswith("pynvml not importable")


# --------------------------------------------------------------------------- run_on_every_node


# Ray imports a module-level function on the node by its module's name, and this test module
# is not importable there: the functions the tests run are made here, so they go by value.
def _make(kind: str):
    if kind == "raises":
        def raises() -> None:
            raise ValueError("disk\n  on fire")
        return raises
    if kind == "sleeps":
        def sleeps(s: float) -> str:
            import time

            time.sleep(s)
            return "woke"
        return sleeps

    def pid() -> int:
        import os

        return os.getpid()
    return pid


def test_a_failing_task_is_that_nodes_one_line_error(ray_local):
    from testbed.cluster.nodes import run_on_every_node

    (r,) = run_on_every_node(_make("raises"), timeout_s=30)
    assert (r.node_id, r.ok, r.value) == (ray_local, False, None)
    assert r.error == "ValueError: disk on fire"


def test_a_node_that_fails_or_does_not_answer_is_reported_while_the_others_finish(ray_local, monkeypatch):
    import ray

    from testbed.cluster.nodes import cluster_status, run_on_every_node

    real = ray.nodes()
    gone = {"NodeID": "ab" * 28, "Alive": True, "NodeManagerAddress": "192.0.2.99",
            "Resources": {"CPU": 4.0, "pod1": 1.0}}  # listed alive, gone before its task is placed
    monkeypatch.setattr(ray, "nodes", lambda: real + [gone])
    results = run_on_every_node(_make("pid"), timeout_s=30)
    assert [r.node_id for r in results] == [ray_local, gone["NodeID"]]
    ok, bad = results
    assert ok.ok and isinstance(ok.value, int) and ok.value != os.getpid()
    assert not bad.ok and bad.ip == "192.0.2.99" and "\n" not in bad.error and "schedulable" in bad.error

    report = cluster_status(["lo"], timeout_s=30)
    assert [n.node_id for n in report.nodes] == [ray_local, gone["NodeID"]]
    assert report.nodes[0].report is not None and report.nodes[1].report is None and report.nodes[1].error
    assert report.pods == ("pod0", "pod1")
    assert [(p.pod, p.allowlisted) for p in report.placements] == [("pod0", ("lo",)), ("pod1", None)]
    assert any(line.startswith("node 192.0.2.99") for line in report.problems)

    monkeypatch.setattr(ray, "nodes", lambda: real)
    t0 = time.monotonic()
    (late,) = run_on_every_node(_make("sleeps"), 60, timeout_s=1)
    assert time.monotonic() - t0 < 10
    assert not late.ok and late.error == "no answer within 1 s"


def test_run_on_every_node_needs_a_connection(monkeypatch):
    import ray

    from testbed.cluster.nodes import clear_cluster_faults, cluster_status, run_on_every_node

    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # as in a process that never connected
    for call in (lambda: run_on_every_node(_make("pid")), lambda: cluster_status(["eth0"]), clear_cluster_faults):
        with pytest.raises(RuntimeError, match="not initialised"):
            call()


# --------------------------------------------------------------------------- clear_cluster_faults


@needs_root
def test_clear_cluster_faults_removes_a_left_shaping_and_is_idempotent(ray_local, shaped_netns):
    from testbed.faults import shaping
    from testbed.machine.netns import in_netns
    from testbed.cluster.nodes import clear_cluster_faults

    first = _this_node(clear_cluster_faults(timeout_s=60), ray_local)
    assert first.ok, first.error
    assert {f"{shaped_netns}:eth0/egress", f"{shaped_netns}:eth0/ingress"} <= set(first.value)
    with in_netns(shaped_netns):
        assert shaping.installed("eth0") == {} and not shaping.has_link(shaping.ifb_name("eth0"))
    second = _this_node(clear_cluster_faults(timeout_s=60), ray_local)
    assert second.ok, second.error
    # Other sessions on this machine may set faults of their own meanwhile: judge by this namespace.
    assert [x for x in second.value if x.startswith(shaped_netns)] == []


@needs_root
def test_concurrent_clears_on_one_host_never_race(ray_local, shaped_netns):
    """An emulated cluster's nodes are namespaces of one host: several clears at once, each
    sweeping every namespace, all succeed and exactly one of them removes the shaping."""
    from testbed.cluster.nodes import _run_on

    def clear_at(t: float) -> list[str]:  # all start together: the sweeps overlap
        import time

        from testbed.faults.agent_actor import clear_host_faults
        from testbed.faults import cpu  # noqa: F401 (imported before the start)
        from testbed.faults import gpu  # noqa: F401 (imported before the start)
        from testbed.faults import shaping  # noqa: F401 (imported before the start)

        time.sleep(max(0.0, t - time.time()))
        return clear_host_faults()

    n = 4
    _run_on([(ray_local, "local")] * n, _make("sleeps"), (0.3,), 60)  # n idle workers ready
    results = _run_on([(ray_local, "local")] * n, clear_at, (time.time() + 1.5,), 60)
    assert all(r.ok for r in results), [r.error for r in results]
    removed = [x for r in results for x in r.value if x.startswith(shaped_netns)]
    assert sorted(removed) == [f"{shaped_netns}:eth0/egress", f"{shaped_netns}:eth0/ingress"]


@needs_root
def test_a_node_clear_waits_for_the_host_lock(ray_local, shaped_netns):
    """The lock is host-wide, across processes: while this process holds it a node's clear
    does not run (reported as no answer, the shaping still there); once released it does."""
    from testbed.faults import agent_actor as fault_agents
    from testbed.faults import shaping
    from testbed.machine.netns import in_netns
    from testbed.cluster.nodes import clear_cluster_faults

    with fault_agents._host_lock():
        blocked = _this_node(clear_cluster_faults(timeout_s=2), ray_local)
        assert not blocked.ok and blocked.error == "no answer within 2 s"
        with in_netns(shaped_netns):
            assert shaping.installed("eth0") == {"egress": 10e6, "ingress": 20e6}
    # The blocked task was only asked to stop: waiting in flock, it may still run once the lock
    # is free, and then it is the one that clears. Either way the shaping goes once released.
    done = _this_node(clear_cluster_faults(timeout_s=60), ray_local)
    assert done.ok, done.error
    with in_netns(shaped_netns):
        assert shaping.installed("eth0") == {}


# --------------------------------------------------------------------------- an emulated cluster (slow)

_DRIVER = """
import dataclasses, json
import ray
from testbed.cluster.nodes import clear_cluster_faults, cluster_status
ray.init(logging_level="ERROR", log_to_driver=False)
status = cluster_status(["eth0"]).to_dict()
first = [dataclasses.asdict(r) for r in clear_cluster_faults()]
after = cluster_status(["eth0"]).to_dict()
second = [dataclasses.asdict(r) for r in clear_cluster_faults()]
print(json.dumps({"status": status, "first": first, "after": after, "second": second}))
"""


@pytest.mark.slow
@needs_root
def test_on_an_emulated_cluster_every_node_reports_its_namespace_and_clears(tmp_path):
    """Three Ray nodes, each in its own namespace: one task per node sees that node's eth0
    (its address, the project's shaping on pod0), and the clears from all three at once remove
    pod0's shaping once, without an error, and then nothing."""
    import json
    import sys

    from testbed.cluster.emulated import EmulatedCluster
    from testbed.faults import shaping
    from testbed.machine.netns import in_netns

    cluster = EmulatedCluster(2, tmp_path / "state", tmp_path / "run", run_id=uuid.uuid4().hex[:10],
                              mode="netns", launcher="direct")
    try:
        cluster.up()
        pod0 = cluster.fabric.node("pod0").netns
        with in_netns(pod0):
            shaping.shape(shaping.Shaping("eth0", "egress", 10e6))
        r = cluster.run_in_head([sys.executable, "-c", _DRIVER], capture_output=True, text=True, timeout=240)
        assert r.returncode == 0, r.stderr[-3000:]
        out = json.loads(r.stdout.strip().splitlines()[-1])
        with in_netns(pod0):
            assert shaping.installed("eth0") == {}
    finally:
        cluster.down()

    nodes = out["status"]["nodes"]
    assert [(n["pods"], n["head"], n["error"]) for n in nodes] == [([], True, None), (["pod0"], False, None),
                                                                    (["pod1"], False, None)]
    for n, name in zip(nodes, ("head", "pod0", "pod1")):
        assert n["ip"] == cluster.node_ips[name] == n["report"]["ip"]
        eth0 = next(i for i in n["report"]["interfaces"] if i["name"] == "eth0")
        assert f"{cluster.node_ips[name]}/24" in eth0["addresses"] and eth0["kind"] == "veth"
        assert eth0["operstate"] == "up" and eth0["speed_mbps"] == 10000, "sysfs of the node's own namespace"
        assert eth0["project_shaping"] == (["egress"] if name == "pod0" else [])
        assert {i["name"] for i in n["report"]["interfaces"]} == {"lo", "eth0"}
    assert out["status"]["pods"] == ["pod0", "pod1"] and out["status"]["problems"] == []
    assert [(p["pod"], p["allowlisted"]) for p in out["status"]["placements"]] == [("pod0", ["eth0"]),
                                                                                  ("pod1", ["eth0"])]
    assert all(r["ok"] for r in out["first"] + out["second"]), out
    removed = [x for r in out["first"] for x in r["value"] if "eth0/" in x]
    assert removed.count("host:eth0/egress") + removed.count(f"{pod0}:eth0/egress") == 1, removed
    assert all(i["project_shaping"] == [] for n in out["after"]["nodes"] for i in n["report"]["interfaces"])
    assert [x for r in out["second"] for x in r["value"] if x.startswith(("host:", cluster.fabric.core_netns[:-4]))] == []


def test_clear_host_faults_sweeps_again_when_something_vanishes_under_it(monkeypatch):
    """An agent clearing its own fault meanwhile makes netlink fail mid-sweep: the sweep runs
    again and what is left is removed; a failure that persists is raised."""
    from pyroute2.netlink.exceptions import NetlinkError

    from testbed.faults import agent_actor as fault_agents
    from testbed.machine import netns
    from testbed.faults import cpu
    from testbed.faults import gpu
    from testbed.faults import shaping

    calls = []

    def clear_all(allowlist=None):
        calls.append(1)
        if len(calls) == 1:
            raise NetlinkError(19, "No such device")  # the ifb went away between listing and deleting
        return ["eth0/ingress"]

    monkeypatch.setattr(shaping, "clear_all", clear_all)
    monkeypatch.setattr(netns, "list_namespaces", lambda: [])
    monkeypatch.setattr(cpu, "clear_project_cgroups", lambda only_empty=False: [])
    monkeypatch.setattr(gpu, "reset_project_gpu_locks", lambda: [])
    assert fault_agents.clear_host_faults() == ["host:eth0/ingress"] and len(calls) == 2

    def always(allowlist=None):
        raise NetlinkError(1, "Operation not permitted")

    monkeypatch.setattr(shaping, "clear_all", always)
    with pytest.raises(NetlinkError):
        fault_agents.clear_host_faults()
