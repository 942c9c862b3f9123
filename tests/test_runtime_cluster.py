"""The emulated cluster: namespaces, veth links through a bridge, Ray nodes in them.

Namespace tests need root (CAP_SYS_ADMIN + CAP_NET_ADMIN) and skip without
it; the Ray tests also need Ray. Every namespace and process a test makes is
removed in a ``finally``, pass or fail.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest
from pyroute2 import IPRoute
from pyroute2 import netns as pr_netns

from testbed.machine.netns import (
    Fabric,
    NetnsError,
    create_fabric,
    create_namespace,
    destroy_fabric,
    destroy_fabric_from_state,
    in_netns,
    link_counters,
    list_namespaces,
    missing_privileges,
    netns_exec_argv,
    netns_path,
    run_prefix,
    state_file,
)

ROOT = Path(__file__).resolve().parents[1]
needs_root = pytest.mark.skipif(missing_privileges() is not None,
                                reason=f"needs root for network namespaces: {missing_privileges()}")
needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="Ray is not installed")


def _run_id() -> str:
    return uuid.uuid4().hex[:10]


def _link_names() -> set[str]:
    with IPRoute() as ipr:
        return {link.get("ifname") for link in ipr.get_links()}


def _links_in_ns_fd(fd: int) -> set[str]:
    """Interfaces of the namespace behind an open fd (it may have no name any more)."""
    saved = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        pr_netns.setns(fd)
        try:
            return _link_names()
        finally:
            pr_netns.setns(saved)
    finally:
        os.close(saved)


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.fixture
def fabric(tmp_path):
    fab = Fabric.plan(_run_id(), 2)
    try:
        create_fabric(fab, state_file(tmp_path, fab.run_id))
        yield fab
    finally:
        destroy_fabric(fab)
        assert list_namespaces(run_prefix(fab.run_id)) == []


# ---------------------------------------------------------------- pure parts

def test_plan_gives_each_node_its_namespace_and_a_distinct_address():
    fab = Fabric.plan("abc", 3, "10.99.5.0/24")
    assert [n.name for n in fab.nodes] == ["head", "pod0", "pod1", "pod2"]
    assert [n.netns for n in fab.nodes] == ["tb-abc-head", "tb-abc-pod0", "tb-abc-pod1", "tb-abc-pod2"]
    assert len({n.address for n in fab.nodes}) == 4
    assert all(n.address.startswith("10.99.5.") and n.address != "10.99.5.0" for n in fab.nodes)
    assert fab.namespaces[-1] == fab.core_netns == "tb-abc-core"
    assert len({n.core_ifname for n in fab.nodes}) == 4 and all(len(n.core_ifname) <= 15 for n in fab.nodes)
    assert Fabric.from_dict(json.loads(json.dumps(fab.to_dict()))) == fab


@pytest.mark.parametrize("kwargs, message", [
    ({"run_id": "Bad-Id", "n_pods": 2}, "run_id"),
    ({"run_id": "ok", "n_pods": 0}, "n_pods"),
    ({"run_id": "ok", "n_pods": 2, "subnet": "10.77.0.1/24"}, "subnet"),
    ({"run_id": "ok", "n_pods": 5, "subnet": "10.77.0.0/30"}, "too small"),
])
def test_plan_rejects_bad_input_in_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message) as err:
        Fabric.plan(**kwargs)
    assert "\n" not in str(err.value)


def test_missing_privileges_reads_effective_capabilities():
    full = "Name:\tx\nCapEff:\t000001ffffffffff\n"
    no_net_admin = f"CapEff:\t{((1 << 41) - 1) & ~(1 << 12):016x}\n"
    assert missing_privileges(full) is None
    reason = missing_privileges(no_net_admin)
    assert "CAP_NET_ADMIN" in reason and "CAP_SYS_ADMIN" not in reason and "\n" not in reason
    assert "CAP_SYS_ADMIN" in missing_privileges("CapEff:\t0000000000000000\n")


# A child that drops every capability (root or not), then tries the real thing.
_DROP_CAPS = """
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
class Hdr(ctypes.Structure): _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
class Data(ctypes.Structure): _fields_ = [("eff", ctypes.c_uint32), ("prm", ctypes.c_uint32), ("inh", ctypes.c_uint32)]
assert libc.capset(ctypes.byref(Hdr(0x20080522, 0)), (Data * 2)()) == 0
"""


def test_without_capabilities_namespaces_fail_with_one_line_and_auto_mode_goes_local(tmp_path):
    script = _DROP_CAPS + textwrap.dedent(f"""
        import logging
        from testbed.machine.netns import Fabric, NetnsPermissionError, create_fabric
        from testbed.cluster.emulated import EmulatedCluster
        logging.basicConfig(format="%(message)s")
        try:
            create_fabric(Fabric.plan("nocaps", 1), None)
            print("CREATED")
        except NetnsPermissionError as e:
            print("ERROR", e)
        print("MODE", EmulatedCluster(2, {str(tmp_path)!r}, mode="auto").mode)
        try:
            EmulatedCluster(2, {str(tmp_path)!r}, mode="netns")
        except NetnsPermissionError:
            print("NETNS REFUSED")
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("ERROR network namespaces need root") and "CREATED" not in r.stdout
    assert "MODE local" in lines and "NETNS REFUSED" in lines
    warnings = [l for l in r.stderr.splitlines() if "local mode" in l]
    assert len(warnings) == 1 and "need root" in warnings[0]
    assert list_namespaces(run_prefix("nocaps")) == []


