"""The shared cluster's jobs on a throttled link, end to end on real engines (tests/e2e_cluster.py):
the fault and its labels, each request's host-stall mark, the calibration and the simulator as
its twin, retries away from the link, and the circuit breaker. Slow."""

import math

import pandas as pd
import pytest

pytest.importorskip("vllm", reason="vLLM's CPU build is not installed (the README's install command installs it)")
pytest.importorskip("ray", reason="Ray is not installed (the README's install command installs it)")

from core.records import read_meta, read_table  # noqa: E402
from core.spec.model import parse_spec  # noqa: E402
from e2e_cluster import (BREAKER, BREAKER_FAULT_S, FAST_BASELINE_GBPS, FAST_FACTORS, RETRY_TTFT_S,  # noqa: E402
                         SLOW_PORT_BPS)

pytestmark = [pytest.mark.slow, pytest.mark.e2e]  # the shared cluster (tests/e2e_cluster.py)


def test_a_throttled_link_times_requests_out_in_kv_transfer_with_faults_and_labels_recorded(testbed_runs):
    out = testbed_runs[0]
    d = out / "e2e_link_fault" / "Random" / "seed-0"
    assert read_meta(d)["status"] == "finished"
    req = read_table(d, "requests")
    faults = read_table(d, "faults")
    applied_s = faults[faults.event == "apply"].time_s.min()
    crossed = req[(req.prefill_pod == 0) & (req.kv_start_s > applied_s)]
    # Random routes blindly: every request that pulled KV across the throttled link (KV leaves
    # its prefill pod, pod 0) failed, as a timeout in the kv_transfer stage.
    assert len(crossed) > 0, req
    assert (crossed.outcome == "timeout").all() and (crossed.failed_stage == "kv_transfer").all(), crossed
    # Nothing failed in any other way. (On 2 cores a pending pull costs its engines CPU and
    # a co-located engine can miss the deadline too: such a request is a timeout as well.)
    assert set(req.outcome) <= {"ok", "timeout"}
    # Dead work: vLLM cannot cancel the reads; each given-up pull was watched to its end. At 2 Mbit/s
    # a 5 MB pull takes about 21 s, twice the deadline: the ones that ended moved bytes after it.
    dead = read_table(d, "dead_pulls")
    in_kv = req[(req.outcome == "timeout") & (req.failed_stage == "kv_transfer")]
    assert sorted(dead.request_id) == sorted(in_kv.request_id), (dead, in_kv)
    done = dead[dead.ending == "done"]
    assert len(done) > 0 and (done.end_s > done.given_up_s).all(), dead
    assert ((done.bytes_after > 0) & (done.bytes_after <= done.kv_bytes)).all(), dead
    # A 21 s pull outlives the KV lease (deadline + 10 s): the prefill engine may free its KV while it
    # is read. The lease outlives the deadline, so only requests already given up after their
    # prefill can be behind an expiry, and their output is never served. The counters are the
    # engines', over the run: a lease given up in an earlier run on the same engines expires up to
    # the lease after it, so it can count in this one (CI, 2026-11-25: 3 expiries against 2 given
    # up here, one from e2e_deadline, whose slow decodes are given up after their prefill).
    from analysis.run.scalars import run_metrics

    def given_up_after_prefill(r: pd.DataFrame) -> int:
        return int(((r.outcome != "ok") & r.prefill_end_s.notna()).sum())

    m = run_metrics(d)
    earlier = [*out.glob("e2e_policies/*/seed-0"), out / "e2e_deadline" / "LC" / "seed-0"]
    given_up = given_up_after_prefill(req) + sum(given_up_after_prefill(read_table(e, "requests")) for e in earlier)
    assert 0 <= m["kv_leases_expired"] <= given_up and m["kv_reads_after_expiry"] >= 0, (m["kv_leases_expired"], given_up)
    for event in ("apply", "clear"):
        rows = faults[faults.event == event]
        assert set(rows.target) == {"pod0:eth0/egress", "pod0:eth0/ingress"}, faults
        assert (rows.pod == 0).all() and (rows.severity == 0.008).all()
    applied = faults[faults.event == "apply"]
    # measured from the shaped class's counters while the agents' load offered 1.5x the limit
    assert ((applied.measured_bps - 2e6).abs() < 0.10 * 2e6).all(), applied
    assert (faults[faults.event == "clear"].measured == 1.0).all(), faults
    assert faults[faults.event == "apply"].time_s.max() < 3.0  # applied at its offset (0 s) + measuring
    health = read_table(d, "health")
    pod0 = health[health.pod == 0]
    assert pod0.truth_degraded.any() and pod0.unhealthy.any(), health
    first_label = pod0[pod0.unhealthy].time_s.min()
    first_truth = pod0[pod0.truth_degraded].time_s.min()
    assert first_label >= first_truth + 2.0 - 1e-6  # the label model's detection delay, on the wall clock
    assert not health[health.pod == 1].truth_degraded.any()
    prices = read_table(d, "prices")
    # direct telemetry: the measured rate reaches the risk price's bandwidth term
    assert prices[prices.pod == 0].bw_term.max() > 0.99 and prices[prices.pod == 1].bw_term.max() < 0.01


