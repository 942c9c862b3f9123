"""The GPU compute fault (testbed.faults.gpu) against a recording stub of pynvml.

The stub simulates a host with two GPUs whose physical order differs from the
engine's view (index 0 is GPU A, the engine's GPU is B): a throttle that addressed
GPUs by index would lock the wrong one. Like hardware, its clock state lives in a
file, so a lock outlives the process that set it; every call is logged with its
arguments. The last test does the real thing where a GPU is lent.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
import threading
import types
from pathlib import Path
from typing import Any

import pytest

from testbed.faults import gpu
from testbed.faults import compute_common
from testbed.faults.agent import FaultAgent
from testbed.faults.compute import make_throttle
from testbed.faults.gpu import GpuClockThrottle, locked_uuids, reset_project_gpu_locks
from testbed.machine.gpu import GpuLookupError, gpu_available, nvml_uuid, visible_gpu_uuid
from testbed.faults.compute_common import ComputeFaultError, registered

REPO = Path(__file__).resolve().parents[1]
GPU_A = "GPU-aaaaaaaa-1111-2222-3333-444444444444"  # physical index 0
GPU_B = "GPU-bbbbbbbb-5555-6666-7777-888888888888"  # the engine's GPU
NIC = "pytest-nic0"  # an allowlist naming no real interface: the agent's clear_all shapes nothing

STUB = '''
"""Recording pynvml stand-in: two GPUs, clocks in a JSON file (they outlive processes)."""
import json, os

NVML_CLOCK_SM = 1
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
GPUS = [%r, %r]  # physical order
MAX_MHZ = 1980
fail = {}  # name or (name, uuid) -> the NVML error code those calls raise
_inits = 0


class NVMLError(Exception):
    _text = {1: "Uninitialized", 3: "Not Supported", 4: "Insufficient Permissions", 6: "Not Found"}

    def __init__(self, value):
        super().__init__(value)
        self.value = value

    def __str__(self):
        return self._text.get(self.value, "NVML error %%d" %% self.value)


class Handle:
    def __init__(self, uuid):
        self.uuid = uuid


def _call(name, *args):
    args = [a.uuid if isinstance(a, Handle) else a for a in args]
    code = fail.get(name, fail.get((name, args[0] if args else None)))
    if code is None and name not in ("nvmlInit", "nvmlShutdown") and _inits <= 0:
        code = NVML_ERROR_UNINITIALIZED
    with open(os.environ["STUB_NVML_LOG"], "a") as f:
        f.write(json.dumps([name, args, code]) + "\\n")
    if code is not None:
        raise NVMLError(code)


def _clocks():
    try:
        with open(os.environ["STUB_NVML_STATE"]) as f:
            return json.load(f)
    except FileNotFoundError:
        return {u: None for u in GPUS}


def _set(uuid, mhz):
    clocks = _clocks()
    clocks[uuid] = mhz
    with open(os.environ["STUB_NVML_STATE"], "w") as f:
        json.dump(clocks, f)


def nvmlInit():
    global _inits
    _call("nvmlInit")
    _inits += 1


def nvmlShutdown():
    global _inits
    _call("nvmlShutdown")
    _inits -= 1


def nvmlDeviceGetCount():
    _call("nvmlDeviceGetCount")
    return len(GPUS)


def nvmlDeviceGetHandleByIndex(index):
    _call("nvmlDeviceGetHandleByIndex", index)
    return Handle(GPUS[index])


def nvmlDeviceGetHandleByUUID(uuid):
    uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
    _call("nvmlDeviceGetHandleByUUID", uuid)
    if uuid not in GPUS:
        raise NVMLError(NVML_ERROR_NOT_FOUND)
    return Handle(uuid)


def nvmlDeviceGetUUID(handle):
    _call("nvmlDeviceGetUUID", handle)
    return handle.uuid


def nvmlDeviceGetMaxClockInfo(handle, kind):
    _call("nvmlDeviceGetMaxClockInfo", handle, kind)
    return MAX_MHZ


def nvmlDeviceGetClockInfo(handle, kind):
    _call("nvmlDeviceGetClockInfo", handle, kind)
    return _clocks()[handle.uuid] or MAX_MHZ


def nvmlDeviceSetGpuLockedClocks(handle, low, high):
    _call("nvmlDeviceSetGpuLockedClocks", handle, low, high)
    _set(handle.uuid, high)


def nvmlDeviceResetGpuLockedClocks(handle):
    _call("nvmlDeviceResetGpuLockedClocks", handle)
    _set(handle.uuid, None)
''' % (GPU_A, GPU_B)


class Stub:
    """The stub module and what it recorded."""

    def __init__(self, module: types.ModuleType, root: Path) -> None:
        self.module, self.root = module, root

    @property
    def fail(self) -> dict[Any, int]:
        return self.module.fail

    def calls(self, name: str | None = None) -> list[tuple[str, list[Any], int | None]]:
        """(function, arguments with handles as their UUIDs, the NVML error it raised or None)."""
        log = self.root / "calls.jsonl"
        rows = [tuple(json.loads(line)) for line in log.read_text().splitlines()] if log.exists() else []
        return [r for r in rows if name is None or r[0] == name]

    def locked(self) -> dict[str, int]:
        """GPU -> locked SM clock (MHz), read from the simulated hardware."""
        state = self.root / "clocks.json"
        clocks = json.loads(state.read_text()) if state.exists() else {}
        return {u: mhz for u, mhz in clocks.items() if mhz is not None}

    def unreset(self) -> set[str]:
        """GPUs whose last successful clock call in the log is a set: a lock nobody reset."""
        last: dict[str, str] = {}
        for name, args, error in self.calls():
            if error is None and name in ("nvmlDeviceSetGpuLockedClocks", "nvmlDeviceResetGpuLockedClocks"):
                last[args[0]] = name
        return {u for u, name in last.items() if name == "nvmlDeviceSetGpuLockedClocks"}

    def markers(self) -> list[str]:
        return locked_uuids()


@pytest.fixture
def nvml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    stub_dir = tmp_path / "stub"
    stub_dir.mkdir()
    (stub_dir / "pynvml.py").write_text(STUB)
    monkeypatch.setenv("STUB_NVML_LOG", str(tmp_path / "calls.jsonl"))
    monkeypatch.setenv("STUB_NVML_STATE", str(tmp_path / "clocks.json"))
    monkeypatch.setenv("PYTEST_GPU_LOCKS", str(tmp_path / "locks"))
    spec = importlib.util.spec_from_file_location("pynvml", stub_dir / "pynvml.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    monkeypatch.setattr(gpu, "lock_dir", lambda: tmp_path / "locks")
    monkeypatch.setattr(GpuClockThrottle, "SETTLE_S", 0.0)
    monkeypatch.setattr(os, "geteuid", lambda: 0)  # root unless a test says otherwise
    yield Stub(module, tmp_path)
    for t in registered():  # a failing test must not leave the exit hook a stub-bound throttle
        if isinstance(t, GpuClockThrottle):
            compute_common.unregister(t)


def _gpu_throttles() -> list[GpuClockThrottle]:
    return [t for t in registered() if isinstance(t, GpuClockThrottle)]


def _one_line(err: pytest.ExceptionInfo[BaseException]) -> str:
    text = str(err.value)
    assert text and "\n" not in text
    return text


# --------------------------------------------------------------------------- UUIDs


class _CUuuid:
    """What torch's ``get_device_properties(i).uuid`` is: 16 bytes (a list of ints) and a
    prefix-less 8-4-4-4-12 string."""

    def __init__(self, nvml_form: str) -> None:
        self.bytes = list(bytes.fromhex(nvml_form[4:].replace("-", "")))

    def __str__(self) -> str:
        h = bytes(self.bytes).hex()
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def test_uuids_are_spelled_as_nvml_spells_them() -> None:
    assert nvml_uuid(_CUuuid(GPU_B)) == GPU_B  # torch's object, through its bytes
    assert nvml_uuid(str(_CUuuid(GPU_B))) == GPU_B  # its string lacks NVML's prefix
    assert nvml_uuid(GPU_B.upper().replace("GPU-", "gpu-")) == GPU_B
    assert nvml_uuid(bytes.fromhex(GPU_A[4:].replace("-", ""))) == GPU_A
    for bad in (0, "0", "", "MIG-bbbbbbbb-5555-6666-7777-888888888888", GPU_B[:-2], b"\x01" * 15, None):
        with pytest.raises(GpuLookupError, match="not a GPU UUID") as err:
            nvml_uuid(bad)
        _one_line(err)


def _fake_cuda(monkeypatch: pytest.MonkeyPatch, visible: list[str]) -> list[int]:
    """torch.cuda seeing ``visible`` (in this process's numbering); returns the devices asked for."""
    import torch

    asked: list[int] = []

    def props(i: int) -> Any:
        asked.append(i)
        return types.SimpleNamespace(name="stub", uuid=_CUuuid(visible[i]))

    monkeypatch.setattr(torch.cuda, "is_available", lambda: bool(visible))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(visible))
    monkeypatch.setattr(torch.cuda, "get_device_properties", props)
    return asked


