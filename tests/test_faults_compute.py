"""The compute throttle (testbed.faults) against the real kernel: cgroup CPU quotas on live processes
(the GPU backend, stubbed and real: tests/test_gpu_throttle.py).

No mocks: every test throttles real processes and reads the effect back from
them (only the backend choice is checked against a stub NVML, which must not sway it). Each test removes its cgroups even when it fails (the ``throttles``
fixture), and kills the processes it started (``procs``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from testbed.faults.cgroups import PARENT
from testbed.faults.compute import make_throttle
from testbed.faults.cpu import CpuQuotaThrottle, clear_project_cgroups
from testbed.faults.gpu import GpuClockThrottle
from testbed.machine.gpu import gpu_available
from testbed.machine.procs import descendants
from testbed.faults.compute_common import ComputeFaultError, ComputeThrottle

REPO = Path(__file__).resolve().parents[1]

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="cgroup throttling needs root")

# Reports its loop rate (iterations/s) on stdout every 0.2 s.
RATE_CHILD = """
import sys, time
n, t0 = 0, time.monotonic()
while True:
    for _ in range(20000):
        pass
    n += 1
    t = time.monotonic()
    if t - t0 >= 0.2:
        sys.stdout.write(f"{n / (t - t0):.2f}\\n")
        sys.stdout.flush()
        n, t0 = 0, t
"""

# Sleeps; on a line on stdin forks a sleeping child and prints its pid.
FORKER = """
import subprocess, sys
for _ in sys.stdin:
    c = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    print(c.pid, flush=True)
"""

# A fault agent: throttles argv[2] under key argv[1], prints the measured factor, then
# either waits to be killed (crash test) or returns without clearing (atexit test).
AGENT = """
import sys, time
from testbed.faults.cpu import CpuQuotaThrottle
t = CpuQuotaThrottle(sys.argv[1], probe_s=0.1)
print(t.apply([int(sys.argv[2])], 2.0), flush=True)
if sys.argv[3] == "hang":
    time.sleep(60)
"""


def _cgroups(pid: int) -> dict[str, str]:
    """/proc/<pid>/cgroup as {controllers: path}."""
    out = {}
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        out[ctrls] = path
    return out


def _in_project_cgroup(pid: int) -> bool:
    return any(f"/{PARENT}/" in p for p in _cgroups(pid).values())


def _unlimited_reading(procs: Callable[..., subprocess.Popen[str]], throttles: Callable[..., CpuQuotaThrottle]) -> float:
    """What the throttle's probe reads on this machine now with no limit that binds (factor 1: a
    quota of every baseline core): 1 when the machine is otherwise idle, more while other work
    competes for its cores. The measured factor includes that contention by design
    (testbed/faults/cpu.py CpuQuotaThrottle): a quota of baseline/f reads max(f, this)."""
    idle = procs("import time; time.sleep(60)")
    t = throttles("unlimited")
    reading = t.apply([idle.pid], 1.0)
    t.clear()
    return reading


def _quota_cores(t: CpuQuotaThrottle) -> float:
    """The CFS quota the throttle's cgroup holds, in cores (its own files: cpu.max or cfs_quota_us)."""
    for d in t.cgroup_dirs():
        if (d / "cpu.max").exists():
            quota, period = (d / "cpu.max").read_text().split()
            return float("inf") if quota == "max" else int(quota) / int(period)
        if (d / "cpu.cfs_quota_us").exists():
            quota = int((d / "cpu.cfs_quota_us").read_text())
            return float("inf") if quota < 0 else quota / int((d / "cpu.cfs_period_us").read_text())
    raise AssertionError(f"no cpu controller files in {t.cgroup_dirs()}")