def test_link_faults_at_a_10_gbit_baseline_are_read_from_what_the_links_carried(testbed_runs):
    """r = 0.2, 0.05 and 0.01 of a 10 Gbit/s baseline in turn on pods 0 and 1, both directions
    (tests/e2e_cluster.py fast_link_spec): each recorded as the bytes the kernel counted under the
    agents' load, within 10% of r, r = 0.2 included (2 Gbit/s: the probe's offer was capped there
    before). Pod 1's switch port, held at 1 Gbit/s meanwhile, lets its downlink carry 0.1 of the
    baseline under r = 0.2: recorded as 0.1, what the link carried, not the 0.2 its shaping allows."""
    d = testbed_runs[0] / "e2e_fast_link" / "LC" / "seed-0"
    assert read_meta(d)["status"] == "finished"
    faults = read_table(d, "faults")
    applied = faults[faults.event == "apply"]
    baseline_bps = FAST_BASELINE_GBPS * 1e9
    assert sorted(zip(applied.pod, applied.severity)) == sorted((p, r) for r in FAST_FACTORS for p in (0, 1)
                                                                for _ in ("egress", "ingress")), applied
    for row in applied.itertuples():
        assert row.target in (f"pod{row.pod}:eth0/egress", f"pod{row.pod}:eth0/ingress"), row
        slow = row.target == "pod1:eth0/ingress" and row.severity * baseline_bps > SLOW_PORT_BPS
        want = SLOW_PORT_BPS / baseline_bps if slow else row.severity
        assert abs(row.measured / want - 1) < 0.10, (row.target, row.severity, row.measured, want)
    # each pod's last clear: the load gets through at 1.5x its last limit or more, and the row reads 1
    last = faults[(faults.event == "clear") & (faults.severity == FAST_FACTORS[-1])]
    assert len(last) == 4 and (last.measured == 1.0).all(), last