def test_the_engine_resolves_its_own_gpu_in_its_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from testbed.engines.engine import Engine, EngineConfig

    # Ray gave the engine physical GPU 1 (B): CUDA numbers it 0 in the engine's process.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    asked = _fake_cuda(monkeypatch, [GPU_B])
    cfg = dict(model=tmp_path / "m", run_dir=tmp_path / "run", name="p0", side_channel_port=5600)
    assert Engine(EngineConfig(**cfg, gpu=True)).gpu_uuid() == GPU_B
    assert asked == [0]
    assert Engine(EngineConfig(**cfg)).gpu_uuid() is None  # a CPU engine has none
    assert asked == [0]  # ...and did not ask CUDA

    _fake_cuda(monkeypatch, [])
    with pytest.raises(GpuLookupError, match="no CUDA device 0 visible .*CUDA_VISIBLE_DEVICES=1") as err:
        Engine(EngineConfig(**cfg, gpu=True)).gpu_uuid()
    _one_line(err)
    _fake_cuda(monkeypatch, [GPU_A])
    with pytest.raises(GpuLookupError, match="no CUDA device 1"):
        visible_gpu_uuid(1)


# --------------------------------------------------------------------------- the throttle


def test_the_gpu_is_addressed_by_uuid_and_every_lock_is_reset_on_clear(nvml: Stub) -> None:
    t = GpuClockThrottle("pytest-gpu", GPU_B)
    assert nvml.calls() == []  # building touches nothing
    assert t.apply([], 2.0) == pytest.approx(2.0)
    assert nvml.locked() == {GPU_B: 990}  # B at max/2; A, physical index 0, untouched
    assert nvml.calls("nvmlDeviceGetHandleByIndex") == []
    assert {args[0] for _, args, _ in nvml.calls("nvmlDeviceGetHandleByUUID")} == {GPU_B}
    assert t.active and nvml.markers() == [GPU_B] and _gpu_throttles() == [t]
    assert t.apply([], 4.0) == pytest.approx(4.0)  # make it so: a new factor on the same GPU
    assert nvml.locked() == {GPU_B: 495}

    assert t.clear() == pytest.approx(1.0)
    assert nvml.locked() == {} and nvml.unreset() == set()
    assert not t.active and nvml.markers() == [] and _gpu_throttles() == []
    resets = len(nvml.calls("nvmlDeviceResetGpuLockedClocks"))
    assert t.clear() == pytest.approx(1.0)  # twice is fine, and resets nothing more
    assert len(nvml.calls("nvmlDeviceResetGpuLockedClocks")) == resets
    # every NVML session was closed (the stub refuses calls outside one)
    assert len(nvml.calls("nvmlInit")) == len(nvml.calls("nvmlShutdown"))
    assert [c for c in nvml.calls() if c[2] is not None] == []


