"""The simulator's host model (simulator/host.py) against answers worked out by hand.

Engines share ``host_cores`` cores; each demands one core while it computes, what its state
demands while it holds or pulls KV or decodes (``host_hold_cores``, ``host_pull_cores``,
``host_decode_cores``), one core for ``host_spin_s`` after, and the rest of the host
``host_background_cores`` all along; past the cores every engine computes at cores / demand of its
speed.
"""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from builders import HAND_ENGINE, faulted_spec_dict, parse, small_spec_dict
from core.records import read_meta, read_table
from core.spec.model import SpecError, parse_spec
from core.topology import GBPS
from simulator.cluster import ClusterSim
from simulator.host import cluster_sim
from simulator.run import run_sim
from workloads.generate import Workload

pytestmark = pytest.mark.background  # needs no core of its own: under -n, beside the others (tests/conftest.py)

KV = 131072  # bytes per token (the spec's default)
# 4 pods of one worker, by_pod: pods 0-1 prefill, 2-3 decode; 1000 prompt tokens a second, 10 ms a
# step (HAND_ENGINE). One KV byte per token: a pull takes microseconds and moves no answer below.
TOPO = {"pods": 4, "workers_per_pod": 1, "placement": "by_pod", "nic_gbps": 8.0, "kv_bytes_per_token": 1}


def _spec(topology=TOPO, **engine):
    return parse(small_spec_dict(engine={**HAND_ENGINE, **engine}, topology=topology, deadline_s=100.0))


def _run(tmp_path, spec, arrivals, prompts, outputs):
    wl = Workload(np.array(arrivals, float), np.array(prompts), np.array(outputs), duration_s=max(arrivals) + 1.0)
    d = run_sim(spec, "LC", 0, tmp_path, workload=wl)
    return d, read_table(d, "requests").sort_values("request_id").reset_index(drop=True)


def test_two_prefill_engines_on_one_core_each_take_twice_their_time(tmp_path):
    # alone 1000 tokens take 1 s; two engines demand 2 cores of 1: each at half speed, both end at 2 s
    _, r = _run(tmp_path, _spec(host_cores=1, host_spin_s=0), [0.0, 0.0], [1000, 1000], [10, 10])
    assert sorted(r.prefill_worker) == [0, 1]  # one prompt on each prefill engine
    assert (r.prefill_end_s - r.prefill_start_s).tolist() == pytest.approx([2.0, 2.0], abs=1e-6)
    # then both decode engines step (the prefill engines stop demanding once their KV is read):
    # 2 demand 1 core, a step takes 10 ms / 0.5, the first token one step after the KV
    assert (r.end_s - r.kv_end_s).tolist() == pytest.approx([10 * 0.02] * 2, abs=1e-6)
    assert (r.first_token_s - r.kv_end_s).tolist() == pytest.approx([0.02] * 2, abs=1e-6)


def test_cores_enough_for_every_engine_change_nothing(tmp_path):
    _, r = _run(tmp_path, _spec(host_cores=2, host_spin_s=0), [0.0, 0.0], [1000, 1000], [10, 10])
    assert (r.prefill_end_s - r.prefill_start_s).tolist() == pytest.approx([1.0, 1.0])
    assert (r.end_s - r.kv_end_s).tolist() == pytest.approx([0.1, 0.1], abs=1e-6)


def test_a_decode_batch_alone_keeps_its_step_time_and_a_spinning_neighbour_halves_it(tmp_path):
    # one request: its prefill engine stops demanding when its KV has been read (no spin): the
    # decode engine is alone on the core, 10 steps of 10 ms
    _, alone = _run(tmp_path / "a", _spec(host_cores=1, host_spin_s=0), [0.0], [1000], [10])
    assert alone.prefill_end_s[0] - alone.prefill_start_s[0] == pytest.approx(1.0)
    assert alone.end_s[0] - alone.kv_end_s[0] == pytest.approx(0.1, abs=1e-6)
    assert alone.first_token_s[0] - alone.kv_end_s[0] == pytest.approx(0.01, abs=1e-6)
    # with the mp executor's 1 s busy-wait after the last call, the prefill engine's worker spins
    # through all 0.2 s of the decode: 2 engines on 1 core, 20 ms a step
    _, spin = _run(tmp_path / "b", _spec(host_cores=1, host_spin_s=1.0), [0.0], [1000], [10])
    assert spin.end_s[0] - spin.kv_end_s[0] == pytest.approx(0.2, abs=1e-6)