def test_every_engine_accounts_for_its_cpu_and_each_request_is_marked_for_host_stall(testbed_runs):
    """The throttled run's host table (testbed/engines/hoststats.py): every engine's cumulative CPU and
    run-queue wait, sampled through the run on its own node, and from it each request's mark
    (analysis/run/host_stall.py), in the run's metrics and the report's host_marks.csv."""
    from analysis.run.host_stall import run_host_marks
    from analysis.run.scalars import run_metrics
    from analysis.run.report import report

    out = testbed_runs[0]
    d = out / "e2e_link_fault" / "Random" / "seed-0"
    req = read_table(d, "requests")
    host = read_table(d, "host")
    assert set(host.worker) == {0, 1, 2, 3} and set(zip(host.worker, host.pod)) == {(0, 0), (1, 1), (2, 2), (3, 3)}
    assert set(host[host.worker < 2].role) == {"prefill"} and set(host[host.worker >= 2].role) == {"decode"}
    for w, g in host.groupby("worker"):
        g = g.sort_values("time_s")
        gaps = g.time_s.diff().dropna()
        assert g.time_s.min() < 1.0 and g.time_s.max() >= req.routed_s.max(), (w, g.time_s.describe())
        assert gaps.median() == pytest.approx(0.5, abs=0.15)  # EngineConfig.host_sample_s
        for col in ("cpu_s", "wait_s", "pressure_s", "busy_s", "steal_s", "lost_wakeup_s"):
            assert (g[col].diff().dropna() >= -1e-9).all(), (w, col)  # cumulative counters
        # an engine with requests ran on a CPU during the run; the node was busy
        assert g.cpu_s.iloc[-1] > g.cpu_s.iloc[0] and g.busy_s.iloc[-1] > g.busy_s.iloc[0]
    meta, faults = read_meta(d), read_table(d, "faults")
    marks = run_host_marks(req, host, meta, faults)
    assert marks.host_stalled.notna().all() and marks.host_pressure.between(0, 1.05).all(), marks
    assert (marks.host_cpu_s >= 0).all() and (marks.host_cpu_s > 0).any(), marks
    # a prefill at its engine's speed (testbed.yaml: 4100 tokens/s) is never marked, whatever the
    # host, unless its engines lost time to missed wake-ups; a prefill given up has a lower bound
    ran = req.prefill_end_s.notna() | (req.prefill_start_s.notna() & (req.outcome == "timeout"))
    assert (marks.prefill_slowdown[ran] > 0).all() and marks.prefill_slowdown[~ran].isna().all()
    assert (marks.host_lost_wakeup_s >= 0).all(), marks
    stalled = marks.host_stalled.astype(bool)
    assert (stalled <= (((marks.prefill_slowdown >= 2.0) & (marks.host_pressure >= 0.5))
                        | (marks.host_lost_wakeup_s > 0))).all(), marks
    m = run_metrics(d)
    assert m["host_stalled_share"] == pytest.approx(stalled.mean())
    rest = req[~stalled.to_numpy()]
    assert (math.isnan(m["failure_rate_unstalled"]) and rest.empty) or \
        m["failure_rate_unstalled"] == pytest.approx((rest.outcome != "ok").mean())
    rep = out / "report_host"
    report([d], rep)
    csv = pd.read_csv(rep / "host_marks.csv")
    assert len(csv) == len(req) and set(csv.request_id) == set(req.request_id)