def test_an_index_or_no_uuid_is_refused_never_guessed(nvml: Stub) -> None:
    with pytest.raises(ComputeFaultError, match=r"addressed by UUID \(GPU-...\), got 0") as err:
        GpuClockThrottle("pytest-gpu", 0)  # type: ignore[arg-type]
    _one_line(err)
    with pytest.raises(ComputeFaultError, match="no GPU UUID given") as err:
        make_throttle("pytest-gpu", "gpu")
    _one_line(err)
    with pytest.raises(ComputeFaultError, match="no GPU UUID given"):
        FaultAgent("podG", [NIC]).apply_compute("compute", [], 2.0, ttl_s=5, backend="gpu")
    assert nvml.calls() == []  # refused before NVML was even asked
    g = make_throttle("pytest-gpu", "gpu", gpu_uuids=[GPU_B])
    assert isinstance(g, GpuClockThrottle) and g.uuids == (GPU_B,) and not g.active


def test_the_agent_locks_the_pods_gpus_until_the_time_to_live(nvml: Stub) -> None:
    clock = [0.0]
    agent = FaultAgent("podG", [NIC], clock=lambda: clock[0])
    try:
        assert agent.apply_compute("compute", [], 2.0, ttl_s=3.0, backend="gpu", gpu_uuids=[GPU_B]) == pytest.approx(2)
        assert nvml.locked() == {GPU_B: 990}
        assert agent.active()["compute"]["gpu_uuids"] == [GPU_B]
        clock[0] = 2.9
        assert agent.expire() == [] and nvml.locked() == {GPU_B: 990}
        clock[0] = 3.0
        assert agent.expire() == ["compute"]
        assert nvml.locked() == {} and nvml.unreset() == set() and nvml.markers() == []
        assert agent.active() == {} and _gpu_throttles() == []
    finally:
        agent.clear_all()