@pytest.fixture
def procs() -> Iterator[Callable[..., subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []

    def start(code: str, *args: str, stdin: int | None = None) -> subprocess.Popen[str]:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        p = subprocess.Popen(
            [sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stdin=stdin, text=True, env=env
        )
        started.append(p)
        return p

    yield start
    for p in started:
        for pid in descendants(p.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        p.kill()
        p.wait()


@pytest.fixture
def throttles() -> Iterator[Callable[..., CpuQuotaThrottle]]:
    made: list[CpuQuotaThrottle] = []

    def make(name: str, **kw: object) -> CpuQuotaThrottle:
        t = CpuQuotaThrottle(f"pytest-{name}-{os.getpid()}", **kw)  # type: ignore[arg-type]
        made.append(t)
        return t

    yield make
    for t in made:
        try:
            if t.active:
                t.clear()
        finally:
            if any(d.exists() for d in t.cgroup_dirs()):
                clear_project_cgroups()  # last resort: nothing may outlive the test


class RateReader:
    """Collects (arrival time, rate) from a RATE_CHILD's stdout on a thread."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.samples: list[tuple[float, float]] = []
        assert proc.stdout is not None
        self._out = proc.stdout
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        for line in self._out:
            self.samples.append((time.monotonic(), float(line)))

    def rate(self, seconds: float, patience_s: float = 5.0) -> float:
        """Mean rate of the samples that arrive in the next ``seconds``, or until the first one does.
        The child reports once at least 0.2 s have passed, at the end of a loop chunk that the quota
        can hold for most of a CFS period (100 ms), so a window of 0.2 s (the settling waits below)
        may end between two reports (from a fresh clone's suite, 2026-11-30: "reported nothing")."""
        t0 = time.monotonic()
        time.sleep(seconds)
        deadline = time.monotonic() + patience_s
        while not (got := [r for t, r in self.samples if t > t0]) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert got, f"the rate child reported nothing in {seconds + patience_s:.1f} s"
        return sum(got) / len(got)


def _cpu_s(pid: int) -> float:
    """CPU seconds ``pid`` has used (utime + stime from /proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs: neither reaped (its /proc entry can go between any two reads) nor a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def _share(reader: RateReader, pid: int, seconds: float) -> tuple[float, float]:
    """(loop rate, CPU share in cores) of ``pid`` over the next ``seconds``."""
    c0, t0 = _cpu_s(pid), time.monotonic()
    rate = reader.rate(seconds)
    return rate, (_cpu_s(pid) - c0) / (time.monotonic() - t0)


@needs_root
def test_quota_slows_a_cpu_bound_process_by_the_measured_factor(procs, throttles) -> None:
    child = procs(RATE_CHILD)
    # one CPU: the default baseline (the CPUs the pid may use) is then 1 core, as it uses
    os.sched_setaffinity(child.pid, {max(os.sched_getaffinity(0))})
    # A high weight keeps its unthrottled rate near a full core even when other work shares the
    # CPU; the quota is a hard cap that no weight gets around, so the ratio measures the quota.
    os.setpriority(os.PRIO_PROCESS, child.pid, -10)
    reader = RateReader(child)
    reader.rate(0.4)  # past start-up
    before, share_before = _share(reader, child.pid, 1.0)

    t = throttles("rate")
    assert isinstance(t, ComputeThrottle)
    measured = t.apply([child.pid], 3.0)
    assert t.active
    assert all(d.is_dir() for d in t.cgroup_dirs())
    assert _in_project_cgroup(child.pid)
    reader.rate(0.2)
    throttled, share_throttled = _share(reader, child.pid, 1.2)

    after_factor = t.clear()
    assert not t.active
    reader.rate(0.2)
    after, share_after = _share(reader, child.pid, 1.0)
    # The quota caps CPU time, so the CPU share is what it divides. The loop's rate also moves with
    # the host CPU's own speed, which was seen to change 1.5x within a second here (a VM's clock), so
    # the rate only has to drop clearly while throttled.
    ratio = share_before / share_throttled
    print(f"rate before {before:.0f}/s throttled {throttled:.0f}/s after {after:.0f}/s; CPU share before "
          f"{share_before:.2f} throttled {share_throttled:.2f} after {share_after:.2f} ratio {ratio:.2f}; "
          f"measured {measured:.2f} after clear {after_factor:.2f}")
    # The quota is a cap whatever else runs: one core (the child's) over the factor. Unthrottled the
    # child gets what the machine leaves it (0.66 of its core beside a busy loop on each core, where
    # a ratio of shares of at least 2.0 failed at 1.99), so the cap is judged on its own, and against
    # what the child got before.
    cap = 1.0 / 3.0
    assert share_before > 1.5 * cap, f"unthrottled the child got {share_before:.2f} cores: the cap would not bind"
    assert 0.75 * cap <= share_throttled <= 1.1 * cap
    assert throttled < 0.8 * min(before, after)
    # The probe's readings include the machine's contention by design (CpuQuotaThrottle): cleared,
    # it reads that contention alone (1 on an idle machine; 1.52 with a busy loop on each core
    # beside it, which a fixed bound of 1.5 failed), limited, the larger of the factor and it.
    assert 0.75 <= after_factor < measured
    assert 0.75 * 3.0 <= measured <= 1.25 * max(3.0, after_factor)
    assert share_after >= 0.75 * share_before
    assert not any(d.exists() for d in t.cgroup_dirs())
    assert not _in_project_cgroup(child.pid)

    # clearing again is harmless; nothing changed, so the figure measured at clearing stands
    assert t.clear() == after_factor
    assert not any(d.exists() for d in t.cgroup_dirs())


@needs_root
def test_apply_changes_the_factor_in_place(procs, throttles) -> None:
    child = procs("import time; time.sleep(60)")
    t = throttles("refactor")
    cores = float(len(os.sched_getaffinity(child.pid)))  # the baseline: the CPUs the pid may use
    first = t.apply([child.pid], 4.0)
    assert _quota_cores(t) == pytest.approx(cores / 4.0, rel=0.01)
    second = t.apply([child.pid], 2.0)
    assert _quota_cores(t) == pytest.approx(cores / 2.0, rel=0.01)  # the quota moved, in place
    t.clear()
    assert not _in_project_cgroup(child.pid)
    # What each quota lets through, against the same probe with no limit measured in this test (a
    # fixed band failed at 2.64 for 2x while another process kept both cores busy): never faster
    # than the quota, and no slower than the quota or the machine's contention, whichever binds.
    unlimited = _unlimited_reading(procs, throttles)
    print(f"measured {first:.2f} then {second:.2f}; no limit {unlimited:.2f}")
    for measured, factor in ((first, 4.0), (second, 2.0)):
        assert 0.75 * factor <= measured <= 1.25 * max(factor, unlimited), (measured, factor, unlimited)


@needs_root
def test_clear_project_cgroups_cleans_up_after_a_killed_agent(procs) -> None:
    forker = procs(FORKER, stdin=subprocess.PIPE)
    original = _cgroups(forker.pid)
    key = f"pytest-crash-{os.getpid()}"
    agent = procs(AGENT, key, str(forker.pid), "hang")
    assert agent.stdout is not None
    line = agent.stdout.readline()
    assert line, "the agent died before applying"
    assert float(line) > 1.4
    assert _in_project_cgroup(forker.pid)

    # a process forked after apply is throttled too, and must come back as well
    assert forker.stdin is not None and forker.stdout is not None
    forker.stdin.write("fork\n")
    forker.stdin.flush()
    grandchild = int(forker.stdout.readline())
    assert grandchild in descendants(forker.pid)
    assert _in_project_cgroup(grandchild)

    os.kill(agent.pid, signal.SIGKILL)  # no atexit, no finally: the fault outlives it
    agent.wait()
    dirs = [d for d in Path("/sys/fs/cgroup").glob(f"*/{PARENT}/{key}")]
    assert dirs, "the killed agent left no cgroup to clean up"

    try:
        removed = clear_project_cgroups()
        assert {str(d) for d in dirs} <= set(removed)
        assert not any(d.exists() for d in dirs)
        assert _cgroups(forker.pid) == original
        assert _cgroups(grandchild) == original
        assert clear_project_cgroups() == []  # idempotent
    finally:
        clear_project_cgroups()


@needs_root
def test_atexit_clears_a_throttle_left_active(procs) -> None:
    sleeper = procs("import time; time.sleep(60)")
    original = _cgroups(sleeper.pid)
    key = f"pytest-atexit-{os.getpid()}"
    agent = procs(AGENT, key, str(sleeper.pid), "return")
    out, _ = agent.communicate(timeout=30)
    try:
        assert agent.returncode == 0 and float(out) > 1.4
        assert not list(Path("/sys/fs/cgroup").glob(f"*/{PARENT}/{key}"))
        assert _cgroups(sleeper.pid) == original
    finally:
        clear_project_cgroups()


@needs_root
def test_an_agent_started_through_the_node_shim_throttles_and_clears(procs, throttles, tmp_path: Path) -> None:
    """The emulated cluster's nodes (and `ray up`'s) run through the namespace shim, which remounts
    /sys for the namespace's own /sys/class/net; the agent there must still find the cgroups and
    slow a process by the factor asked for (it failed with "no usable cgroup cpu controller")."""
    import uuid

    from testbed.machine.netns import create_namespace, kill_processes_in, netns_exec_argv, remove_namespace, run_prefix

    sleeper = procs("import time; time.sleep(60)")
    original = _cgroups(sleeper.pid)
    key = f"pytest-shim-{os.getpid()}"
    ns = run_prefix(uuid.uuid4().hex[:10]) + "pod0"
    # The shim's own temporary directory, so that no other process's can be taken for one it left.
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch)}
    try:
        create_namespace(ns)
        listing = subprocess.run(netns_exec_argv(ns, [sys.executable, "-c", "import os; print(os.listdir('/sys/class/net'))"]),
                                 capture_output=True, text=True, timeout=30, env=env)
        assert listing.stdout.strip() == "['lo']", listing.stderr  # still the namespace's own devices
        agent = subprocess.run(netns_exec_argv(ns, [sys.executable, "-c", AGENT, key, str(sleeper.pid), "return"]),
                               capture_output=True, text=True, timeout=60, env={**env, "PYTHONPATH": str(REPO)})
        assert agent.returncode == 0, agent.stderr[-2000:]
        assert _cgroups(sleeper.pid) == original  # cleared at its exit, on the host's own hierarchies
        # the factor the agent measured: the quota's, or the machine's contention where that binds
        unlimited = _unlimited_reading(procs, throttles)
        assert 0.75 * 2.0 <= float(agent.stdout) <= 1.25 * max(2.0, unlimited), (agent.stdout, unlimited)
        assert not list(Path("/sys/fs/cgroup").glob(f"*/{PARENT}/{key}"))
    finally:
        kill_processes_in([ns])
        remove_namespace(ns)
        clear_project_cgroups()
    assert not list(scratch.iterdir())  # the shim left no mount point behind


@needs_root
def test_bad_requests_change_nothing(procs, throttles) -> None:
    alive = procs("import time; time.sleep(60)")
    original = _cgroups(alive.pid)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert not Path(f"/proc/{gone.pid}").exists()

    t = throttles("bad")
    with pytest.raises(ComputeFaultError, match=f"pid {gone.pid} does not exist"):
        t.apply([alive.pid, gone.pid], 2.0)
    for factor in (0.5, 0.0, -1.0, float("nan")):
        with pytest.raises(ComputeFaultError, match="factor must be >= 1"):
            t.apply([alive.pid], factor)
    assert not t.active
    assert not any(d.exists() for d in t.cgroup_dirs())
    assert _cgroups(alive.pid) == original

    # and on an active throttle a bad pid leaves the running fault as it was
    t.apply([alive.pid], 2.0)
    with pytest.raises(ComputeFaultError, match=f"pid {gone.pid}"):
        t.apply([gone.pid], 3.0)
    assert t.active and t.factor == 2.0
    assert _in_project_cgroup(alive.pid)


def test_descendants_follows_the_process_tree(procs) -> None:
    # parent -> child -> grandchild; the child prints both its pid and the grandchild's
    parent = procs(
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import os, subprocess; "
        "g = subprocess.Popen([\"sleep\", \"60\"]); print(os.getpid(), g.pid, flush=True); g.wait()'])\n"
        "time.sleep(60)"
    )
    assert parent.stdout is not None
    child, grandchild = map(int, parent.stdout.readline().split())
    assert descendants(parent.pid) == sorted([child, grandchild])
    assert descendants(child) == [grandchild]
    assert descendants(grandchild) == []


def _fake_nvml(monkeypatch: pytest.MonkeyPatch, init_error: str | None = None) -> None:
    """A stub ``pynvml`` that answers like a host with one GPU (or fails ``nvmlInit``)."""
    nvml = types.ModuleType("pynvml")

    def init() -> None:
        if init_error is not None:
            raise RuntimeError(init_error)

    nvml.nvmlInit = init  # type: ignore[attr-defined]
    nvml.nvmlShutdown = lambda: None  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetCount = lambda: 1  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", nvml)


def test_the_backend_is_the_callers_never_the_hosts(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_nvml(monkeypatch)
    assert gpu_available() is None  # the host looks like it has a GPU...
    t = make_throttle("pytest-backend", "cpu")
    assert isinstance(t, CpuQuotaThrottle) and not t.active  # ...yet a CPU testbed gets its CPU throttle
    assert t.baseline_cores is None  # every core of the host, fixed at the first apply
    # single-threaded engines: the quota is their cores over the factor, not the host's
    assert make_throttle("pytest-backend", "cpu", 1.0).baseline_cores == 1.0
    g = make_throttle("pytest-backend", "gpu", gpu_uuids=["GPU-bbbbbbbb-5555-6666-7777-888888888888"])
    assert isinstance(g, GpuClockThrottle) and not g.active  # built only: nothing locked
    with pytest.raises(ValueError, match=r"unknown compute throttle backend 'tpu': known are cpu, gpu"):
        make_throttle("pytest-backend", "tpu")  # type: ignore[arg-type]


def test_a_gpu_backend_without_nvml_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_nvml(monkeypatch, init_error="NVML Shared Library Not Found\n(driver missing)")
    with pytest.raises(ComputeFaultError, match="NVML init failed") as err:
        make_throttle("pytest-backend", "gpu", gpu_uuids=["GPU-bbbbbbbb-5555-6666-7777-888888888888"])
    assert "\n" not in str(err.value)


def test_the_agent_slows_processes_until_the_time_to_live_then_puts_them_back(procs, throttles) -> None:
    from testbed.faults.agent import FaultAgent, FaultRefused

    child = procs("import time; time.sleep(60)")
    clock = [0.0]
    agent = FaultAgent("podT", ["eth0"], clock=lambda: clock[0])
    try:
        with pytest.raises(FaultRefused, match="time to live"):
            agent.apply_compute("compute", [child.pid], 2.0, ttl_s=0)
        assert not _in_project_cgroup(child.pid)
        measured = agent.apply_compute("compute", [child.pid], 2.0, ttl_s=3.0)
        # The quota's factor, or the machine's contention where that binds, read by the same probe
        # with no limit in this test (a fixed band failed at 3.17 for 2x beside a busy loop on both cores).
        unlimited = _unlimited_reading(procs, throttles)
        assert 0.75 * 2.0 <= measured <= 1.25 * max(2.0, unlimited), (measured, unlimited)
        assert _in_project_cgroup(child.pid) and agent.active()["compute"]["factor"] == 2.0
        clock[0] = 2.9
        assert agent.expire() == []
        clock[0] = 3.0
        assert agent.expire() == ["compute"]
        assert not _in_project_cgroup(child.pid) and agent.active() == {}
    finally:
        agent.clear_all()


def test_the_agent_kills_an_engines_process_and_refuses_any_other():
    """An engine fault's kill (FaultAgent.kill_engine): SIGKILL for a process titled as an engine actor
    (Ray's ``ray::EngineActor``) or its child (vLLM's engine core), a one-line refusal for anything
    else, which is left running."""
    from testbed.faults.agent import ENGINE_TITLE, FaultAgent, FaultRefused

    agent = FaultAgent("podT", ["eth0"])
    # an "actor" (argv[0] set to the engine actor's title) with a spawned child, as vLLM's core is
    actor = subprocess.Popen(["bash", "-c", f"exec -a '{ENGINE_TITLE}' bash -c 'sleep 600 & wait; while :; do sleep 1; done'"])
    other = subprocess.Popen(["sleep", "600"])
    try:
        deadline = time.monotonic() + 10
        while not descendants(actor.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        (core,) = descendants(actor.pid)
        with pytest.raises(FaultRefused, match=rf"pid {other.pid} is not an engine's process"):
            agent.kill_engine(other.pid)
        assert other.poll() is None  # not signalled
        agent.kill_engine(core)  # the engine core: the actor's child
        deadline = time.monotonic() + 10
        while _alive(core) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(core), f"the engine core {core} outlived its SIGKILL by 10 s"
        assert actor.poll() is None  # the actor lives on, as a dead core's does
        agent.kill_engine(actor.pid)
        assert actor.wait(timeout=10) == -signal.SIGKILL
    finally:
        for p in (actor, other):
            p.kill()
            p.wait()