def test_calibration_measures_the_engines_and_links_and_the_simulator_twins_the_fault(testbed_runs, tmp_path):
    from analysis.compare.console import compare
    from analysis.rule.verdict import ONE_SEED
    from core.calibration.fit import apply_calibration, load_calibration
    from simulator.run import run_sim

    out, _, _, throttled, _ = testbed_runs
    cal = load_calibration(out / "calibration.json")  # validated as the simulator reads it
    fits = cal.fits
    assert fits["prefill"].n >= 15 and fits["decode_step"].n >= 8 and fits["kv_pull_shaped"].n >= 8
    # The shaped pulls (NIXL's own transfer times) follow bytes / rate (htb is exact: docs/verified.md
    # "Pull time against a shaped rate"), with a few % of headers; the first pull after each of the
    # 4 rate changes is kept apart.
    assert fits["kv_pull_shaped"].r2 > 0.95
    assert cal.noise["rate_change_n"] == 4 and cal.noise["rate_change_wire_ratio_p50"] >= 0.95
    assert len(cal.samples["pull_shaped_bytes_bps_nixl_s_stage_s"]) == fits["kv_pull_shaped"].n
    assert 1.0 <= cal.network.kv_wire_overhead < 1.15
    assert cal.network.kv_bytes_per_token == 8192 and cal.engine.kv_block_tokens == 128
    # Unshaped, UCX over the veth moves more than the link's baseline (what a fault's r is relative
    # to), so a shaped link is the shaper's rate, not UCX's. Measured 0.9 to 3.6 Gbit/s on 2 cores,
    # with the host's load (CI, 2026-11-25: 0.90), against 0.25.
    assert cal.network.unshaped_gbps > throttled.topology.link_baseline_gbps
    # The fits describe these engines: on the healthy runs' quiet requests, measured in this same
    # session, each stage's median residual lies within a factor of 2 (per run, -39% to +29% in two
    # suites on 2026-11-27: docs/twin.md "Calibration checked against the run"). Not the shipped spec's speeds:
    # this machine's engines calibrate 3-4.5x faster than them (decode step base 2.0-3.6 ms against
    # 9.1, prefill 11,100-14,900 tokens/s against 4,100, six calibrations on 2026-11-27), and a
    # suite at 830c35c failed a 4x bound on them with 2.24 ms.
    from analysis.checks.calibration import CHECKED, FITS, LEGS, quiet_residuals
    from analysis.checks.refit import fit_run_conditions
    from analysis.run.data import load_run

    runs = sorted((out / "e2e_policies").glob("*/seed-*"))
    res = pd.concat([quiet_residuals(load_run(d), cal) for d in runs])
    medians = res[res["stage"].isin(FITS)].groupby("stage")["rel_residual"].median()
    assert set(medians.index) == set(FITS), medians
    assert medians.between(-0.5, 1.0).all(), medians
    # Under the run's conditions: the levels and the control path's legs fitted on half of these
    # runs (analysis/checks/refit.py) carry to the other half, which they were not fitted on.
    # The engine models within half (one run's median moved by up to 34% on a loaded host,
    # docs/twin.md). The legs in absolute terms, within one decode step: an engine admits a call at
    # its next scheduler step, so a leg is 0 to 1 step long and its relative miss can be anything
    # (decode_call read 2-3 ms for some policies and 6-9 ms for others against a 7.6 ms step, -55%
    # once with nothing else running). Rule fixed before the next run, at the commit that says so.
    # The KV pull likewise: both its ends are seen at the decode engine's scheduler steps (the pull's
    # start at the step that allocates its blocks, its end at the step that reports it received,
    # testbed/engines/vllm_hooks.py), so a pull of 18-29 ms is read to within a step of 13-23 ms; its
    # relative miss went to +0.53 on a CPU without AVX-512 (71f27c2; misses of 1.7-9.4 ms in seven suites,
    # docs/history/2026-11-30-ci-8e18f6f.md). Changed after those runs: the suites since judge it.
    fitted = fit_run_conditions(runs[::2], cal)
    held = pd.concat([quiet_residuals(load_run(d), fitted) for d in runs[1::2]])
    rel = held.groupby("stage")["rel_residual"].median()
    engines = [s for s in FITS if s != "kv_pull"]
    assert set(rel.index) == set(CHECKED) and rel[engines].abs().max() < 0.5, rel
    miss_s = (held["predicted_s"] - held["measured_s"]).groupby(held["stage"]).median()
    step = fitted.engine.decode_step_base_s
    assert miss_s[list(LEGS) + ["kv_pull"]].abs().max() <= step, (miss_s, step)
    assert cal.noise["n_steps"] > 100 and len(cal.handshake_s) == 4  # every (prefill, decode) pair warmed
    # every run on these engines records it (its host-stall marks hold prefills against these speeds):
    # measured by the command that ran the healthy jobs, given to the one that ran the throttled job
    for run, here in ((out / "e2e_policies" / "LC" / "seed-0", True),
                      (out / "e2e_link_fault" / "Random" / "seed-0", False)):
        recorded = read_meta(run)["calibration"]
        assert recorded["measured_here"] is here and recorded["engine"] == cal.engine.model_dump(mode="json"), run
    # Demand by state, measured while a pull hangs (2 prefill and 2 decode engines on one host: all
    # four measured); what a waiting engine demands is a share of the CPU, never nothing
    demand = cal.host.demand
    assert set(demand) == {"hold", "pull", "decode", "background"}, cal.host
    assert all(v > 0 for k, v in demand.items() if k != "background") and demand["background"] >= 0
    assert len(cal.samples["host_demand_repeat_state_ratio"]) >= 4 and cal.host.concurrent["demand_window_s"] > 0
    calibrated = apply_calibration(throttled, cal)
    assert calibrated.engine.host_cores == cal.host.cores and calibrated.engine.host_pull_cores == demand["pull"]
    # the engines ran the uni executor: no worker spins after a call, in either world
    assert throttled.testbed.executor == "uni" and cal.host.spin_s == calibrated.engine.host_spin_s == 0.0
    # The twin: the same spec in the calibrated simulator; requests pulled from pod 0 during the
    # fault time out in kv_transfer there too, and the comparison agrees on what the fault decides:
    # the failure rate and the requests' outcomes, one by one (one seed: shown, not decided).
    sim_dir = run_sim(calibrated, "Random", 0, tmp_path / "sim")
    sim = read_table(sim_dir, "requests")
    hit = sim[(sim.prefill_pod == 0) & (sim.kv_start_s > 0.5)]
    assert len(hit) > 0 and (hit.outcome == "timeout").all() and (hit.failed_stage == "kv_transfer").all()
    fid = compare([sim_dir], [out / "e2e_link_fault" / "Random" / "seed-0"], tmp_path / "fidelity",
                  cal.model_dump())
    # one seed decides nothing (analysis/rule/verdict.py); what the fault decides lies inside the tolerance:
    # the failure rate within 3 points, at most 3% of the requests ended differently
    checks = fid.table.set_index("metric")
    assert (checks["verdict"] == "undecided").all() and (checks["why"].isin([ONE_SEED, "no value"])).all()
    assert abs(checks.loc["failure_rate", "deviation"]) <= 0.03 and checks.loc["outcome_agreement", "deviation"] <= 0.03, \
        fid.table.to_string()
    assert (tmp_path / "fidelity" / "fidelity.csv").exists()
    # the run's own demand by state beside the calibration's
    states = fid.host_demand[fid.host_demand.policy == "all"].set_index("state")
    assert states.loc["pull", "calibration_cores"] == demand["pull"] and (tmp_path / "fidelity" / "host_demand.csv").exists()