def test_a_demand_that_changes_mid_batch_reschedules_the_work_left(tmp_path):
    # A: 1000 tokens (1 s alone) at t=0 on one prefill engine; B: 250 tokens (0.25 s) at t=0.5 on
    # the other, 1 core. From 0.5 both run at half speed: B ends at 0.5 + 0.25 / 0.5 = 1.0, when A
    # has done 0.5 + 0.5 x 0.5 = 0.75 s of its work; alone again, A ends 0.25 s later, at 1.25.
    # (B's pull and one-token decode take microseconds at 1 byte a token and a 1 us step.)
    spec = _spec(host_cores=1, host_spin_s=0, decode_step_base_s=1e-6)
    _, r = _run(tmp_path, spec, [0.0, 0.5], [1000, 250], [1, 1])
    assert r.prefill_worker[0] != r.prefill_worker[1]
    assert r.prefill_end_s[1] == pytest.approx(1.0, abs=1e-5)
    assert r.prefill_end_s[0] == pytest.approx(1.25, abs=1e-5)


@pytest.mark.parametrize("on_abort, prefill_s", [("cancel", 0.1), ("finish", 0.2)])
def test_a_dead_pull_keeps_both_its_engines_demanding(tmp_path, on_abort, prefill_s):
    # 2 pods (pod 0 prefills, pod 1 decodes), pod 0's link at r = 0.01: request 0's pull (1008
    # tokens' KV at 80 Mbit/s, 13.2 s from 1 s) is given up at its 2 s deadline. Cancelled, both
    # engines stop demanding (their 1 s spin ends at 3 s); going on (vLLM's), the prefill engine
    # holds the KV and the decode engine waits for it: 2 engines on 1 core, so request 1's 100
    # tokens at 3.5 s take 0.2 s instead of 0.1.
    topo = {"pods": 2, "workers_per_pod": 1, "placement": "by_pod", "nic_gbps": 8.0, "uplink_gbps": 8.0}
    spec = parse(small_spec_dict(engine={**HAND_ENGINE, "host_cores": 1, "kv_pull_on_abort": on_abort},
                                 topology=topo, deadline_s=2.0,
                                 faults=[{"kind": "link", "pods": [0], "residual_bw": 0.01, "start_s": 0.0,
                                          "duration_s": 1000.0}]))
    assert 1.0 + 1008 * KV / (0.01 * 8.0 * GBPS) > 4.0  # the dead pull still runs through request 1's prefill
    _, r = _run(tmp_path, spec, [0.0, 3.5], [1000, 100], [10, 10])
    assert r.outcome[0] == "timeout" and r.failed_stage[0] == "kv_transfer"
    assert r.prefill_end_s[1] - r.prefill_start_s[1] == pytest.approx(prefill_s)


def test_a_compute_fault_and_the_host_multiply(tmp_path):
    # slowdown 3 on every pod, two prefill engines on one core: 1 s of work x 3 / 0.5 = 6 s
    fault = {"kind": "compute", "pods": [0, 1, 2, 3], "slowdown": 3.0, "start_s": 0.0, "duration_s": 1000.0}
    spec = parse(small_spec_dict(engine={**HAND_ENGINE, "host_cores": 1, "host_spin_s": 0}, topology=TOPO,
                                 deadline_s=100.0, faults=[fault]))
    _, r = _run(tmp_path, spec, [0.0, 0.0], [1000, 1000], [10, 10])
    assert (r.prefill_end_s - r.prefill_start_s).tolist() == pytest.approx([6.0, 6.0], abs=1e-6)