# ---------------------------------------------------------------- namespaces (root)

_SERVER = """
import os, socket, sys
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("0.0.0.0", 7001))
srv.listen(1)
print(" ".join(sorted(os.listdir("/sys/class/net"))), flush=True)
conn, peer = srv.accept()
total = 0
while chunk := conn.recv(1 << 16):
    total += len(chunk)
conn.sendall(f"{peer[0]} {total}".encode())
conn.close()
"""


@needs_root
def test_pods_talk_through_the_bridge_and_counters_see_the_bytes(fabric):
    pod0, pod1, head = fabric.node("pod0"), fabric.node("pod1"), fabric.head
    before = {name: link_counters(n.netns, n.ifname) for name, n in (("pod0", pod0), ("pod1", pod1), ("head", head))}
    core_before = link_counters(fabric.core_netns, pod0.core_ifname)
    server = subprocess.Popen(netns_exec_argv(pod0.netns, [sys.executable, "-c", _SERVER]),
                              stdout=subprocess.PIPE, text=True)
    try:
        # The exec shim gives the server the namespace's own /sys: only its devices.
        assert server.stdout.readline().split() == ["eth0", "lo"]
        payload = 2_000_000
        with in_netns(pod1.netns):  # this socket is born in pod1's namespace
            client = socket.create_connection((pod0.address, 7001), timeout=10)
        with client:
            client.sendall(b"x" * payload)
            client.shutdown(socket.SHUT_WR)
            reply = client.recv(100).decode().split()
        assert reply == [pod1.address, str(payload)]  # the server saw pod1's address: routed via the bridge
        assert server.wait(timeout=10) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    after = {name: link_counters(n.netns, n.ifname) for name, n in (("pod0", pod0), ("pod1", pod1), ("head", head))}
    assert after["pod1"].tx_bytes - before["pod1"].tx_bytes >= payload
    assert after["pod0"].rx_bytes - before["pod0"].rx_bytes >= payload
    assert link_counters(fabric.core_netns, pod0.core_ifname).tx_bytes - core_before.tx_bytes >= payload
    # The bridge learnt where pod0 is: the head's link saw (almost) none of it.
    assert after["head"].rx_bytes - before["head"].rx_bytes < payload // 20