def test_a_retry_takes_an_attempt_stuck_on_the_throttled_link_to_another_pair(testbed_runs):
    from core.stages import blamed_pods

    d = testbed_runs[0] / "e2e_retry" / "Random" / "seed-0"
    assert read_meta(d)["status"] == "finished"
    req = read_table(d, "requests").set_index("request_id")
    att = read_table(d, "attempts")
    # Random sends some first attempts across pod 0's throttled link: given up at their per-try limit
    # in kv_transfer
    stuck = att[(att.prefill_pod == 0) & (att.failed_stage == "kv_transfer")]
    assert len(stuck) > 0, (att, req)
    assert ((att.end_s - att.routed_s) > RETRY_TTFT_S - 0.1).all() and (att.outcome == "timeout").all(), att
    # each retried request's record is its last attempt's, routed after the backoff and, in each
    # role, away from every pod its given-up attempts were blamed on while a pod of that role was
    # left unblamed (4 pods by_pod: prefill on pods 0-1, decode on 2-3)
    for rid, rows in att.groupby("request_id"):
        last = req.loc[rid]
        assert last.attempts == len(rows) + 1
        assert last.routed_s >= rows.end_s.max()
        blamed = {p for r in rows.itertuples() for p in blamed_pods(r.failed_stage, r.prefill_pod, r.decode_pod)}
        for pod, role in ((last.prefill_pod, {0, 1}), (last.decode_pod, {2, 3})):
            assert pod not in blamed or role <= blamed, (rows, last)
    # Whether a stuck request was then rescued is not asserted: the blamed-pod rule above already
    # takes each retry off the throttled link, and what becomes of it on the healthy pair is that
    # pair's (on 2 cores an engine's stall can lose it there: docs/router-options.md "Retries").
    # the given-up attempts' pulls went on (vLLM cannot cancel them) and were recorded as theirs
    dead = read_table(d, "dead_pulls")
    assert set(zip(stuck.request_id, stuck.attempt)) <= set(zip(dead.request_id, dead.attempt)), (dead, stuck)