def test_the_run_records_what_the_host_did(tmp_path):
    # the first test's run: both prefills short of a core from 0 to 2 s, then the decodes to 2.2 s
    d, _ = _run(tmp_path, _spec(host_cores=1, host_spin_s=0), [0.0, 0.0], [1000, 1000], [10, 10])
    host = read_meta(d)["sim_host"]
    assert host["cores"] == 1.0 and host["min_factor"] == pytest.approx(0.25)  # 4 engines during the pulls
    assert host["slowed_s"] == pytest.approx(2.2, abs=1e-4)
    assert host["demand_core_s"] == pytest.approx(2 * 2.0 + 2 * 0.2, abs=1e-4)


def test_a_waiting_engine_demands_what_its_state_does(tmp_path):
    # Pod 0's link at r = 0.01: A's pull (1008 tokens' KV, 13 s) hangs from 1 s, its prefill engine
    # holding the KV (3 cores) and its decode engine waiting (2 cores). B's 1000 tokens at 2 s on the
    # other prefill engine: 1 + 3 + 2 = 6 cores demanded of 2, a third of its speed: 3 s, not 1.
    # With one core for each state (the default) it would be 3 of 2: 1.5 s.
    topo = {**TOPO, "kv_bytes_per_token": KV}
    fault = [{"kind": "link", "pods": [0], "residual_bw": 0.01, "start_s": 0.0, "duration_s": 1000.0}]

    def b_prefill(name, **demand):
        spec = parse(small_spec_dict(engine={**HAND_ENGINE, "host_cores": 2, "host_spin_s": 0, **demand},
                                     topology=topo, deadline_s=100.0, faults=fault))
        _, r = _run(tmp_path / name, spec, [0.0, 2.0], [1000, 1000], [10, 10])
        assert r.prefill_pod.tolist() == [0, 1] and r.kv_end_s[0] > 4.0, r  # A still pulls through B's prefill
        return r.prefill_end_s[1] - r.prefill_start_s[1]

    assert b_prefill("measured", host_hold_cores=3.0, host_pull_cores=2.0) == pytest.approx(3.0, abs=1e-6)
    assert b_prefill("default") == pytest.approx(1.5, abs=1e-6)


@pytest.mark.parametrize("process", ["actor", "core"])
def test_a_dead_prefill_engine_demands_nothing_for_the_kv_it_held(tmp_path, process):
    # The waiting engine's scene above, with A's prefill engine (pod 0) killed at 1.5 s: A's pull
    # fails, so from then on pod 0 holds no KV and pod 2 waits for none. B's 1000 tokens at 2 s on
    # pod 1 then demand 1 core of 2: 1 s. Were the dead engine's hold still counted, 1 + 3 of 2: 2 s.
    topo = {**TOPO, "kv_bytes_per_token": KV}
    faults = [{"kind": "link", "pods": [0], "residual_bw": 0.01, "start_s": 0.0, "duration_s": 1000.0},
              {"kind": "engine", "pods": [0], "role": "prefill", "start_s": 1.5, "process": process}]
    spec = parse(small_spec_dict(engine={**HAND_ENGINE, "host_cores": 2, "host_spin_s": 0, "host_hold_cores": 3.0,
                                         "host_pull_cores": 2.0}, topology=topo, deadline_s=100.0, faults=faults))
    _, r = _run(tmp_path, spec, [0.0, 2.0], [1000, 1000], [10, 10])
    assert r.prefill_pod.tolist() == [0, 1] and r.outcome.tolist() == ["error", "ok"], r
    assert r.failed_stage[0] == "kv_transfer"
    assert r.prefill_end_s[1] - r.prefill_start_s[1] == pytest.approx(1.0, abs=1e-6)


def test_a_decoding_engine_and_the_background_demand_their_own(tmp_path):
    # 2 cores, the rest of the host demanding 2 all along: a prefill alone demands 1 + 2 = 3, so
    # 1000 tokens take 1.5 s; then its decode engine decoding demands 4: 4 + 2 = 6, a step of 10 ms
    # takes 30 ms (its prefill engine has stopped: its KV was read, no spin)
    spec = _spec(host_cores=2, host_spin_s=0, host_background_cores=2.0, host_decode_cores=4.0)
    d, r = _run(tmp_path, spec, [0.0], [1000], [10])
    assert r.prefill_end_s[0] - r.prefill_start_s[0] == pytest.approx(1.5, abs=1e-6)
    assert r.end_s[0] - r.kv_end_s[0] == pytest.approx(10 * 0.03, abs=1e-6)
    host = read_meta(d)["sim_host"]
    assert host["background_cores"] == 2.0 and host["decode_cores"] == 4.0
    # the engines' own core-seconds: 1 over the prefill's 1.5 s, 4 over the decode's 0.3 s
    assert host["demand_core_s"] == pytest.approx(1.5 + 4 * 0.3, abs=1e-4)