@needs_root
def test_nodes_reach_only_their_subnet(fabric):
    with in_netns(fabric.node("pod0").netns):
        sock = socket.socket()
        try:
            with pytest.raises(OSError) as err:
                sock.connect(("192.0.2.1", 80))  # no default route in a node's namespace
        finally:
            sock.close()
    assert err.value.errno == 101  # ENETUNREACH
    with IPRoute() as ipr:  # the host holds none of the run's addresses
        host_addrs = {a.get("IFA_ADDRESS") for a in ipr.get_addr()}
    assert not host_addrs & {n.address for n in fabric.nodes}


@needs_root
def test_in_netns_switches_only_the_calling_thread(fabric):
    host_links = _link_names()
    inside, entered, release = {}, threading.Event(), threading.Event()

    def worker():
        with in_netns(fabric.node("pod1").netns):
            inside["links"] = _link_names()
            entered.set()
            release.wait(10)
        inside["back"] = _link_names()

    t = threading.Thread(target=worker)
    t.start()
    try:
        assert entered.wait(10)
        assert _link_names() == host_links  # the main thread stayed on the host
    finally:
        release.set()
        t.join(10)
    assert inside["links"] == {"lo", "eth0"}
    assert inside["back"] == host_links


@needs_root
def test_teardown_removes_veths_and_namespaces_and_is_idempotent(tmp_path):
    fab = Fabric.plan(_run_id(), 2)
    fds = []
    try:
        create_fabric(fab, state_file(tmp_path, fab.run_id))
        # Hold the namespaces open so their interfaces can be inspected after their names are gone.
        fds = [os.open(netns_path(n), os.O_RDONLY) for n in (fab.core_netns, fab.node("pod0").netns)]
        assert _links_in_ns_fd(fds[0]) == {"lo", fab.bridge} | {n.core_ifname for n in fab.nodes}
        assert sorted(destroy_fabric(fab)) == sorted(fab.namespaces)
        assert list_namespaces(run_prefix(fab.run_id)) == []
        assert _links_in_ns_fd(fds[0]) == {"lo"}  # bridge and every veth deleted, not left to the kernel
        assert _links_in_ns_fd(fds[1]) == {"lo"}  # the peer went with its core end
        assert destroy_fabric(fab) == []
    finally:
        for fd in fds:
            os.close(fd)
        destroy_fabric(fab)


@needs_root
def test_create_refuses_a_namespace_that_exists_and_leaves_it_alone(fabric):
    with pytest.raises(NetnsError, match=fabric.head.netns):
        create_fabric(fabric)
    assert set(list_namespaces(run_prefix(fabric.run_id))) == set(fabric.namespaces)
    assert link_counters(fabric.head.netns, "eth0").rx_bytes >= 0  # still wired


@needs_root
def test_destroy_by_run_id_finds_namespaces_the_layout_never_recorded():
    run_id = _run_id()
    try:
        create_namespace(run_prefix(run_id) + "pod7")  # as if a crash came before the state was written
        netns_path(run_prefix(run_id) + "core").touch()  # ... or between a name's file and its mount
        assert destroy_fabric(run_id=run_id) == [run_prefix(run_id) + "pod7", run_prefix(run_id) + "core"]
    finally:
        destroy_fabric(run_id=run_id)
    assert list_namespaces(run_prefix(run_id)) == []


