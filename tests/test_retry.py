"""Retries as a router option (core/retry.py): sgl-router's backoff, a per-try timeout to the first
token, another pair avoiding the blamed pods; in the simulator and through the testbed's real
request flow against scripted engines."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pandas as pd
import pytest

from core.experiment import build_topology, make_router, seed_streams
from core.policies import POLICY_NAMES
from core.records import read_table
from core.retry import Retries
from core.run import RunContext
from core.spec.model import RetrySpec, SpecError
from builders import HAND_ENGINE, merge, parse, poisson, small_spec_dict
from simulator.run import run_sim
from test_stages import KV, DeadEngine, ScriptedEngine
from testbed.router.flow import RequestFlow


# 4 pods by_pod, one worker each: pods 0-1 prefill, pods 2-3 decode (the twin's shape).
BASE = small_spec_dict(name="retry", topology={"pods": 4, "workers_per_pod": 1, "placement": "by_pod"},
                       engine=HAND_ENGINE, workload={"arrival": poisson(2.0), "max_requests": 60},
                       deadline_s=30.0, ttft_timeout_s=10.0)


def _spec(retry=None, **over):
    """:data:`BASE` with ``router.retry`` = ``retry``."""
    return parse(merge(BASE, router={"retry": retry}), **over)


def _router(spec):
    rows = []
    return make_router(spec, build_topology(spec), "LC", seed_streams(0), rows.append), rows


# --- the decision: backoff, limits, what is retried ----------------------------------------------


def test_the_backoff_is_sgl_routers_and_a_retry_never_starts_past_the_first_token_limit():
    spec = _spec({})
    router, _ = _router(spec)
    retries = Retries(spec.router.retry, np.random.default_rng(0))
    for attempt, base in ((0, 0.05), (1, 0.075), (2, 0.1125), (3, 0.16875)):
        t = router.route(0.0, attempt, 0.0, 256, 10)
        t.attempt = attempt
        t.enter("prefill", 0.0)
        delays = [retries.next_attempt(1.0, t, "error", 10.0).at_s - 1.0 for _ in range(200)]
        assert base * 0.8 <= min(delays) < base * 0.85 and base * 1.15 < max(delays) <= base * 1.2
        t.finish(1.0, "error")
    capped = Retries(RetrySpec(max_attempts=30, max_backoff_s=0.5, jitter=0.0), np.random.default_rng(0))
    t = router.route(0.0, 9, 0.0, 256, 10)
    t.attempt = 20  # 0.05 x 1.5^20 is far past the cap
    assert capped.next_attempt(1.0, t, "error", 10.0).at_s == pytest.approx(1.5)
    assert capped.next_attempt(9.6, t, "error", 10.0) is None  # it would start past the limit
    t.attempt = 29
    assert capped.next_attempt(1.0, t, "error", 10.0) is None  # no attempt left
    t.attempt = 0
    assert capped.next_attempt(1.0, t, "ok", 10.0) is None
    assert capped.next_attempt(1.0, t, "rejected", 10.0) is None
    t.first_token_s = 0.9  # the client has its first token: nothing can be taken back
    assert capped.next_attempt(1.0, t, "error", 10.0) is None


def test_an_attempt_is_given_up_early_only_if_a_retry_can_follow_it():
    router, _ = _router(_spec({}))
    t = router.route(2.0, 0, 0.0, 256, 10)
    spec = RetrySpec(max_attempts=3, attempt_ttft_s=3.0, jitter=0.2)
    retries = Retries(spec, np.random.default_rng(0))
    assert retries.attempt_limit(t, 10.0) == 5.0
    assert retries.attempt_limit(t, 5.05) == 5.05  # 5 s + up to 60 ms of backoff is past the limit
    t.attempt = 2
    assert retries.attempt_limit(t, 10.0) == 10.0  # the last attempt has the request's time
    assert Retries(RetrySpec(), np.random.default_rng(0)).attempt_limit(t, 10.0) == 10.0  # no per-try timeout


def test_a_retry_avoids_the_blamed_pods_and_stays_admitted_once():
    spec = _spec({}, router={"retry": {}, "max_in_flight": 1})
    router, rows = _router(spec)
    retries = Retries(spec.router.retry, np.random.default_rng(0))
    assert router.admit(0.0, 0, 0.0, 256, 10)
    t = router.route(0.0, 0, 0.0, 256, 10)
    t.enter("prefill", 0.1)
    t.enter("decode_queue", 0.3)
    t.enter("kv_transfer", 0.4)
    nxt = retries.next_attempt(1.0, t, "timeout", 10.0)
    assert nxt.attempt == 1 and nxt.avoid == {t.prefill_pod, t.decode_pod}  # kv_transfer blames both ends
    rec = t.abandon(1.0, "timeout", nxt.at_s - 1.0)
    assert (rec.outcome, rec.failed_stage, rec.attempt) == ("timeout", "kv_transfer", 0)
    assert router.in_flight == 1 and not router.admit(1.0, 1, 1.0, 256, 10)  # still admitted, counted once
    t2 = router.route(nxt.at_s, 0, 0.0, 256, 10, nxt.attempt, nxt.avoid)
    assert t2.prefill_pod not in nxt.avoid and t2.decode_pod not in nxt.avoid
    assert router.in_flight == 1
    final = t2.finish(2.0, "ok")
    assert final.attempts == 2 and router.in_flight == 0
    assert not router.view.loads.prefill_outstanding.any() and not router.view.loads.decode_outstanding.any()


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_every_policy_keeps_a_retry_off_the_avoided_pods_while_others_are_left(policy):
    spec = _spec({}, policies=[policy])
    topo = build_topology(spec)
    router = make_router(spec, topo, policy, seed_streams(1), lambda r: None)
    for i in range(40):
        t = router.route(float(i), i, float(i), 256, 10, 1, frozenset({0, 2}))
        assert (t.prefill_pod, t.decode_pod) == (1, 3), policy
        t.finish(float(i), "ok")
    # avoiding every pod of a role leaves that role's choice as without it
    t = router.route(50.0, 99, 50.0, 256, 10, 1, frozenset({0, 1, 2}))
    assert t.decode_pod == 3 and t.prefill_pod in (0, 1)


def test_a_retry_spec_with_its_backoff_upside_down_is_refused():
    with pytest.raises(SpecError, match="max_backoff_s"):
        _spec({"initial_backoff_s": 2.0, "max_backoff_s": 1.0})


# --- the simulator -----------------------------------------------------------------------------------

LINK_DOWN = [{"kind": "link", "pods": [0], "residual_bw": 0.0, "start_s": 0.0, "duration_s": 1000.0}]


def _sim(tmp_path, spec, policy="LC"):
    d = run_sim(spec, policy, 0, tmp_path)
    return read_table(d, "requests").sort_values("request_id"), read_table(d, "attempts"), d


def test_off_or_without_a_per_try_timeout_the_simulator_is_unchanged(tmp_path):
    """The simulated engines never fail, so retries only of failures change nothing."""
    plain, att0, _ = _sim(tmp_path / "a", _spec(None, faults=LINK_DOWN))
    failures_only, att1, _ = _sim(tmp_path / "b", _spec({}, faults=LINK_DOWN))
    assert (plain.outcome == "timeout").sum() > 0  # the downed link fails requests
    assert att0.empty and att1.empty
    pd.testing.assert_frame_equal(plain.reset_index(drop=True), failures_only.reset_index(drop=True))


def test_the_simulator_retries_an_attempt_stuck_past_its_per_try_timeout_on_another_pair(tmp_path):
    spec = _spec({"attempt_ttft_s": 2.0}, faults=LINK_DOWN)
    req, att, _ = _sim(tmp_path, spec)
    plain, _, _ = _sim(tmp_path / "plain", _spec(None, faults=LINK_DOWN))
    assert len(att) > 0 and (plain.outcome != "ok").sum() > 0
    assert (req.outcome == "ok").all()  # every request through pod 0's dead link is rescued
    # every given-up attempt went through pod 0 and was stuck in its KV transfer for its 2 s
    assert (att.prefill_pod == 0).all() and (att.failed_stage == "kv_transfer").all()
    assert np.allclose(att.end_s - att.routed_s, 2.0)
    assert (att.outcome == "timeout").all()
    # the request's record is its last attempt's: one more than its given-up attempts, elsewhere
    n_given_up = att.groupby("request_id").size()
    retried = req.set_index("request_id").loc[n_given_up.index]
    assert (retried.attempts == n_given_up + 1).all()
    assert (retried.prefill_pod != 0).all()
    assert (retried.routed_s.to_numpy() >= att.groupby("request_id").end_s.max().to_numpy()).all()
    assert (req.set_index("request_id").drop(n_given_up.index).attempts == 1).all()


def test_the_simulator_keeps_a_given_up_attempts_dead_pull_apart_from_its_retry(tmp_path):
    # a slow link (not down), with pulls that go on after their abort: the dead pull of attempt 0 and
    # the live pull of attempt 1 of one request both exist
    # (0.02 of 8 Gbit/s: a 32 MiB pull alone takes 1.7 s, past the 1 s per-try timeout)
    faults = [{"kind": "link", "pods": [0], "residual_bw": 0.02, "start_s": 0.0, "duration_s": 1000.0}]
    base = _spec()
    spec = _spec({"attempt_ttft_s": 1.0}, faults=faults,
                 engine={**base.engine.model_dump(), "kv_pull_on_abort": "finish"},
                 workload={**base.workload.model_dump(), "max_requests": 10})
    req, att, d = _sim(tmp_path, spec)
    dead = read_table(d, "dead_pulls")
    assert (req.outcome == "ok").all() and len(att) > 0
    assert set(zip(dead.request_id, dead.attempt)) == set(zip(att.request_id, att.attempt))
    assert (dead.ending == "done").all() and (dead.bytes_after > 0).all()


# --- the testbed's request flow ----------------------------------------------------------------------


def _flow_run(tmp_path, spec, prefill, decode, n=6):
    """``n`` requests, 0.1 s apart, through RequestFlow on the wall clock against scripted engines."""
    topo = build_topology(spec)
    with RunContext(spec, "testbed", "LC", 0, tmp_path, topo, {"requests": n}) as ctx:
        t0 = time.monotonic()
        flow = RequestFlow(ctx, prefill, decode, spec.deadline_s, lambda: time.monotonic() - t0,
                           vocab=2048, kv_bytes_per_token=KV, block_tokens=spec.engine.kv_block_tokens,
                           first_token_limit_s=spec.first_token_limit_s)

        async def go():
            outs = []
            for i in range(n):
                outs.append(await flow.handle(i, time.monotonic() - t0, 256, 10))
            return outs

        outcomes = asyncio.run(go())
    return outcomes, read_table(ctx.run_dir, "requests"), read_table(ctx.run_dir, "attempts")


def _ok_engine(**kw):
    return ScriptedEngine({"alloc": 0.0, "alloc_remote": 0.0, "recv_done": 0.01}, end=0.03, first=0.02, **kw)


def test_the_testbed_retries_a_failed_engine_call_on_another_pair(tmp_path):
    class Recording(ScriptedEngine):
        seen: list[str] = []

        async def decode(self, rid, ids, max_tokens, kv_transfer_params=None):
            self.seen.append(rid)
            return await super().decode(rid, ids, max_tokens, kv_transfer_params)

    good = Recording({"alloc": 0.0, "alloc_remote": 0.0, "recv_done": 0.01}, end=0.03, first=0.02)
    prefill = [_ok_engine(), _ok_engine()]
    outcomes, req, att = _flow_run(tmp_path, _spec({}), prefill, [DeadEngine({}, end=0.0), good])
    assert outcomes == ["ok"] * 6
    assert len(att) > 0  # LC's rotating ties send some first attempts to the dead engine (pod 2)
    assert (att.decode_pod == 2).all() and (att.outcome == "error").all() and (att.failed_stage == "decode_queue").all()
    retried = req[req.attempts == 2]
    assert len(retried) == len(att) and (retried.decode_pod == 3).all() and (retried.outcome == "ok").all()
    # a retry is a new request on the engines: its own id
    assert all(rid.endswith("-1") for rid in good.seen if rid.count("-") == 3)
    assert len(set(good.seen)) == len(good.seen)


def test_without_retries_the_failed_engine_call_ends_the_request(tmp_path):
    outcomes, req, att = _flow_run(tmp_path, _spec(None), [_ok_engine(), _ok_engine()],
                                   [DeadEngine({}, end=0.0), _ok_engine()])
    assert "error" in outcomes and att.empty and (req.attempts == 1).all()


def test_the_testbed_gives_up_an_attempt_at_its_per_try_timeout_and_the_retry_succeeds(tmp_path):
    stuck = ScriptedEngine({"alloc": 30.0}, end=60.0)  # pod 0's prefill never starts a request
    outcomes, req, att = _flow_run(tmp_path, _spec({"attempt_ttft_s": 0.5}), [stuck, _ok_engine()],
                                   [_ok_engine(), _ok_engine()], n=4)
    assert outcomes == ["ok"] * 4 and len(att) > 0
    assert (att.prefill_pod == 0).all() and (att.failed_stage == "prefill_queue").all()
    assert (att.outcome == "timeout").all()
    assert ((att.end_s - att.routed_s) > 0.45).all() and ((att.end_s - att.routed_s) < 1.0).all()
    assert (req[req.attempts > 1].prefill_pod == 1).all()


def test_the_exporter_counts_the_retries_by_stage(tmp_path):
    from core.records import AttemptRecord
    from core.view import Loads
    from testbed.router.exporter import RunMetrics

    spec = _spec({"attempt_ttft_s": 2.0}, faults=LINK_DOWN)
    _, att, _ = _sim(tmp_path, spec)
    topo = build_topology(spec)
    metrics = RunMetrics(topo, lambda: Loads.zeros(topo))
    for row in att[list(AttemptRecord._fields)].itertuples(index=False, name=None):
        metrics.observe(AttemptRecord(*row))
    assert len(att) > 0
    assert metrics.registry.get_sample_value("testbed_retries_total", {"stage": "kv_transfer"}) == len(att)