def test_a_background_beyond_the_host_slows_even_the_first_batch(tmp_path):
    # the rest of the host demands 3 of 2 cores before any engine starts: 1000 tokens at 2 / 4
    _, r = _run(tmp_path, _spec(host_cores=2, host_spin_s=0, host_background_cores=3.0), [0.0], [1000], [1])
    assert r.prefill_end_s[0] - r.prefill_start_s[0] == pytest.approx(2.0, abs=1e-6)


# --- without a shared host: the model as it was ---------------------------------------------


def _tables(run_dir: Path) -> dict[str, pd.DataFrame]:
    return {p.name: pd.read_parquet(p).drop(columns=["latency_s"], errors="ignore")  # latency_s: wall clock
            for p in sorted(Path(run_dir).glob("*.parquet"))}


def test_without_host_cores_the_run_is_the_plain_model(tmp_path):
    spec = parse(faulted_spec_dict())
    assert spec.engine.host_cores is None
    import simpy

    from core.experiment import build_topology
    from core.run import RunContext

    with RunContext(spec, "sim", "LC", 0, tmp_path / "x", build_topology(spec), {}) as ctx:
        sim = cluster_sim(simpy.Environment(), ctx, spec.engine, Workload(np.zeros(0), np.zeros(0, int),
                                                                          np.zeros(0, int), 0.0), 10.0, 1)
    assert type(sim) is ClusterSim


@pytest.mark.parametrize("on_abort", ["cancel", "finish"])
def test_a_host_that_never_runs_short_leaves_every_record_as_it_was(tmp_path, on_abort):
    # the faulted spec (a throttled link, deadlines, dead pulls, labels, prices): 16 engines on
    # 10^6 cores never run short, so the hosted model must write the plain model's records exactly
    plain = parse(faulted_spec_dict(engine={"kv_pull_on_abort": on_abort}))
    hosted = parse(faulted_spec_dict(engine={"kv_pull_on_abort": on_abort, "host_cores": 1e6}))
    a = run_sim(plain, "FaultAwareOTF-R", 0, tmp_path / "plain")
    b = run_sim(hosted, "FaultAwareOTF-R", 0, tmp_path / "hosted")
    assert read_meta(b)["sim_host"]["slowed_s"] == 0.0 and read_meta(b)["sim_host"]["demand_core_s"] > 0
    ta, tb = _tables(a), _tables(b)
    assert ta.keys() == tb.keys() and len(ta["requests.parquet"]) > 100
    assert (ta["requests.parquet"].outcome == "timeout").any()  # the fault's path is taken
    for name in ta:
        pd.testing.assert_frame_equal(ta[name], tb[name], obj=name)


def test_a_shared_host_only_ever_lengthens_a_prefill(tmp_path):
    # the faulted spec on 4 cores for its 16 engines: no prefill ends before its alone time, some after
    spec = parse(faulted_spec_dict(engine={"host_cores": 4}))
    d = run_sim(spec, "FaultAwareOTF-R", 0, tmp_path)
    r = read_table(d, "requests").dropna(subset=["prefill_end_s"])
    assert isinstance(read_meta(d)["sim_host"], dict)
    # each batch's tokens are unknown here, but a request's prefill is at least its own prompt's time
    alone = spec.engine.prefill_overhead_s + r.prompt_tokens / spec.engine.prefill_tokens_per_s
    took = r.prefill_end_s - r.prefill_start_s
    assert (took >= alone * (1 - 1e-9)).all()
    assert read_meta(d)["sim_host"]["slowed_s"] > 0


# --- the spec -------------------------------------------------------------------------------


