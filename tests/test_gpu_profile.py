"""The GPU profile: vLLM's enforce_eager by the engines' device (CUDA graphs on GPUs, eager on the CPU
build) from the spec to every engine, and the shipped GPU cluster spec. No engine or cluster starts."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from builders import parse, shipped_spec_dict
from core.spec.model import load_spec
from testbed.engines.engine import Engine, EngineConfig

REPO = Path(__file__).resolve().parents[1]
GPU_SPEC = REPO / "experiments" / "gpu_cluster.yaml"
HAVE_VLLM = importlib.util.find_spec("vllm") is not None


def _config(tmp_path: Path, **kw: Any) -> EngineConfig:
    return EngineConfig(model=tmp_path / "m", run_dir=tmp_path / "run", name="p0", side_channel_port=5601, **kw)


@pytest.mark.parametrize("gpu, enforce_eager, eager", [
    (False, None, True),  # vLLM's CPU build: no CUDA graphs to gain, and a compiled start is slower
    (True, None, False),  # vLLM's own default on a GPU: torch.compile and CUDA graphs
    (True, True, True),  # an explicit bool wins either way
    (False, False, False),
])
def test_enforce_eager_follows_the_device_unless_the_spec_sets_it(tmp_path, gpu, enforce_eager, eager):
    cfg = _config(tmp_path, gpu=gpu, enforce_eager=enforce_eager)
    assert cfg.eager is eager
    if not HAVE_VLLM:
        pytest.skip("vLLM not installed: the engine arguments are not built")
    args = Engine(cfg).engine_args()  # vLLM's AsyncEngineArgs, built without starting anything
    assert args.enforce_eager is eager


def _engine_configs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, spec: Any) -> list[dict[str, Any]]:
    """What the driver hands each engine actor, with the actor class replaced by a recorder."""
    from testbed.engines import pool as engines

    made: list[dict[str, Any]] = []

    class Recorder:
        @classmethod
        def options(cls, **kw: Any) -> type[Recorder]:
            made.append({"num_gpus": kw["num_gpus"]})
            return cls

        @classmethod
        def remote(cls, cfg: dict[str, Any], net_device: Any, **kw: Any) -> object:
            made[-1].update(cfg)
            return object()

    monkeypatch.setattr(engines, "EngineActor", Recorder)
    engines.Engines(spec, "m", tmp_path / "engines", "netns")
    return made


@pytest.mark.parametrize("testbed, eager", [
    ({}, True),  # the emulated cluster's CPU engines
    ({"gpus_per_engine": 1}, False),  # GPU engines: CUDA graphs
    ({"gpus_per_engine": 1, "enforce_eager": True}, True),
    ({"enforce_eager": False}, False),
])
def test_the_driver_carries_the_spec_setting_to_every_engine(monkeypatch, tmp_path, testbed, eager):
    spec = parse(shipped_spec_dict("testbed.yaml", testbed=testbed))
    configs = _engine_configs(monkeypatch, tmp_path, spec)
    assert len(configs) == spec.topology.pods * spec.topology.workers_per_pod
    for c in configs:
        num_gpus = c.pop("num_gpus")
        assert num_gpus == spec.testbed.gpus_per_engine
        assert c["enforce_eager"] == spec.testbed.enforce_eager
        assert EngineConfig(**c).eager is eager


# --------------------------------------------------------------------------- the shipped GPU spec


def test_the_gpu_spec_asks_for_gpu_engines_with_cuda_graphs(monkeypatch, tmp_path):
    spec = load_spec(GPU_SPEC)
    t = spec.testbed
    assert t.gpus_per_engine == 1 and t.enforce_eager is None and t.transport == "tcp"
    assert len(t.fault_interfaces) > 1 and "eth0" in t.fault_interfaces
    configs = _engine_configs(monkeypatch, tmp_path, spec)
    assert [c.pop("num_gpus") for c in configs] == [1] * spec.topology.pods * spec.topology.workers_per_pod
    assert [EngineConfig(**c).eager for c in configs] == [False] * len(configs)
    # the simulator's KV capacity is the engines' KV cache, as the testbed gives it
    assert spec.engine.decode_kv_tokens == t.kv_cache_bytes // spec.topology.kv_bytes_per_token
    # a link fault on a real node's only NIC must spare Ray's control traffic (testbed doctor's `link faults`)
    assert all(f.kv_only for f in spec.faults if f.kind == "link")


def test_the_gpu_specs_fault_times_out_requests_in_the_simulator(tmp_path):
    """The fault is sized against the first-token limit (the spec's comments): requests that arrive
    before it are served, and some that arrive while it is on time out waiting for their KV."""
    from core.records import read_table
    from simulator.run import run_sim

    spec = load_spec(GPU_SPEC)
    run = run_sim(spec, spec.policies[0].name, spec.seeds[0], tmp_path)
    req = read_table(run, "requests")
    (fault,) = spec.faults
    before = req[req.arrival_s < fault.start_s]
    during = req[(req.arrival_s >= fault.start_s) & (req.arrival_s < fault.end_s)]
    after = req[req.arrival_s >= fault.end_s]
    assert len(before) and (before.outcome == "ok").all()
    assert (during.outcome == "timeout").any() and (during.failed_stage == "kv_transfer").any()
    assert len(after) and (after.outcome == "ok").all()


def test_the_gpu_spec_is_refused_on_the_emulated_cluster_in_one_line():
    """The emulated cluster's pods are nodes without GPUs: the driver refuses before starting an engine."""
    from testbed.runs.pods import discover_pods

    spec = load_spec(GPU_SPEC)
    nodes = [{"Alive": True, "NodeManagerAddress": f"10.77.0.{i + 1}", "NodeID": f"n{i}",
              "Resources": {"CPU": 1.0, **({"head": 1.0} if i == 0 else {f"pod{i - 1}": 1.0})}}
             for i in range(spec.topology.pods + 1)]
    with pytest.raises(ValueError) as e:
        discover_pods(spec, nodes)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("testbed.gpus_per_engine: pod0's node") and "but has 0" in msg


def test_the_gpu_specs_model_directory_is_checked_in_one_line(tmp_path):
    from core.spec.model import parse_spec
    from testbed.runs.launch import prepare_model

    data = shipped_spec_dict(path=GPU_SPEC)
    data["testbed"]["model"] = str(tmp_path / "no-model")
    with pytest.raises(ValueError) as e:
        prepare_model(parse_spec(data))
    assert str(e.value) == f"testbed.model: {tmp_path / 'no-model'} is not a model directory (no config.json)"


@pytest.mark.skipif(importlib.util.find_spec("pynvml") is not None, reason="this node may have NVML")
def test_testbed_doctor_fails_the_gpu_spec_on_a_node_without_gpus(tmp_path):
    from testbed.cluster import preflight as pf

    c = pf.check_gpus(need=load_spec(GPU_SPEC).testbed.gpus_per_engine, dev=tmp_path)  # no /dev/nvidiactl
    assert c.failed and "gpus_per_engine is 1" in c.fix and "\n" not in c.fix
