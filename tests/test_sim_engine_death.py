"""Engine death in the simulator, from the testbed's fault spec (faults.spec.EngineFault): what the
dead engine held ends as ``error`` in its stage at once, the router stops choosing it by the
testbed's liveness rule (at once when a call on it failed, else at the next check or the first call
to it), and nothing is routed to it after. The same spec on real engines: tests/test_testbed_e2e_cluster.py."""

from __future__ import annotations

import math

import numpy as np
import pytest

from builders import fixed, parse, poisson, shipped_spec_dict
from core.records import read_table
from core.spec.model import SpecError
from faults.schedule import FaultSchedule
from faults.spec import EngineFault
from simulator.run import run_sim

pytestmark = pytest.mark.background  # needs no core of its own: under -n, beside the others (tests/conftest.py)

CHECK_S = 10.0  # testbed.engine_check_s: the liveness period both worlds use


def _spec(faults, rate=2.0, n=120, output=64, **over):
    """The shipped twin cluster (4 by_pod pods of one engine: pods 0-1 prefill, 2-3 decode)."""
    return parse(shipped_spec_dict("testbed.yaml", faults=faults, policies=["LC"], seeds=[0],
                                   workload={"arrival": poisson(rate), "max_requests": n, "duration_s": None,
                                             "prompt": fixed(500), "output": fixed(output)},
                                   testbed={"engine_check_s": CHECK_S}), **over)


def _run(spec, tmp_path):
    d = run_sim(spec, "LC", 0, tmp_path)
    return read_table(d, "requests"), read_table(d, "engines"), read_table(d, "decisions"), read_table(d, "faults")


def test_an_engine_fault_parses_and_is_checked_against_the_topology():
    f = _spec([{"kind": "engine", "pods": [2], "start_s": 5.0, "role": "decode"}]).faults[0]
    assert isinstance(f, EngineFault) and f.process == "core" and f.kills("decode") and not f.kills("prefill")
    assert math.isinf(f.end_s) and f.severity == 0.0
    with pytest.raises(SpecError, match=r"faults\[0\] kills the prefill engines of pod 2, which has none"):
        _spec([{"kind": "engine", "pods": [2], "start_s": 5.0, "role": "prefill"}])
    with pytest.raises(SpecError, match="duration_s"):  # a dead engine stays dead: no duration to give
        _spec([{"kind": "engine", "pods": [2], "start_s": 5.0, "duration_s": 10.0}])
    with pytest.raises(SpecError, match="process"):
        _spec([{"kind": "engine", "pods": [2], "start_s": 5.0, "process": "gpu"}])


def test_an_engine_fault_is_one_apply_that_changes_no_link_or_speed():
    spec = _spec([{"kind": "engine", "pods": [3], "start_s": 5.0},
                  {"kind": "link", "pods": [0], "residual_bw": 0.1, "start_s": 2.0, "duration_s": 10.0}])
    sched = FaultSchedule(spec.faults, 4)
    evs = [(e.time_s, e.event, e.kind, e.pod) for e in sched.events()]
    assert evs == [(2.0, "apply", "link", 0), (5.0, "apply", "engine", 3), (12.0, "clear", "link", 0)]
    steps = sched.steps()
    assert [s.time_s for s in steps] == [2.0, 5.0, 12.0]
    at5 = steps[1]
    assert at5.changed.size == 0 and (at5.slowdown == 1).all() and at5.uplink[3] == 1.0
    assert at5.until_s == 12.0  # the link's end, not the engine fault's (a TTL must stay finite)
    assert not sched.degraded_at(6.0)[3]  # a dead engine is no degradation the labels are made from