@pytest.mark.parametrize("field, value, message", [
    ("host_cores", 0, "greater than 0"),
    ("host_cores", -2, "greater than 0"),
    ("host_cores", float("inf"), "finite number"),
    ("host_cores", True, "host_cores is a number of cores (e.g. 2) or null, not true"),
    ("host_engine_cores", 0, "greater than 0"),
    ("host_spin_s", -1, "greater than or equal to 0"),
    ("host_hold_cores", 0, "greater than 0"),
    ("host_pull_cores", float("nan"), "finite number"),
    ("host_decode_cores", -1, "greater than 0"),
    ("host_background_cores", -0.5, "greater than or equal to 0"),
])
def test_bad_host_settings_are_one_line_errors_naming_the_field(field, value, message):
    data = small_spec_dict(engine={field: value})
    with pytest.raises(SpecError) as e:
        parse_spec(data, "s.yaml")
    text = str(e.value)
    assert "\n" not in text and f"engine.{field}" in text and message in text


def test_host_defaults_are_the_gpu_profile_and_the_uni_executors_spin():
    from core.host_model import MP_WORKER_SPIN_S, worker_spin_s

    spec = parse(small_spec_dict())
    e = spec.engine
    # no worker process spins with the testbed's default executor
    assert (e.host_cores, e.host_engine_cores, e.host_spin_s) == (None, 1.0, 0.0)
    assert spec.testbed.executor == "uni" and worker_spin_s("uni") == e.host_spin_s
    assert worker_spin_s("mp") == MP_WORKER_SPIN_S == 1.0
    # one thread for each state, nothing else on the host: the model before demand was measured
    assert (e.host_hold_cores, e.host_pull_cores, e.host_decode_cores, e.host_background_cores) == (1.0, 1.0, 1.0, 0.0)


# --- the calibration's host ------------------------------------------------------------------


def _fit(*coef):
    from core.calibration.fit import LinearFit

    return LinearFit(np.array(coef, float), 1.0, 10, 0, 0.0, 0.0)


def _calibration(host):
    from core.calibration.fit import calibration_from_fits

    return calibration_from_fits(
        created="2026-11-25T00:00:00+00:00", source={"model": "tiny"}, prefill=_fit(0.0, 1 / 4000.0),
        decode=_fit(0.009, 5e-5, 1e-6), pull=_fit(0.003, 1.05), unshaped=_fit(0.003, 1 / 0.45e9),
        kv_bytes_per_token=8192, kv_block_tokens=128, decode_kv_tokens=32768, handshake_s=[], noise={},
        samples={}, host=host)


@pytest.mark.parametrize("cores, engines, gpus, shared", [
    (2.0, 4, 0, True),  # the emulated testbed: 4 CPU engines on 2 cores
    (4.0, 4, 0, False),  # a core each: nothing to share
    (2.0, 4, 1, False),  # GPU engines compute on their own devices
])
def test_the_calibration_shares_the_host_only_where_cpu_engines_outnumber_its_cores(tmp_path, cores, engines,
                                                                                     gpus, shared):
    from core.calibration.fit import HostCalibration, apply_calibration, load_calibration, save_calibration
    from core.host_model import host_shared

    assert host_shared(cores, engines, gpus) is shared
    host = HostCalibration(cores=cores, engines=engines, hosts=1, gpus_per_engine=gpus, shared=shared,
                           concurrent={"all_prefill_hang_slowdown": 1.4})
    cal = load_calibration(save_calibration(_calibration(host), tmp_path / "calibration.json"))
    assert cal.host == host
    spec = parse(small_spec_dict(engine={"host_cores": 8}))  # what the measurement replaces
    assert apply_calibration(spec, cal).engine.host_cores == (cores if shared else None)