def _breaker_state(br: pd.DataFrame, pod: int, t: float) -> str:
    """Pod `pod`'s breaker state as a decision at `t` saw it."""
    from core.breaker import CLOSED

    before = br[(br.pod == pod) & (br.time_s <= t)]  # a half-opening due is ticked by the routing itself
    return before.state.iloc[-1] if len(before) else CLOSED


def test_the_circuit_breaker_keeps_a_pod_out_while_its_link_fails_and_lets_it_back_once_healed(testbed_runs, tmp_path):
    from analysis.run.host_stall import timed_out_at
    from analysis.run.scalars import run_metrics
    from core.breaker import CLOSED, HALF_OPEN, OPEN
    from simulator.run import run_sim

    d = testbed_runs[0] / "e2e_breaker" / "Random" / "seed-0"
    meta = read_meta(d)
    assert meta["status"] == "finished"
    req = read_table(d, "requests")
    br = read_table(d, "breaker").sort_values("time_s", kind="stable")
    dec = read_table(d, "decisions")
    pod0 = br[br.pod == 0]
    opened = pod0[pod0.state == OPEN]
    assert len(opened) >= 1, (br, req)
    # it opened on failures blamed on pod 0: at least failure_threshold of its requests had been
    # given up by then (timeouts in kv_transfer or earlier, on the throttled link)
    gave_up = pd.Series(timed_out_at(req, meta["spec"]), index=req.index)
    first_open = opened.time_s.iloc[0]
    failed_before = req[(req.prefill_pod == 0) & (req.outcome != "ok") & (gave_up <= first_open + 0.5)]
    assert len(failed_before) >= BREAKER["failure_threshold"], (failed_before, first_open)
    # while a pod's breaker is open no decision chooses it, unless every pod of its role is open
    # (4 pods by_pod: prefill on 0-1, decode on 2-3; then the role's filter falls back to all)
    for row in dec.itertuples():
        for pod, role in ((row.prefill_pod, (0, 1)), (row.decode_pod, (2, 3))):
            if _breaker_state(br, pod, row.time_s) == OPEN:
                assert all(_breaker_state(br, q, row.time_s) == OPEN for q in role), (row, br)
    # every half-opening comes open_s after its opening at the earliest (at the next routing)
    for pod, rows in br.groupby("pod"):
        states, times = rows.state.tolist(), rows.time_s.tolist()
        for k, st in enumerate(states):
            if st == HALF_OPEN:
                assert states[k - 1] == OPEN and times[k] >= times[k - 1] + BREAKER["open_s"] - 1e-6, rows
    # the link heals at BREAKER_FAULT_S: pod 0 half-opened after that and closed again, on
    # success_threshold requests through it that ended ok from its half-opening on, each pulled across
    # the healed link (a later host stall may open it again: what is asserted is that it came back).
    # A success counts when its request ends, wherever it was routed: in CI (2026-11-30, a CPU without
    # AVX-512) pod 0 closed 0.7 s after its half-opening with no request served that was routed since;
    # one routed before the opening was given up by then, so those two were routed while it was open,
    # which the role's filter allows when every prefill pod is open (pod 1's opened on prefill timeouts
    # in a suite on such a machine, 2026-11-30).
    states, times = pod0.state.tolist(), pod0.time_s.tolist()
    back = [(times[k - 1], times[k]) for k in range(1, len(states))
            if states[k] == CLOSED and states[k - 1] == HALF_OPEN and times[k - 1] > BREAKER_FAULT_S]
    assert back, (pod0, req)
    half, closed = back[0]
    served = req[(req.end_s >= half) & (req.end_s <= closed + 0.5) & (req.prefill_pod == 0) & (req.outcome == "ok")]
    assert len(served) >= BREAKER["success_threshold"] and (served.kv_end_s > BREAKER_FAULT_S).all(), (served, pod0)
    m = run_metrics(d)
    assert m["breaker_opens"] == (br.state == OPEN).sum() and m["breaker_open_pod_s"] > 0
    # the simulator, on the same spec, opens pod 0's breaker too (both worlds drive core.breaker)
    sim = read_table(run_sim(parse_spec(meta["spec"]), "Random", 0, tmp_path), "breaker")
    assert ((sim.pod == 0) & (sim.state == OPEN)).any(), sim