@pytest.mark.parametrize("hosted, process", [(False, "core"), (True, "actor")])
def test_a_decode_engine_killed_with_requests_on_it_fails_them_in_their_stages_and_is_seen_at_once(tmp_path, hosted,
                                                                                                    process):
    # a dead core's calls fail once vLLM's front end has shut its client down (core_death_notice_s);
    # a dead actor's at once
    notice = 0.25
    over = {"engine": {"core_death_notice_s": notice, **({"host_cores": 2.0} if hosted else {})}}
    # the kill lands mid-decode of a request on pod 2 (found in the same run without it: the fault
    # changes nothing before it), off the liveness checks' 10 s grid
    before, *_ = _run(_spec([], **over), tmp_path / "before")
    on2 = before[(before.decode_pod == 2) & (before.kv_end_s > 21.0)].iloc[0]
    kill = round((on2.kv_end_s + on2.end_s) / 2, 3)
    assert kill % CHECK_S != 0
    spec = _spec([{"kind": "engine", "pods": [2], "start_s": kill, "role": "decode", "process": process}], **over)
    req, eng, dec, faults = _run(spec, tmp_path / "killed")
    (row,) = eng.itertuples()
    assert (row.worker, row.pod, row.role, row.state) == (2, 2, "decode", "down")
    # its calls in flight failed: the router asked it then
    assert row.time_s == pytest.approx(kill + (notice if process == "core" else 0.0), abs=1e-9)
    assert list(faults.event) == ["apply"] and faults.target.iloc[0] == "pod2.engines"
    err = req[req.outcome == "error"]
    assert len(err) > 0 and (err.decode_pod == 2).all() and (err.routed_s < row.time_s).all()
    assert err.set_index("request_id").failed_stage[on2.request_id] == "decode"
    assert set(err.failed_stage) <= {"decode_queue", "kv_transfer", "decode"}
    # everything else was served, and nothing routed after the death went to pod 2
    assert (req[req.outcome != "error"].outcome == "ok").all()
    assert (dec[dec.time_s >= row.time_s].decode_pod != 2).all()
    # the decode engine on pod 3 took over: it served requests routed after the death
    assert ((req.routed_s > kill) & (req.decode_pod == 3) & (req.outcome == "ok")).sum() > 10


def test_engine_down_s_averages_the_kills_and_engine_core_share_counts_the_cores_among_them(tmp_path):
    from analysis.run.names import Metric as M
    from analysis.run.scalars import run_metrics

    # pod 2's decode core, then pod 0's prefill actor: the mean of the two lags, one of them a core's
    spec = _spec([{"kind": "engine", "pods": [2], "start_s": 21.3, "role": "decode", "process": "core"},
                  {"kind": "engine", "pods": [0], "start_s": 25.0, "role": "prefill", "process": "actor"}])
    d = run_sim(spec, "LC", 0, tmp_path / "both")
    eng = read_table(d, "engines").set_index("pod")
    assert set(eng.index) == {0, 2}
    m = run_metrics(d)
    assert m[M.ENGINE_DOWN_S] == pytest.approx(((eng.time_s[2] - 21.3) + (eng.time_s[0] - 25.0)) / 2)
    assert m[M.ENGINE_CORE_SHARE] == 0.5
    # the actor alone: no core among the kills; no kill: neither
    alone = run_metrics(run_sim(_spec([spec.faults[1].model_dump()]), "LC", 0, tmp_path / "actor"))
    assert alone[M.ENGINE_CORE_SHARE] == 0.0
    assert alone[M.ENGINE_DOWN_S] == pytest.approx(m[M.ENGINE_DOWN_S] * 2 - (eng.time_s[2] - 21.3))
    none = run_metrics(run_sim(_spec([]), "LC", 0, tmp_path / "none"))
    assert math.isnan(none[M.ENGINE_CORE_SHARE]) and math.isnan(none[M.ENGINE_DOWN_S])


def test_an_engine_that_dies_idle_is_seen_at_the_next_check_or_its_first_call(tmp_path):
    # a prefill engine killed at 25 s with nothing on it, requests every ~4 s: LC's next choice of it
    # fails at once (the call raises) unless the check at 30 s comes first
    spec = _spec([{"kind": "engine", "pods": [0], "start_s": 25.0, "role": "prefill"}], rate=0.25, n=20,
                 output=8)
    req, eng, dec, _ = _run(spec, tmp_path)
    (row,) = eng.itertuples()
    assert (row.worker, row.role) == (0, "prefill")
    first_call = dec[(dec.time_s >= 25.0) & (dec.prefill_pod == 0)].time_s.min()
    assert row.time_s == min(30.0, first_call if not np.isnan(first_call) else math.inf)
    err = req[req.outcome == "error"]
    assert (err.prefill_pod == 0).all() and (err.failed_stage == "prefill_queue").all()
    assert len(err) == (dec.time_s.between(25.0, row.time_s) & (dec.prefill_pod == 0)).sum()