@needs_root
def test_a_crashed_creator_is_cleaned_from_its_state_file(tmp_path):
    run_id = _run_id()
    state = state_file(tmp_path, run_id)
    script = textwrap.dedent(f"""
        import subprocess, sys, time
        from testbed.machine.netns import Fabric, create_fabric, netns_exec_argv, processes_in_namespaces
        fab = Fabric.plan({run_id!r}, 2)
        create_fabric(fab, {str(state)!r})
        sleeper = subprocess.Popen(netns_exec_argv(fab.node("pod0").netns, ["sleep", "300"]), start_new_session=True)
        while sleeper.pid not in processes_in_namespaces([fab.node("pod0").netns]):
            time.sleep(0.01)  # until the exec shim has entered pod0
        print(sleeper.pid, flush=True)
        time.sleep(300)
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    sleeper = None
    try:
        sleeper = int(child.stdout.readline())
        child.send_signal(signal.SIGKILL)  # the crash: no cleanup code runs
        child.wait(10)
        assert len(list_namespaces(run_prefix(run_id))) == 4 and not _gone(sleeper)
        removed = destroy_fabric_from_state(state)
        assert len(removed) == 4
        deadline = time.monotonic() + 5
        while not _gone(sleeper) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _gone(sleeper)  # the process left inside pod0 was killed before its namespace went
        assert list_namespaces(run_prefix(run_id)) == []
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if sleeper is not None and not _gone(sleeper):
            os.kill(sleeper, signal.SIGKILL)
        destroy_fabric(run_id=run_id)


# ---------------------------------------------------------------- Ray (slow)

_DRIVER = """
import json, socket, sys
import ray
ray.init(logging_level="ERROR", log_to_driver=False)

@ray.remote(num_cpus=0)
def where(head_ip):
    # The source address the kernel picks towards the head tells which namespace the task ran in.
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect((head_ip, 9))
    return {"ray_ip": ray.util.get_node_ip_address(), "src_ip": s.getsockname()[0]}

pods = sys.argv[2:]
print(json.dumps(dict(zip(pods, ray.get([where.options(resources={p: 1}).remote(sys.argv[1]) for p in pods])))))
"""


def _ray_processes_of(temp_root: Path) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
                comm = Path(f"/proc/{entry}/comm").read_text().strip()
            except OSError:
                continue
            if comm in ("raylet", "gcs_server") and str(temp_root).encode() in cmd:
                found.append(int(entry))
    return found


@pytest.mark.slow
@needs_ray
@needs_root
def test_emulated_cluster_places_a_task_on_each_pod(tmp_path, monkeypatch):
    from testbed.cluster.emulated import EmulatedCluster

    # A token left by an earlier local ray.init() (Ray 2.60 writes ~/.ray/auth_token) turns
    # token auth on for a head; the cluster's own token must keep its pods joining.
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text("f" * 64)
    monkeypatch.setenv("HOME", str(home))
    cluster = EmulatedCluster(2, tmp_path / "state", tmp_path / "run", run_id=_run_id(), mode="netns")
    try:
        info = cluster.up()
        status = cluster.status()
        assert status.up and len(status.pids) > 3
        assert {n.name: n.address for n in info.nodes} == cluster.node_ips
        pod0_tx = link_counters(cluster.fabric.node("pod0").netns, "eth0").tx_bytes
        r = cluster.run_in_head([sys.executable, "-c", _DRIVER, cluster.head_ip, "pod0", "pod1"],
                                capture_output=True, text=True, timeout=180)
        assert r.returncode == 0, r.stderr[-2000:]
        placed = json.loads(r.stdout.strip().splitlines()[-1])
        for pod in ("pod0", "pod1"):
            assert placed[pod] == {"ray_ip": cluster.node_ips[pod], "src_ip": cluster.node_ips[pod]}
        assert link_counters(cluster.fabric.node("pod0").netns, "eth0").tx_bytes > pod0_tx  # Ray's traffic crossed the veth
    finally:
        cluster.down()
    assert cluster.status().empty
    assert _ray_processes_of(cluster.temp_root) == []
    assert list_namespaces(run_prefix(cluster.run_id)) == []
    assert not cluster.state_path.exists() and not cluster.temp_root.exists()


@needs_ray
@needs_root
def test_a_second_ray_up_cluster_is_refused_in_one_line_while_another_holds_the_bootstrap_config(tmp_path,
                                                                                            monkeypatch):
    """`ray up` leaves its cluster's config in root's home, and the head's autoscaler reads it again
    and again: a second `ray up` that replaced it terminated the first cluster's nodes. So while the
    owner's namespaces exist a second `ray up` cluster is refused before it creates anything, and
    the owner's file stays; a crashed run's file (no namespace of its run) is no owner."""
    from testbed.cluster import rayup
    from testbed.cluster.emulated import EmulatedCluster
    from testbed.cluster.raynodes import ClusterError

    other, home = _run_id(), tmp_path / "home"
    home.mkdir()
    config = home / rayup.BOOTSTRAP_FILES[0]
    config.write_text(json.dumps({"cluster_name": f"tb-{other}"}))
    monkeypatch.setattr(rayup, "ssh_home", lambda: home)
    assert rayup.bootstrap_owner() is None  # no namespace of that run: a leftover, not in the way
    cluster = EmulatedCluster(1, tmp_path / "state", tmp_path / "run", run_id=_run_id(), mode="netns")
    try:
        create_namespace(run_prefix(other) + "head")
        assert rayup.bootstrap_owner() == other
        with pytest.raises(ClusterError, match=f"emulated cluster {other} is up through ray up") as refused:
            cluster.up()
        assert "\n" not in str(refused.value) and f"testbed cluster down {other}" in str(refused.value)
        assert not cluster.state_path.exists() and list_namespaces(run_prefix(cluster.run_id)) == []
        assert json.loads(config.read_text()) == {"cluster_name": f"tb-{other}"}
    finally:
        monkeypatch.undo()  # where it was not refused, its down removes what its ray up left in root's home
        cluster.down()
        destroy_fabric(run_id=other)
    assert list_namespaces(run_prefix(other)) == []


@pytest.mark.slow
@needs_ray
def test_local_mode_runs_every_pod_on_one_node(tmp_path):
    from testbed.cluster.emulated import EmulatedCluster

    cluster = EmulatedCluster(2, tmp_path / "state", run_id=_run_id(), mode="local")
    try:
        info = cluster.up()
        assert len(info.nodes) == 1
        resources = dict(info.nodes[0].resources)
        assert resources["pod0"] == resources["pod1"] == 1.0 and resources["CPU"] == 3.0
        r = cluster.run_in_head([sys.executable, "-c", _DRIVER, "127.0.0.1", "pod0", "pod1"],
                                capture_output=True, text=True, timeout=180)
        assert r.returncode == 0, r.stderr[-2000:]
        placed = json.loads(r.stdout.strip().splitlines()[-1])
        assert placed["pod0"]["ray_ip"] == placed["pod1"]["ray_ip"] == info.nodes[0].address
    finally:
        cluster.down()
    assert cluster.status().empty and _ray_processes_of(cluster.temp_root) == []


@pytest.mark.slow
@needs_ray
@needs_root
def test_a_crashed_run_is_downed_from_its_state_file(tmp_path):
    from testbed.cluster.emulated import EmulatedCluster, down_all

    run_id, state_dir = _run_id(), tmp_path / "state"
    script = textwrap.dedent(f"""
        import os
        from testbed.cluster.emulated import EmulatedCluster
        EmulatedCluster(1, {str(state_dir)!r}, run_id={run_id!r}, mode="netns").up()
        print("UP", flush=True)
        os.kill(os.getpid(), 9)  # crash: no down
    """)
    try:
        r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=180)
        assert "UP" in r.stdout, r.stderr[-2000:]
        orphan = EmulatedCluster.attach(state_dir, run_id)
        assert orphan.status().up  # the nodes outlived their creator
        assert down_all(state_dir) == [run_id]
        assert orphan.status().empty
        assert list_namespaces(run_prefix(run_id)) == [] and _ray_processes_of(orphan.temp_root) == []
    finally:
        if (state_dir / f"{run_id}.json").exists():
            EmulatedCluster.attach(state_dir, run_id).down()
        destroy_fabric(run_id=run_id)
