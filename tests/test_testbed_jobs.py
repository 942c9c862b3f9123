"""A spec travels once on the testbed: the command line validates it, the launcher generates each
seed's workload once (testbed/runs/jobs.py), and the driver hands that spec object and that
workload to each run's router actor, which neither parses nor generates again. Checked over the
launcher's hand-off, the driver's job path and the router actor's constructor, with stand-ins for
Ray and the engines (real engines take minutes)."""

from __future__ import annotations

import asyncio
import importlib
import io
import json
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ray", reason="Ray is not installed (the README's install command installs it)")


class _Call:
    def __init__(self, fn):
        self.remote = fn


class _FakeRay:
    """What the driver's run path asks of Ray, answered at once in this process."""

    import ray as _ray

    exceptions = _ray.exceptions

    @staticmethod
    def wait(refs, timeout=None):
        return refs, []

    @staticmethod
    def get(x, timeout=None):
        return x

    @staticmethod
    def kill(actor):
        pass

    @staticmethod
    def get_runtime_context():
        # the driver's node; the fake router's is another, so every run's records are fetched
        # from it (testbed/router/run_archive.py), as where the driver runs off the head
        return type("Context", (), {"get_node_id": staticmethod(lambda: "driver-node")})()


class _FakeEngines:
    def __init__(self, topo):
        self.topo = topo
        self.prefill = [f"prefill{i}" for i in range(len(topo.prefill_ids))]
        self.decode = [f"decode{i}" for i in range(len(topo.decode_ids))]
        self.names = self.prefill + self.decode
        self.calibration = None
        self.lease_s = 30
        self.block_tokens = 128  # as vLLM's CPU build reports it (testbed/engines/engine.py Engine.block_tokens)

    def references(self, prompts, max_tokens):
        return {}

    def reset(self):
        return [True] * len(self.names)

    def quiesce(self, within_s, poll_s=0.5):
        from testbed.engines.pool import Engines

        return Engines.quiesce(self, within_s, poll_s)

    def metrics(self):
        return []

    def loads(self):
        return []

    def kv_paths(self, vocab, timeout_s=10.0):
        return {"ok": True, "broken": [], "down": [], "check_s": 0.0}


FETCHED: list[str] = []  # the run directories the driver fetched from the fake router's node


def _fake_router_actor(on_run):
    """A stand-in for RouterActor's Ray handle: the real class is built from its arguments pickled as
    Ray would, its run hands (the actor's arguments, the arrival times) to ``on_run``, and its
    close closes the real run."""
    from testbed.router.actor import RouterActor

    class FakeRouterActor:
        @staticmethod
        def options(**kw):
            return FakeRouterActor

        @staticmethod
        def remote(*args):
            args = pickle.loads(pickle.dumps(args))
            actor = RouterActor.__ray_metadata__.modified_class(*args)
            handle = type("Handle", (), {})()
            handle.run = _Call(lambda arrival, prompt, output: (on_run(args, arrival), {"ok": len(arrival)})[1])
            handle.progress = _Call(lambda: {"outcomes": {}})
            handle.close = _Call(lambda status, **kw: asyncio.run(actor.close(status, **kw)))
            handle.node_id = _Call(lambda: "router-node")
            handle.run_dir = _Call(actor.run_dir)

            def archive():
                FETCHED.append(actor.run_dir())
                return actor.run_archive()

            handle.run_archive = _Call(archive)
            return handle

    return FakeRouterActor


def test_a_spec_is_validated_once_and_each_workload_generated_once_on_the_way_to_the_router(tmp_path, monkeypatch):
    from rich.console import Console
    from rich.progress import Progress

    import testbed.runs.driver as driver
    from core.experiment import build_topology, seed_streams
    from core.spec.model import ExperimentSpec, load_spec
    from testbed.runs.jobs import prepare_jobs
    from testbed.runs.launch import _driver_argv

    wg = importlib.import_module("workloads.generate")  # (the package's `generate` is the function)
    # as the command line hands it over (validated there), without faults: no agents here
    spec = load_spec(None, default="testbed.yaml").model_copy(update={"faults": []})
    seeds, policies = [0, 1], ["LC", "OTF-R"]
    expected = {s: wg.generate(spec.workload, seed_streams(s)["workload"]) for s in seeds}

    calls = {"validate": 0, "generate": 0}
    validate, generate = ExperimentSpec.model_validate.__func__, wg.generate

    def counted_validate(cls, *a, **kw):
        calls["validate"] += 1
        return validate(cls, *a, **kw)

    def counted_generate(*a, **kw):
        calls["generate"] += 1
        return generate(*a, **kw)

    monkeypatch.setattr(ExperimentSpec, "model_validate", classmethod(counted_validate))
    for module in list(sys.modules.values()):  # whoever holds generate, however it was imported
        # read each module's own dict: getattr would run a lazy module's __getattr__ (transformers
        # then imports its vision models, which need torchvision, removed by install.sh)
        if getattr(module, "__dict__", {}).get("generate") is generate:
            monkeypatch.setattr(module, "generate", counted_generate)

    # the launcher: workloads generated and checked, the driver's command line and its jobs file
    argv = _driver_argv(prepare_jobs([(spec, policies, seeds)]), tmp_path / "out", tmp_path / "model",
                        {"vocab": 2048, "kv_bytes_per_token": 8192}, tmp_path / "work", "local", None)
    assert calls == {"validate": 0, "generate": len(seeds)}

    # the driver: its jobs read back, each (policy, seed) run through to a router actor (the real
    # class's constructor, its arguments pickled as Ray would) and closed
    jobs = driver.read_jobs(Path(argv[argv.index("--jobs") + 1]))
    replayed: dict[tuple[str, int], list[float]] = {}

    def on_run(args, arrival):
        got_spec, policy, seed = args[:3]
        assert isinstance(got_spec, ExperimentSpec)
        replayed[(policy, seed)] = arrival

    FakeRouterActor = _fake_router_actor(on_run)

    monkeypatch.setattr(driver, "ray", _FakeRay)
    monkeypatch.setattr(driver, "RouterActor", FakeRouterActor)
    monkeypatch.setattr(driver, "console", Console(file=io.StringIO()))
    engines = _FakeEngines(build_topology(spec))
    FETCHED.clear()
    with Progress(console=Console(file=io.StringIO())) as progress:
        for job in jobs:
            for policy in job.policies:
                for seed in job.seeds:
                    run_dir = driver.run_one(job.spec, policy, seed, job.workloads[seed], tmp_path / "out", engines,
                                             {"vocab": 2048, "kv_bytes_per_token": 8192}, progress)
                    meta = json.loads((run_dir / "run.json").read_text())
                    assert meta["spec"] == spec.model_dump(mode="json") and meta["status"] == "finished"
                    assert meta["start"]["quiet"] is True and meta["start"]["resets"] == 1  # Engines.quiesce's record

    assert calls == {"validate": 0, "generate": len(seeds)}  # nothing parsed or generated again
    # the router on another node than the driver: each closed run fetched from it, and whole
    assert len(FETCHED) == len(policies) * len(seeds), FETCHED
    assert sorted(replayed) == sorted((p, s) for p in policies for s in seeds)
    for (_, seed), arrival in replayed.items():  # the very workload of the seed's stream
        np.testing.assert_array_equal(arrival, expected[seed].arrival_s)


def test_a_repeat_runs_the_same_workloads_again_on_the_same_engines_into_its_own_folder(tmp_path, monkeypatch):
    """`testbed twin --repeat` (the testbed's repeatability): the driver runs every (policy, seed)
    twice, the second pass into the repeat folder, each with the seed's very arrival times."""
    from rich.console import Console

    import testbed.runs.driver as driver
    from core.experiment import build_topology
    from core.spec.model import load_spec
    from testbed.runs.jobs import prepare_jobs, repeat_of, write_jobs

    spec = load_spec(None, default="testbed.yaml").model_copy(update={"faults": []})
    jobs = prepare_jobs([(spec, ["LC", "OTF-R"], [0, 1])])
    jobs.append(repeat_of(jobs[0], tmp_path / "repeat"))
    write_jobs(tmp_path / "jobs.pkl", jobs)
    jobs = driver.read_jobs(tmp_path / "jobs.pkl")  # as the driver gets them
    replayed: list[tuple[str, int, str, list[float]]] = []

    FakeRouterActor = _fake_router_actor(lambda args, arrival: replayed.append((args[1], args[2], args[3], list(arrival))))

    monkeypatch.setattr(driver, "ray", _FakeRay)
    monkeypatch.setattr(driver, "RouterActor", FakeRouterActor)
    monkeypatch.setattr(driver, "console", Console(file=io.StringIO()))
    driver._run_jobs(jobs, tmp_path / "out", _FakeEngines(build_topology(spec)), {"vocab": 2048, "kv_bytes_per_token": 8192},
                     None, None, {})
    first = [(p, s, a) for p, s, o, a in replayed if Path(o) == tmp_path / "out"]
    again = [(p, s, a) for p, s, o, a in replayed if Path(o) == (tmp_path / "repeat").resolve()]
    assert len(replayed) == 8 and first == again  # the same runs, in the same order, the same arrivals
    for out in (tmp_path / "out", tmp_path / "repeat"):
        assert sorted(d.relative_to(out).as_posix() for d in out.glob("*/*/seed-*")) == sorted(
            f"{spec.name}/{p}/seed-{s}" for p in ("LC", "OTF-R") for s in (0, 1))


def test_each_run_records_the_calibration_of_its_engines(tmp_path, monkeypatch):
    """A calibration measured on the engines (or given to `testbed twin --calibration`) goes into
    every run's run.json, where the host-stall marks read the engine speeds (analysis/run/host_stall.py)."""
    from rich.console import Console

    import testbed.runs.driver as driver
    from core.calibration.fit import save_calibration
    from core.experiment import build_topology
    from core.spec.model import load_spec
    from testbed.runs.jobs import prepare_jobs
    from testbed.runs.launch import _driver_argv

    from test_calibration import _calibration  # a calibration file's contents, as calibrate writes them

    spec = load_spec(None, default="testbed.yaml").model_copy(update={"faults": []})
    jobs = prepare_jobs([(spec, ["LC"], [0])])
    path = save_calibration(_calibration(), tmp_path / "cal" / "calibration.json")
    argv = _driver_argv(jobs, tmp_path / "out", tmp_path / "model", {"vocab": 2048, "kv_bytes_per_token": 8192},
                        tmp_path / "work", "local", None, calibration=path)
    assert argv[argv.index("--calibration") + 1] == str(path.resolve()) and "--calibrate" not in argv
    calibrated = driver.run_calibration(driver.load_calibration(str(path)), str(path), measured_here=False)

    monkeypatch.setattr(driver, "ray", _FakeRay)
    monkeypatch.setattr(driver, "RouterActor", _fake_router_actor(lambda args, arrival: None))
    monkeypatch.setattr(driver, "console", Console(file=io.StringIO()))
    engines = _FakeEngines(build_topology(spec))
    engines.calibration = calibrated  # what the driver's main sets once it has measured or read it
    driver._run_jobs(jobs, tmp_path / "out", engines, {"vocab": 2048, "kv_bytes_per_token": 8192}, None, None, {})
    (run_dir,) = (tmp_path / "out").glob("*/LC/seed-0")
    got = json.loads((run_dir / "run.json").read_text())["calibration"]
    cal = driver.load_calibration(str(path))
    assert got["measured_here"] is False and got["path"] == str(path) and got["created"] == cal.created
    assert got["engine"]["prefill_tokens_per_s"] == cal.engine.prefill_tokens_per_s != spec.engine.prefill_tokens_per_s


class _ScriptedResets:
    """Engines whose prefix-cache resets answer from a script, one list per try (the last repeats)."""

    def __init__(self, script):
        self.names = ["pod0-prefill", "pod1-decode"]
        self.script = list(script)
        self.tries = 0

    def reset(self):
        self.tries += 1
        return self.script.pop(0) if len(self.script) > 1 else self.script[0]

    def loads(self):
        return [{"unfinished": 0, "kv_usage": 0.1}, {"unfinished": 1, "kv_usage": 0.2}]


@pytest.mark.parametrize("script, quiet, resets, busy, down", [
    ([[True, True]], True, 1, [], []),
    # KV held (a lease, a dead pull) on the prefill engine for two tries, then freed
    ([[False, True], [False, True], [True, True]], True, 3, [], []),
    # a dead engine (no answer) holds nothing a run could meet: no wait for it
    ([[True, None]], True, 1, [], ["pod1-decode"]),
    # still held when the lease is over: not quiet, the busy engine and the loads recorded
    ([[True, False]], False, None, ["pod1-decode"], []),
])
def test_a_run_starts_once_every_engine_accepts_its_reset_and_says_when_it_did_not(script, quiet, resets, busy, down):
    from testbed.engines.pool import Engines

    engines = _ScriptedResets(script)
    start = Engines.quiesce(engines, within_s=0.3, poll_s=0.01)
    assert start["quiet"] is quiet and start["busy"] == busy and start["down"] == down
    assert start["resets"] == engines.tries and (resets is None or start["resets"] == resets)
    if quiet:
        assert "loads" not in start
    else:  # gave up at the limit, not before
        assert start["waited_s"] >= 0.3 and start["resets"] > 2
        assert start["loads"]["pod1-decode"]["unfinished"] == 1


class _BrokenPaths(_FakeEngines):
    """Engines whose KV path checks answer from a script (ok or not, one per check), counting restarts."""

    def __init__(self, topo, script):
        super().__init__(topo)
        self.script = list(script)
        self.restarts = 0

    def kv_paths(self, vocab, timeout_s=10.0):
        ok = self.script.pop(0)
        return {"ok": ok, "broken": [] if ok else ["pod0-prefill->pod2-decode"], "down": [], "check_s": 0.1}

    def restart(self, timeout_s, vocab):
        self.restarts += 1
        return {"restart_s": 1.0, "generation": self.restarts}


def test_a_broken_kv_path_restarts_the_engines_before_the_next_run_and_its_run_says_so(tmp_path, monkeypatch):
    """After a link down a pod's NIXL connections stay failed (docs/testbed.md "A link down"): the run
    after it starts on restarted engines, and its run.json records the check, the broken path and the
    restart; a run on working paths records its check only; paths still broken after a restart stop
    the driver (with one line)."""
    from rich.console import Console

    import testbed.runs.driver as driver
    from core.experiment import build_topology
    from core.spec.model import load_spec
    from testbed.runs.jobs import prepare_jobs

    spec = load_spec(None, default="testbed.yaml").model_copy(update={"faults": []})
    jobs = prepare_jobs([(spec, ["LC"], [0, 1])])
    monkeypatch.setattr(driver, "ray", _FakeRay)
    monkeypatch.setattr(driver, "RouterActor", _fake_router_actor(lambda args, arrival: None))
    monkeypatch.setattr(driver, "console", Console(file=io.StringIO()))
    engines = _BrokenPaths(build_topology(spec), [True, False, True])
    driver._run_jobs(jobs, tmp_path / "out", engines, {"vocab": 2048, "kv_bytes_per_token": 8192}, None, None, {})
    assert engines.restarts == 1 and engines.script == []
    start = {s: json.loads((tmp_path / "out" / spec.name / "LC" / f"seed-{s}" / "run.json").read_text())["start"]
             for s in (0, 1)}
    assert start[0]["kv_paths"]["ok"] is True and "restart" not in start[0]["kv_paths"]
    kv = start[1]["kv_paths"]
    assert kv["broken"] == ["pod0-prefill->pod2-decode"] and kv["restart"]["generation"] == 1
    assert kv["after_restart"]["ok"] is True
    still = _BrokenPaths(build_topology(spec), [False, False])
    with pytest.raises(RuntimeError, match="still broken after restarting"):
        driver._run_jobs(jobs, tmp_path / "out2", still, {"vocab": 2048, "kv_bytes_per_token": 8192}, None, None, {})


def test_the_kv_path_check_names_each_broken_pair_and_leaves_a_dead_engines_pairs_out(monkeypatch):
    import testbed.engines.pool as held
    from testbed.engines.pool import Engines

    engines = type("E", (), {})()
    engines.prefill, engines.decode = ["p0", "p1"], ["d2", "d3"]
    engines.names = ["pod0-prefill", "pod1-prefill", "pod2-decode", "pod3-decode"]
    engines.block_tokens = 128
    # check_pairs answers in (prefill, decode) product order; None: an engine of the pair is dead
    monkeypatch.setattr(held, "check_pairs", lambda p, d, vocab, block, timeout_s: [False, True, None, True])
    kv = Engines.kv_paths(engines, 2048)
    assert kv["ok"] is False and kv["broken"] == ["pod0-prefill->pod2-decode"]
    assert kv["down"] == ["pod1-prefill->pod2-decode"]
    monkeypatch.setattr(held, "check_pairs", lambda p, d, vocab, block, timeout_s: [True, True, None, None])
    assert Engines.kv_paths(engines, 2048)["ok"] is True


def test_engines_with_kv_blocks_of_two_sizes_are_refused_in_one_line():
    from testbed.engines.pool import EnginesNotStarted, kv_block_of

    assert kv_block_of([{"name": "pod0-prefill", "block_tokens": 16}, {"name": "pod1-decode", "block_tokens": 16}]) == 16
    with pytest.raises(EnginesNotStarted, match=r"^the engines report KV blocks of different sizes "
                                                r"\(pod0-prefill: 16, pod1-decode: 128 tokens\)") as e:
        kv_block_of([{"name": "pod0-prefill", "block_tokens": 16}, {"name": "pod1-decode", "block_tokens": 128}])
    assert "\n" not in str(e.value)


def test_a_kind_of_fault_the_injector_does_not_act_on_is_refused_before_any_engine_starts(monkeypatch):
    """A kind of the fault model the testbed's injector has no action for (a new one, before its
    injector exists) is one line naming the fault, not a run that silently leaves it out."""
    import testbed.runs.jobs as jobs_module
    from core.spec.model import load_spec

    spec = load_spec(None, default="testbed.yaml")
    assert [f.kind for f in spec.faults] == ["link"] and jobs_module.prepare_jobs([(spec, ["LC"], [0])])
    monkeypatch.setattr(jobs_module, "INJECTED_KINDS", ("compute", "engine"))  # as if link were the new kind
    with pytest.raises(ValueError, match=r"^twin_link_fault: faults\[0\] is a 'link' fault, which the testbed "
                                         r"does not inject \(it injects compute, engine: testbed/faults/injector.py\)$"):
        jobs_module.prepare_jobs([(spec, ["LC"], [0])])


def test_a_compute_fault_on_gpu_engines_is_refused_before_any_run_where_a_pods_agent_is_not_root():
    """NVML's clock locks need root (testbed/faults/gpu.py), and a CPU quota would not slow a GPU:
    the driver refuses in one line, naming the fault, the pod and the uid, before any run."""
    from core.spec.model import parse_spec
    from builders import shipped_spec_dict
    from testbed.runs.driver import gpu_clock_refusal

    spec = parse_spec({**shipped_spec_dict("testbed.yaml"), "faults": [
        {"kind": "link", "pods": [0], "residual_bw": 0.1, "start_s": 1.0, "duration_s": 2.0, "kv_only": True},
        {"kind": "compute", "pods": [2], "start_s": 1.0, "duration_s": 2.0, "slowdown": 2.0}]})
    why = gpu_clock_refusal([spec], gpu=True, pod_euids=[0, 0, 1000, 0])
    assert why is not None and "\n" not in why
    assert why.startswith(f"{spec.name}: faults[1]: a compute fault on GPU engines locks pod 2's GPU clock")
    assert "pod 2's fault agent runs as uid 1000" in why
    assert gpu_clock_refusal([spec], gpu=True, pod_euids=[1000, 1000, 0, 1000]) is None  # only pod 2 locks clocks
    assert gpu_clock_refusal([spec], gpu=False, pod_euids=[1000] * 4) is None  # CPU engines: a cgroup quota