def test_the_run_after_a_link_down_starts_on_engines_whose_kv_paths_work(testbed_runs):
    """A link down breaks the pod's KV connections for good on vLLM 0.32's NIXL (docs/testbed.md "A link
    down"). Before each run the driver checks every pair's KV path with one pull and restarts the
    engines where one is broken, so the run after an outage meets none of it: every request of the
    fault-free run after pod 0's 20 s outage ends ok, pod 0's included, on engines checked (and, where
    the outage broke a path, restarted) before it."""
    out = testbed_runs[0]
    down = read_meta(out / "e2e_link_down" / "Random" / "seed-0")
    assert down["start"]["kv_paths"]["ok"] is True  # the outage's own run started on working paths
    d = out / "e2e_after_link_down" / "Random" / "seed-0"
    kv = read_meta(d)["start"]["kv_paths"]
    if not kv["ok"]:  # what the outage is measured to do: pod 0's prefill paths broken, then restarted
        assert kv["broken"] and all(p.startswith("pod0-prefill->") for p in kv["broken"]), kv
        assert kv["restart"]["generation"] == 1 and kv["after_restart"]["ok"] is True, kv
    req = read_table(d, "requests")
    assert len(req) == 8 and (req["prefill_pod"] == 0).any()
    assert (req["outcome"] == "ok").all(), req[["request_id", "prefill_pod", "outcome"]]


def test_a_compute_fault_slows_a_pods_engine_on_nodes_ray_up_started(testbed_runs):
    """The shared cluster comes up through `ray up`, every node's agent inside the namespace shim: the
    compute fault finds the cgroups there, caps pod 1's engine, measures the factor asked for, and
    gives the processes back at its end (it once failed there: the shim's fresh /sys had no cgroups)."""
    out = testbed_runs[0]
    d = out / "e2e_compute" / "LC" / "seed-0"
    assert read_meta(d)["status"] == "finished"
    faults = read_table(d, "faults")
    assert list(faults.event) == ["apply", "clear"] and set(faults.target) == {"pod1:cpu"}, faults
    applied, cleared = faults.measured.tolist()
    # the unit test's tolerance (tests/test_faults_compute.py); here the probe shares 2 cores with 4 engines
    assert 2.0 <= applied <= 4.5, faults
    # The clear is probed with the quota lifted: it reads the host's contention alone, by design
    # (testbed/faults/cpu.py; 0.63-1.62 in the suites of 2026-11-30, beside the four engines and the
    # other test worker), where a cap still on reads at least the apply's bound above, as in the unit
    # test (tests/test_faults_compute.py: a fixed 1.5 failed there at 1.52 beside a busy loop per core)
    assert cleared < 2.0, faults
    req = read_table(d, "requests")
    assert len(req) == 8 and set(req.outcome) <= {"ok", "timeout"}, req
    # and the requests feel it: pod 1's prefills take longer than pod 0's (2.4x in the run that wrote
    # this test; 1.5x leaves room for the 2 cores' own scatter)
    took = (req.prefill_end_s - req.prefill_start_s).groupby(req.prefill_pod).median()
    assert took.get(1, 0) > 1.5 * took.get(0, float("inf")), took
    # the same, per prompt token, as `testbed report` shows it beside the agent's factor
    from analysis.run.compute_effect import run_compute_effect
    from analysis.run.data import load_run

    effect = run_compute_effect(load_run(d))
    assert list(effect.pod) == [1] and effect.baseline.iloc[0] == "others", effect  # pod 1 slow the whole run
    assert effect.engine_slowdown.iloc[0] > 1.5 and effect.measured.iloc[0] == applied, effect