def test_a_prefill_engines_death_fails_the_pulls_of_the_kv_it_held(tmp_path):
    # slow links (r = 0.05 of 0.25 Gbit/s: 500-token prompts pull for ~3 s) keep pulls in flight
    spec = _spec([{"kind": "link", "pods": [0], "residual_bw": 0.05, "start_s": 0.0, "duration_s": 60.0},
                  {"kind": "engine", "pods": [0], "start_s": 20.0, "role": "prefill"}], rate=1.0, n=40, output=8)
    req, eng, _, _ = _run(spec, tmp_path)
    err = req[req.outcome == "error"]
    assert (err.prefill_pod == 0).all() and (err.routed_s < 20.0).all()
    assert "kv_transfer" in set(err.failed_stage), err.failed_stage.value_counts()
    assert eng.time_s.tolist() == [20.0]


@pytest.mark.parametrize("hosted", [False, True])
def test_after_a_link_down_heals_its_reads_fail_at_the_disconnect_then_work(tmp_path, hosted):
    """engine.kv_heal_disconnect_s: the KV reads across a link that was down hang on past its heal and
    fail together that long after it (error in kv_transfer), the ones started after the heal too; the
    next reads work. Without it (None) the healed link carries the hung pulls on at once."""
    disconnect = 2.77
    fault = {"kind": "link", "pods": [0], "residual_bw": 0.0, "start_s": 10.0, "duration_s": 20.0, "kv_only": True}
    runs = {}
    for d in (None, disconnect):
        spec = _spec([fault], rate=1.0, n=80, output=8, policies=["Random"],
                     engine={"kv_heal_disconnect_s": d, **({"host_cores": 2.0} if hosted else {})})
        req = read_table(run_sim(spec, "Random", 0, tmp_path / str(d)), "requests")
        runs[d] = req[req.prefill_pod == 0].set_index("request_id")
    healed, after = 30.0, 30.0 + disconnect
    cut = runs[disconnect]
    hung = cut[(cut.kv_start_s >= 10.0) & (cut.kv_start_s < after)]
    assert len(hung) >= 3 and (hung.outcome == "error").all() and (hung.failed_stage == "kv_transfer").all(), hung
    assert (hung.kv_start_s >= healed).any()  # one that started after the heal hung until the disconnect too
    later = cut[cut.kv_start_s >= after]
    assert len(later) > 0 and (later.outcome == "ok").all() and (later.kv_end_s - later.kv_start_s < 1.0).all()
    # the plain model: the same requests, their pulls resumed at the heal
    plain = runs[None].loc[hung.index]
    assert (plain.outcome == "ok").all() and (plain.kv_end_s >= healed).all() and (plain.kv_end_s < after).all()


def test_a_restarted_engine_core_serves_again_once_started_and_seen_up_at_the_next_check(tmp_path):
    """restart_s: the dead decode core is started again 20 s after its kill, serves engine_start_s
    (30 s) later, and the router chooses it again from its next liveness check on (every 10 s)."""
    kill, restart, start = 21.3, 20.0, 30.0
    with pytest.raises(SpecError, match=r"faults\[0\] restarts engines: set engine.engine_start_s"):
        _spec([{"kind": "engine", "pods": [2], "role": "decode", "start_s": kill, "restart_s": restart}])
    with pytest.raises(SpecError, match="restart_s restarts an engine core"):
        _spec([{"kind": "engine", "pods": [2], "role": "decode", "start_s": kill, "restart_s": restart,
                "process": "actor"}], engine={"engine_start_s": start})
    spec = _spec([{"kind": "engine", "pods": [2], "role": "decode", "start_s": kill, "restart_s": restart}],
                 rate=1.0, n=120, output=8, engine={"engine_start_s": start})
    req, eng, dec, faults = _run(spec, tmp_path)
    assert list(zip(faults.event, faults.time_s)) == [("apply", kill), ("clear", kill + restart)]
    down, up = eng[eng.state == "down"].time_s.item(), eng[eng.state == "up"].time_s.item()
    serving = kill + restart + start
    assert kill <= down < kill + CHECK_S and up == math.ceil(serving / CHECK_S) * CHECK_S  # the next check
    to2 = dec[dec.decode_pod == 2].time_s
    assert not to2.between(down, up, inclusive="neither").any() and (to2 >= up).sum() > 5
    assert (req[req.routed_s >= up].outcome == "ok").all()