def test_the_agent_resets_on_clear_clear_all_and_a_change_of_gpus(nvml: Stub) -> None:
    agent = FaultAgent("podG", [NIC])
    agent.apply_compute("compute", [], 2.0, ttl_s=60, backend="gpu", gpu_uuids=[GPU_A])
    # the same key on other GPUs: the first lock is undone, not left behind
    agent.apply_compute("compute", [], 2.0, ttl_s=60, backend="gpu", gpu_uuids=[GPU_B])
    assert nvml.locked() == {GPU_B: 990}
    assert agent.clear("compute") == pytest.approx(1.0)
    assert nvml.locked() == {} and agent.clear("compute") is None  # idempotent

    agent.apply_compute("compute", [], 3.0, ttl_s=60, backend="gpu", gpu_uuids=[GPU_A, GPU_B])
    assert nvml.locked() == {GPU_A: 660, GPU_B: 660} and nvml.markers() == sorted([GPU_A, GPU_B])
    assert agent.clear_all() == ["compute"]
    assert nvml.locked() == {} and nvml.unreset() == set() and nvml.markers() == []
    assert agent.clear_all() == [] and _gpu_throttles() == []


def test_the_exit_hook_resets_what_was_never_cleared(nvml: Stub) -> None:
    t = GpuClockThrottle("pytest-gpu", [GPU_A, GPU_B])
    t.apply([], 2.0)
    compute_common._clear_all_at_exit()  # what atexit runs
    assert nvml.locked() == {} and nvml.unreset() == set() and not t.active and _gpu_throttles() == []