@pytest.mark.parametrize("shared", [True, False])
def test_the_measured_demand_by_state_becomes_the_simulators_where_the_host_is_shared(tmp_path, shared):
    from core.calibration.fit import HostCalibration, apply_calibration, load_calibration, save_calibration

    demand = {"hold": 2.8, "pull": 3.0, "background": 0.8}  # decode not measured: the spec's stands
    host = HostCalibration(cores=2.0, engines=4, hosts=1, gpus_per_engine=0 if shared else 1, shared=shared,
                           demand=demand, spin_s=1.0)  # engines that ran the mp executor
    cal = load_calibration(save_calibration(_calibration(host), tmp_path / "calibration.json"))
    assert cal.host.demand == demand and cal.host.spin_s == 1.0
    e = apply_calibration(parse(small_spec_dict(engine={"host_decode_cores": 1.5})), cal).engine
    got = (e.host_hold_cores, e.host_pull_cores, e.host_background_cores, e.host_decode_cores, e.host_spin_s)
    # not shared (GPU engines): the host model is off, and its demand left as the spec has it
    assert got == ((2.8, 3.0, 0.8, 1.5, 1.0) if shared else (1.0, 1.0, 0.0, 1.5, 0.0))
    # a file from before the spin was recorded leaves the spec's
    old = HostCalibration(cores=2.0, engines=4, hosts=1, gpus_per_engine=0, shared=True)
    assert old.spin_s is None
    assert apply_calibration(parse(small_spec_dict(engine={"host_spin_s": 0.5})),
                             _calibration(old)).engine.host_spin_s == 0.5
    assert e.host_cores == (2.0 if shared else None)


def test_the_demand_by_state_is_each_states_median_against_the_computing_engine():
    from testbed.calibration.calibrate import demand_of
    from vocab import DEMAND_STATES

    hold, pull, bg = (DEMAND_STATES.index(x) for x in ("hold", "pull", "background"))
    # (repeat, state, cores / the computing engine's), per interval of three windows, the last without the pull's
    rows = [[0, hold, 3.0], [0, bg, 0.6], [0, pull, 2.0], [0, hold, 2.0],
            [1, hold, 2.5], [1, bg, 0.5], [1, pull, 3.0],
            [2, hold, 2.5], [2, bg, 1.0]]
    # in cores of a computing engine (1.5 here): the median ratio times it; decode never measured
    assert demand_of(rows, 1.5) == pytest.approx({"hold": 2.5 * 1.5, "pull": 2.5 * 1.5, "background": 0.6 * 1.5})
    assert demand_of([], 1.0) == {}


def test_a_calibration_from_before_the_host_was_measured_keeps_the_specs_host(tmp_path):
    import json

    from core.calibration.fit import apply_calibration, load_calibration, save_calibration

    path = save_calibration(_calibration(None), tmp_path / "calibration.json")
    data = json.loads(path.read_text())
    del data["host"]  # as files written before it had the field
    path.write_text(json.dumps(data))
    cal = load_calibration(path)
    assert cal.host is None
    assert apply_calibration(parse(small_spec_dict()), cal).engine.host_cores is None
    assert apply_calibration(parse(small_spec_dict(engine={"host_cores": 2})), cal).engine.host_cores == 2.0


@pytest.mark.parametrize("key, value, where", [
    ("cores", 0, "host.cores"),
    ("demand", {"hold": -1.0}, "host.demand"),
    ("demand", {"pull": 0.0}, "host.demand"),
    ("demand", {"spin": 1.0}, "host.demand.spin"),  # not a state the model has
])
def test_a_bad_host_entry_is_one_line(tmp_path, key, value, where):
    import json

    from core.calibration.fit import CalibrationError, HostCalibration, load_calibration, save_calibration

    host = HostCalibration(cores=2, engines=4, hosts=1, gpus_per_engine=0, shared=True)
    path = save_calibration(_calibration(host), tmp_path / "calibration.json")
    data = json.loads(path.read_text())
    data["host"][key] = value
    path.write_text(json.dumps(data))
    with pytest.raises(CalibrationError) as e:
        load_calibration(path)
    assert "\n" not in str(e.value) and where in str(e.value)


@pytest.mark.parametrize("cores, demand, speed", [(2.0, 1.0, 1.0), (2.0, 2.0, 1.0), (2.0, 3.0, 2 / 3),
                                                  (2.0, 4.0, 0.5), (1.0, 0.0, 1.0)])
def test_the_host_leaves_each_engine_cores_over_demand(cores, demand, speed):
    from core.host_model import host_speed

    assert host_speed(cores, demand) == pytest.approx(speed)