def test_without_root_nothing_is_set(nvml: Stub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    agent = FaultAgent("podG", [NIC])
    with pytest.raises(ComputeFaultError, match="changing GPU clocks needs root, this process runs as uid 1000") as e:
        agent.apply_compute("compute", [], 2.0, ttl_s=5, backend="gpu", gpu_uuids=[GPU_B])
    _one_line(e)
    assert nvml.calls("nvmlDeviceSetGpuLockedClocks") == [] and nvml.locked() == {} and agent.active() == {}
    assert GpuClockThrottle("pytest-gpu", GPU_B).clear() == pytest.approx(1.0)  # nothing to reset: no root needed


@pytest.mark.parametrize("fail,code,words", [
    ("nvmlDeviceSetGpuLockedClocks", 4, "NVML: Insufficient Permissions: changing GPU clocks needs root"),
    ("nvmlDeviceSetGpuLockedClocks", 3, "NVML: Not Supported: this GPU cannot lock its clocks"),
    ("nvmlDeviceGetHandleByUUID", 6, "NVML: Not Found: no such GPU on this node"),
])
def test_nvml_errors_are_one_line_and_leave_nothing_locked(nvml: Stub, fail: str, code: int, words: str) -> None:
    nvml.fail[(fail, GPU_B)] = code  # A locks fine, B fails: all or nothing
    t = GpuClockThrottle("pytest-gpu", [GPU_A, GPU_B])
    with pytest.raises(ComputeFaultError, match=f"GPU {GPU_B}: locking SM clocks at 2.0x failed: {words}") as err:
        t.apply([], 2.0)
    _one_line(err)
    assert nvml.locked() == {} and nvml.unreset() == set()
    assert not t.active and nvml.markers() == [] and _gpu_throttles() == []


def test_a_failed_reset_stays_registered_for_the_next_try(nvml: Stub) -> None:
    t = GpuClockThrottle("pytest-gpu", GPU_B)
    t.apply([], 2.0)
    nvml.fail["nvmlDeviceResetGpuLockedClocks"] = 4
    with pytest.raises(ComputeFaultError, match=f"GPU {GPU_B}: resetting SM clocks failed: .*needs root") as err:
        t.clear()
    _one_line(err)
    assert t.active and nvml.locked() == {GPU_B: 990} and _gpu_throttles() == [t] and nvml.markers() == [GPU_B]
    del nvml.fail["nvmlDeviceResetGpuLockedClocks"]
    t.clear()  # what the agent's TTL timer does on its next tick
    assert nvml.locked() == {} and not t.active and _gpu_throttles() == []


def test_nvml_that_cannot_start_is_one_line(nvml: Stub, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> None:
        raise RuntimeError("NVML Shared Library Not Found\n(driver missing)")

    monkeypatch.setattr(nvml.module, "nvmlInit", broken)
    with pytest.raises(ComputeFaultError, match="NVML init failed: NVML Shared Library Not Found") as err:
        GpuClockThrottle("pytest-gpu", GPU_B).apply([], 2.0)
    _one_line(err)
    with pytest.raises(ComputeFaultError, match="NVML init failed") as err:
        make_throttle("pytest-gpu", "gpu", gpu_uuids=[GPU_B])
    _one_line(err)


# --------------------------------------------------------------------------- agent processes

# A fault agent on the stub: locks GPU B for 60 s, says so, then (argv[1])
# "exit": returns without clearing at a line on stdin; "sigterm"/"sigkill": waits to be killed.
AGENT = """
import os, sys, time
from pathlib import Path
os.geteuid = lambda: 0
import testbed.faults.gpu as gpu
gpu.lock_dir = lambda: Path(os.environ["PYTEST_GPU_LOCKS"])
gpu.GpuClockThrottle.SETTLE_S = 0.0
if sys.argv[1] == "exit":
    from testbed.faults.agent import FaultAgent
    agent = FaultAgent("podX", ["pytest-nic0"])
    agent.apply_compute("compute", [], 2.0, 60, "gpu", None, [sys.argv[2]])
    print("locked", flush=True)
    sys.stdin.readline()
else:  # the Ray actor's own class, run in this process: its signal handlers and atexit hook
    from testbed.faults.agent_actor import FaultAgentActor
    actor = FaultAgentActor.__ray_metadata__.modified_class("podX", ["pytest-nic0"])
    actor.apply_compute("compute", [], 2.0, 60, "gpu", None, [sys.argv[2]])
    print("locked", actor.signals, flush=True)
    time.sleep(60)
"""


def _agent(nvml: Stub, mode: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(nvml.root / "stub"), str(REPO)]))
    p = subprocess.Popen([sys.executable, "-c", AGENT, mode, GPU_B], env=env, cwd=REPO, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None
    line = p.stdout.readline()
    assert line.startswith("locked"), p.communicate(timeout=30)
    assert nvml.locked() == {GPU_B: 990} and nvml.markers() == [GPU_B]
    return p


@pytest.mark.parametrize("mode", ["exit", "sigterm"])
def test_an_agent_that_exits_resets_its_gpus(nvml: Stub, mode: str) -> None:
    p = _agent(nvml, mode)
    if mode == "sigterm":
        p.send_signal(signal.SIGTERM)
    _, err = p.communicate("go\n", timeout=30)
    assert p.returncode == (0 if mode == "exit" else 128 + signal.SIGTERM), err
    assert nvml.locked() == {} and nvml.unreset() == set() and nvml.markers() == []


def test_testbed_faults_clear_resets_the_gpus_of_a_killed_agent(nvml: Stub, monkeypatch: pytest.MonkeyPatch) -> None:
    from testbed.faults import agent_actor as fault_agents
    from testbed.machine import netns
    from testbed.faults import cpu
    from testbed.faults import shaping

    p = _agent(nvml, "sigkill")
    p.kill()  # no handler, no atexit: the lock survives its agent
    p.communicate(timeout=30)
    assert nvml.locked() == {GPU_B: 990} and nvml.markers() == [GPU_B]
    # `testbed faults clear` without touching this machine's links and cgroups
    monkeypatch.setattr(shaping, "clear_all", lambda allowlist=None: [])
    monkeypatch.setattr(netns, "list_namespaces", lambda: [])
    monkeypatch.setattr(cpu, "clear_project_cgroups", lambda only_empty=False: [])
    assert fault_agents.clear_host_faults() == [f"gpu:{GPU_B}"]
    assert nvml.locked() == {} and nvml.unreset() == set() and nvml.markers() == []
    assert fault_agents.clear_host_faults() == []  # idempotent
    assert reset_project_gpu_locks() == []


def test_faults_clear_without_gpu_locks_needs_no_nvml(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(gpu, "lock_dir", lambda: tmp_path / "locks")
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml would fail
    assert reset_project_gpu_locks() == []


# --------------------------------------------------------------------------- the real GPU

_NO_GPU = gpu_available()


@pytest.mark.skipif(_NO_GPU is not None, reason=f"no GPU here ({_NO_GPU})")
def test_a_real_gpu_is_locked_measured_and_reset() -> None:
    """On the GPU of this process: the UUID torch resolves is the one NVML knows, and under
    load the lock halves the SM clock until it is reset."""
    import pynvml
    import torch

    if os.geteuid() != 0:
        pytest.skip("locking GPU clocks needs root")
    try:
        uuid = visible_gpu_uuid(0)
    except GpuLookupError as exc:
        pytest.skip(f"torch cannot see this process's GPU: {exc}")
    pynvml.nvmlInit()
    try:
        assert nvml_uuid(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByUUID(uuid))) == uuid
    finally:
        pynvml.nvmlShutdown()

    stop = threading.Event()

    def load() -> None:  # keeps the SM clock up: an idle GPU parks low and would read as slowed
        a = torch.randn(4096, 4096, device="cuda:0")
        while not stop.is_set():
            a = (a @ a).clamp_(-1, 1)
            torch.cuda.synchronize()

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    t = GpuClockThrottle("pytest-gpu", uuid)
    try:
        before = t.clear()  # nothing locked yet: just measures
        measured = t.apply([], 2.0)
        assert uuid in locked_uuids()
        after = t.clear()
        print(f"GPU {uuid}: max/current SM clock {before:.2f} before, {measured:.2f} locked at 2x, {after:.2f} after")
        assert before < 1.4 and 1.6 <= measured <= 2.6 and after < 1.4
    finally:
        t.clear()
        stop.set()
        worker.join(timeout=30)
    assert not t.active and uuid not in locked_uuids() and not math.isnan(after)
