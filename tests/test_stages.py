"""One stage vocabulary, one ticket, one blame rule: the same request history gives the same
record in both worlds, and a timeout in each stage is recorded as that stage in both.

The simulator side runs the SimPy model; the testbed side runs the router actor's real
:class:`testbed.router.flow.RequestFlow` on the wall clock against scripted engines that
report their scheduler's events as vLLM's engines do through the stage log
(``testbed.engines.stagelog.StageLog``), since real engines take minutes to start.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import numpy as np
import pandas as pd
import pytest

from core.experiment import build_topology, make_router, seed_streams
from core.records import read_table
from core.run import RunContext
from builders import HAND_ENGINE, parse, small_spec_dict
from core.stages import BLAMED_ENDS, STAGE_START, blamed_pods
from simulator.run import run_sim
from testbed.engines.engine import DecodeResult, PrefillResult
from testbed.router.flow import RequestFlow
from vocab import STAGES

KV = 131072  # bytes per token (the spec's default)
TIMES = ["routed_s", "prefill_start_s", "prefill_end_s", "kv_start_s", "kv_end_s", "first_token_s", "end_s"]
# The column each stage would have ended at: NaN for a request that failed in it.
ENDS_AT = {"prefill_queue": "prefill_start_s", "prefill": "prefill_end_s", "decode_queue": "kv_start_s",
           "kv_transfer": "kv_end_s", "decode": "end_s"}


BASE = small_spec_dict(name="stages", topology={"pods": 1}, engine=HAND_ENGINE)  # one pod of 2 workers


def _spec(**over):
    return parse(BASE, **over)


def _trace(tmp_path, rows):
    path = tmp_path / "trace.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n" + "".join(f"{a},{p},{o}\n" for a, p, o in rows))
    return {"arrival": {"kind": "trace", "path": str(path)}, "max_requests": None, "prompt": None, "output": None}


def _sim(tmp_path, spec) -> pd.DataFrame:
    d = run_sim(spec, "LC", 0, tmp_path / "sim")
    return read_table(d, "requests").sort_values("request_id").reset_index(drop=True)


# --- the testbed side: the real request flow against scripted engines ----------------------------


class ScriptedEngine:
    """An engine client whose scheduler follows a script: events (``alloc``, ``alloc_remote``,
    ``recv_done``) at offsets after each call, a first token, and the call's end; an abort ends
    a call at once, as vLLM's does (outside a NIXL read)."""

    def __init__(self, events: dict[str, float], end: float, first: float | None = None) -> None:
        self.events, self.end, self.first = events, end, first
        self._t0: dict[str, float] = {}
        self._abort: dict[str, asyncio.Event] = {}

    async def _call(self, rid: str) -> tuple[float, float, bool]:
        t0 = self._t0[rid] = time.monotonic()
        ev = self._abort[rid] = asyncio.Event()
        try:
            await asyncio.wait_for(ev.wait(), self.end)
            aborted = True
        except asyncio.TimeoutError:
            aborted = False
        return t0, time.monotonic() - t0, aborted

    def _happened(self, rid: str, within: float) -> dict[str, float]:
        return {k: v for k, v in self.events.items() if v <= within}

    async def prefill(self, rid, ids):
        t0, took, aborted = await self._call(rid)
        return PrefillResult(rid, None if aborted else {"remote_block_ids": [0]}, len(ids), t0, t0 + took,
                             "abort" if aborted else "length", stages=self._happened(rid, took))

    async def decode(self, rid, ids, max_tokens, kv_transfer_params=None):
        t0, took, aborted = await self._call(rid)
        first = t0 + self.first if self.first is not None and self.first <= took else None
        return DecodeResult(rid, tuple(range(max_tokens)), t0, first, t0 + took, "abort" if aborted else "length",
                            stages=self._happened(rid, took))

    async def abort(self, rid):
        self._abort[rid].set()

    async def stages(self, rid):
        now = time.monotonic() - self._t0[rid]
        first = {"first_token": self.first} if self.first is not None and self.first <= now else {}
        return self._happened(rid, now) | first


def _testbed(tmp_path, spec, prefill: ScriptedEngine, decode: ScriptedEngine, prompt: int = 256,
             output: int = 10) -> pd.DataFrame:
    """One request (arrival 0) through RequestFlow on the wall clock."""
    topo = build_topology(spec)
    with RunContext(spec, "testbed", "LC", 0, tmp_path / "testbed", topo, {"requests": 1}) as ctx:
        t0 = time.monotonic()
        flow = RequestFlow(ctx, [prefill], [decode], spec.deadline_s, lambda: time.monotonic() - t0,
                           vocab=2048, kv_bytes_per_token=KV, block_tokens=spec.engine.kv_block_tokens,
                           first_token_limit_s=spec.first_token_limit_s)
        asyncio.run(flow.handle(0, 0.0, prompt, output))
    return read_table(ctx.run_dir, "requests")


# --- the blame rule ---------------------------------------------------------------------------------


@pytest.mark.parametrize("stage", STAGES)
def test_a_failure_is_charged_to_the_pods_its_stage_depends_on(tmp_path, stage):
    # by_pod: pod 0 holds the prefill workers, pod 1 the decode workers
    spec = _spec(topology={"pods": 2, "workers_per_pod": 2, "placement": "by_pod"})
    topo = build_topology(spec)
    rows = []
    router = make_router(spec, topo, "LC", seed_streams(0), rows.append)
    t = router.route(0.0, 7, 0.0, 256, 10)
    assert (t.prefill_pod, t.decode_pod) == (0, 1)
    for s in STAGES[1:STAGES.index(stage) + 1]:
        t.enter(s, 1.0)
    t.finish(2.0, "timeout")
    comp = router.estimator.update(2.0, np.zeros(2), None, np.ones(2))
    charged = {p for p in (0, 1) if comp.timeout_rate[p] > 0}
    assert charged == set(blamed_pods(stage, 0, 1))
    assert charged == {{"prefill": 0, "decode": 1}[e] for e in BLAMED_ENDS[stage]}
    assert rows[-1].failed_stage == stage and rows[-1].outcome == "timeout"
    # every counter the request held is released, whatever stage it ended in
    loads = router.view.loads
    assert not loads.prefill_outstanding.any() and not loads.decode_outstanding.any()
    assert not loads.prefill_tokens.any() and not loads.decode_kv_tokens.any()


def test_decode_admission_failures_no_longer_blame_the_prefill_pod():
    assert blamed_pods("decode_queue", 0, 1) == (1,)
    assert blamed_pods("kv_transfer", 0, 1) == (0, 1)
    assert blamed_pods("prefill_queue", 0, -1) == (0,)


def test_the_prefill_worker_is_released_when_the_request_leaves_prefill_and_only_then(tmp_path):
    spec = _spec()
    router = make_router(spec, build_topology(spec), "LC", seed_streams(0), lambda r: None)
    t = router.route(0.0, 0, 0.0, 256, 10)
    loads = router.view.loads
    t.enter("prefill", 0.1)
    assert loads.prefill_outstanding.sum() == 1
    t.enter("decode_queue", 0.3)
    assert loads.prefill_outstanding.sum() == 0 and loads.decode_outstanding.sum() == 1
    t.enter("kv_transfer", 0.4)
    t.enter("decode", 0.5)
    rec = t.finish(0.9)
    assert loads.decode_outstanding.sum() == 0 and loads.prefill_outstanding.sum() == 0
    assert rec.outcome == "ok" and rec.failed_stage is None and rec.end_s == 0.9
    assert [getattr(rec, STAGE_START[s]) for s in STAGES] == [0.0, 0.1, 0.3, 0.4, 0.5]
    with pytest.raises(RuntimeError, match="finished twice"):
        t.finish(1.0)


# --- the same history in both worlds ------------------------------------------------------------


def test_the_same_history_gives_the_same_record_in_both_worlds(tmp_path):
    # prompt 256 at 1000 tokens/s: prefill 0.256 s; KV 256 x 128 KiB over 8 Gbit/s: 0.0336 s;
    # 10 tokens at 0.01 s each (the first one step after the KV arrived)
    spec = _spec(workload=_trace(tmp_path, [(0.0, 256, 10)]), deadline_s=30.0)
    sim = _sim(tmp_path, spec).iloc[0]
    assert sim.outcome == "ok"
    d = {c: float(sim[c]) for c in TIMES}
    prefill = ScriptedEngine({"alloc": d["prefill_start_s"] - d["routed_s"]},
                             end=d["prefill_end_s"] - d["routed_s"])
    decode = ScriptedEngine({"alloc_remote": d["kv_start_s"] - d["prefill_end_s"],
                             "recv_done": d["kv_end_s"] - d["prefill_end_s"]},
                            first=d["first_token_s"] - d["prefill_end_s"], end=d["end_s"] - d["prefill_end_s"])
    real = _testbed(tmp_path, spec, prefill, decode).iloc[0]
    for col in ("request_id", "prompt_tokens", "output_tokens", "prefill_worker", "decode_worker", "prefill_pod",
                "decode_pod", "outcome", "kv_bytes"):
        assert real[col] == sim[col], col
    assert pd.isna(real.failed_stage) and pd.isna(sim.failed_stage)
    for col in TIMES:
        # the testbed's router adds its own call overheads (a few ms here) to the scripted times
        assert real[col] == pytest.approx(sim[col], abs=0.05), col


@pytest.mark.parametrize("stage", STAGES)
def test_a_timeout_in_each_stage_is_recorded_as_that_stage_in_both_worlds(tmp_path, stage):
    deadline = 2.0
    # --- simulator: a spec whose physics leaves a request in `stage` at its deadline
    if stage == "prefill_queue":  # one prefill worker, one prompt per batch, 0.256 s each, 20 at once
        sim_spec = _spec(engine={"prefill_batch_tokens": 256}, workload=_trace(tmp_path, [(0.0, 256, 10)] * 20),
                         deadline_s=deadline)
    elif stage == "prefill":  # a prompt of 10 s
        sim_spec = _spec(workload={"prompt": {"kind": "fixed", "value": 10000}}, deadline_s=deadline)
    elif stage == "decode_queue":
        # one decode slot: request 1 (prefill 0.5 s on the first prefill worker) waits for it while
        # request 0 (on the second prefill worker) decodes endlessly until just after request 1's deadline
        sim_spec = _spec(topology={"workers_per_pod": 3, "prefill_fraction": 0.67}, engine={"decode_max_batch": 1},
                         workload=_trace(tmp_path, [(0.0, 500, 100000), (0.01, 10, 100000)]), deadline_s=deadline)
    elif stage == "kv_transfer":  # prefill and decode pods apart, their link at 1e-4 of 8 Gbit/s
        sim_spec = _spec(topology={"pods": 2, "placement": "by_pod", "uplink_gbps": 8.0},
                         faults=[{"kind": "link", "pods": [0], "residual_bw": 0.0001, "start_s": 0.0,
                                  "duration_s": 1000.0}], deadline_s=deadline)
    else:  # 100,000 tokens at 0.01 s each
        sim_spec = _spec(workload={"output": {"kind": "fixed", "value": 100000}}, deadline_s=deadline)
    sim = _sim(tmp_path, sim_spec)
    to = sim[sim.outcome == "timeout"]
    assert stage in set(to.failed_stage)
    sim_row = to[to.failed_stage == stage].iloc[0]

    # --- testbed: engines whose scheduler keeps the request in `stage` past the deadline
    never, fast = 60.0, 0.05
    script = {
        "prefill_queue": ({"alloc": never}, {}),
        "prefill": ({"alloc": fast}, {}),
        "decode_queue": ({"alloc": 0.0}, {"alloc_remote": never}),
        "kv_transfer": ({"alloc": 0.0}, {"alloc_remote": fast, "recv_done": never}),
        "decode": ({"alloc": 0.0}, {"alloc_remote": fast, "recv_done": 2 * fast}),
    }[stage]
    prefill = ScriptedEngine(script[0], end=never if stage in ("prefill_queue", "prefill") else 2 * fast)
    decode = ScriptedEngine(script[1], end=never, first=3 * fast if stage == "decode" else None)
    real = _testbed(tmp_path, _spec(deadline_s=deadline), prefill, decode).iloc[0]
    assert real.outcome == "timeout" and real.failed_stage == stage

    for row in (sim_row, real):
        # the stage's start is stamped, its end is not, and nothing after it
        assert not math.isnan(row[STAGE_START[stage]])
        assert math.isnan(row[ENDS_AT[stage]])
        assert math.isnan(row.end_s)
        later = STAGES[STAGES.index(stage) + 1:]
        assert all(math.isnan(row[STAGE_START[s]]) for s in later)
        # KV bytes count only for a request whose transfer started
        assert (row.kv_bytes > 0) == (stage in ("kv_transfer", "decode"))
        # a first token is recorded only if one came before the deadline (in decode)
        assert math.isnan(row.first_token_s) == (stage != "decode")


class DeadEngine(ScriptedEngine):
    """An engine whose calls fail, as a killed engine actor's do."""

    async def prefill(self, rid, ids):
        raise RuntimeError("engine actor died")

    async def decode(self, rid, ids, max_tokens, kv_transfer_params=None):
        raise RuntimeError("engine actor died")


@pytest.mark.parametrize("dead,stage", [("prefill", "prefill_queue"), ("decode", "decode_queue")])
def test_a_failed_engine_call_is_an_error_in_the_stage_the_request_was_in(tmp_path, dead, stage):
    ok = ScriptedEngine({"alloc": 0.0, "alloc_remote": 0.0, "recv_done": 0.0}, end=0.01, first=0.0)
    prefill = DeadEngine({}, end=0.0) if dead == "prefill" else ok
    decode = DeadEngine({}, end=0.0) if dead == "decode" else ok
    row = _testbed(tmp_path, _spec(deadline_s=5.0), prefill, decode).iloc[0]
    assert (row.outcome, row.failed_stage) == ("error", stage)


def test_a_prefill_that_returns_no_kv_is_an_error_in_prefill(tmp_path):
    class NoKv(ScriptedEngine):
        async def prefill(self, rid, ids):
            res = await super().prefill(rid, ids)
            return PrefillResult(rid, None, res.num_prompt_tokens, res.submitted_s, res.finished_s, "length",
                                 stages=res.stages)

    row = _testbed(tmp_path, _spec(deadline_s=5.0), NoKv({"alloc": 0.0}, end=0.01),
                   ScriptedEngine({}, end=0.01)).iloc[0]
    assert (row.outcome, row.failed_stage) == ("error", "prefill")
    assert not math.isnan(row.prefill_start_s) and math.isnan(row.prefill_end_s)


def test_the_first_token_limit_cuts_only_a_request_without_its_first_token_in_both_worlds(tmp_path):
    spec = _spec(deadline_s=30.0, ttft_timeout_s=1.0)
    # testbed: the pull ends at 1.5 s, after the first-token limit: cut in kv_transfer at 1 s
    slow = ScriptedEngine({"alloc_remote": 0.05, "recv_done": 1.5}, first=1.52, end=1.8)
    real = _testbed(tmp_path / "a", spec, ScriptedEngine({"alloc": 0.0}, end=0.05), slow).iloc[0]
    assert real.outcome == "timeout" and real.failed_stage == "kv_transfer"
    # a first token at 0.3 s, the end at 1.6 s: past the first-token limit, but not cut by it
    fine = ScriptedEngine({"alloc_remote": 0.05, "recv_done": 0.25}, first=0.3, end=1.6)
    real = _testbed(tmp_path / "b", spec, ScriptedEngine({"alloc": 0.0}, end=0.05), fine).iloc[0]
    assert real.outcome == "ok" and real.end_s > 1.5
    # simulator: 256 KV tokens of 128 KiB over 8 Gbit/s take 0.034 s; with 0.0001 of it on the
    # prefill pod's core links (by_pod), 336 s: cut at 1 s in kv_transfer there too
    sim_spec = _spec(deadline_s=30.0, ttft_timeout_s=1.0, topology={"pods": 2, "workers_per_pod": 1, "placement": "by_pod"},
                     faults=[{"kind": "link", "pods": [0], "residual_bw": 0.0001, "start_s": 0.0, "duration_s": 100.0}])
    sim = _sim(tmp_path / "c", sim_spec).iloc[0]
    assert sim.outcome == "timeout" and sim.failed_stage == "kv_transfer"



class StarvedEngine(ScriptedEngine):
    """An engine whose front end answers nothing while its call runs (its actor process starved of
    CPU, as seen from a fresh clone): ``stages`` and the abort come back only once the call has
    run its course, and ``stages`` then finds the request gone, as vLLM's front end does."""

    def __init__(self, events: dict[str, float], end: float, first: float | None = None) -> None:
        super().__init__(events, end, first)
        self._over: dict[str, asyncio.Event] = {}

    async def _call(self, rid):
        over = self._over.setdefault(rid, asyncio.Event())
        try:
            t0 = self._t0[rid] = time.monotonic()
            await asyncio.sleep(self.end)  # the abort does not reach it
            return t0, time.monotonic() - t0, False
        finally:
            over.set()

    async def abort(self, rid):
        await self._over.setdefault(rid, asyncio.Event()).wait()

    async def stages(self, rid):
        await self._over.setdefault(rid, asyncio.Event()).wait()
        return {}


@pytest.mark.parametrize("stage", ["prefill", "decode"])
def test_a_timeout_on_a_starved_engine_is_recorded_in_the_stage_its_own_log_gives(tmp_path, stage):
    # Past the deadline (1 s) the engine's answer comes only with the call's end (1.5 s), without the
    # request; the call's own log places it: in decode (pulled by 0.1 s), or in prefill (begun at 0.05 s).
    fast = ScriptedEngine({"alloc": 0.0}, end=0.05)
    if stage == "decode":
        prefill, decode = fast, StarvedEngine({"alloc_remote": 0.05, "recv_done": 0.1}, end=1.5, first=0.15)
    else:
        prefill, decode = StarvedEngine({"alloc": 0.05}, end=1.5), fast
    row = _testbed(tmp_path, _spec(deadline_s=1.0), prefill, decode).iloc[0]
    assert (row.outcome, row.failed_stage) == ("timeout", stage)
    if stage == "decode":
        assert row.kv_start_s < row.kv_end_s < row.first_token_s < 1.0 and math.isnan(row.end_s)
    else:
        assert 0.0 < row.prefill_start_s < 1.0 and math.isnan(row.prefill_end_s)


# --- dead work: the pull of a request given up in kv_transfer ----------------------------------------


class DeadPullEngine(ScriptedEngine):
    """A decode engine whose KV read cannot be cancelled, as vLLM's: the call returns at the abort,
    the read ends ``ends_at`` after the call reached the engine (``how``: "recv_done" or
    "recv_failed"; None: never), and its end is told as an offset from the abort's arrival.
    ``dispatch_s``: how long the decode call takes to reach the engine (a busy host's actor)."""

    def __init__(self, ends_at: float, how: str | None, dispatch_s: float = 0.0) -> None:
        super().__init__({"alloc_remote": 0.05}, end=60.0)
        self.ends_at, self.how, self.dispatch_s, self.forgotten = ends_at, how, dispatch_s, []
        self._aborted: dict[str, float] = {}

    async def decode(self, rid, ids, max_tokens, kv_transfer_params=None):
        await asyncio.sleep(self.dispatch_s)
        return await super().decode(rid, ids, max_tokens, kv_transfer_params)

    async def abort(self, rid):
        self._aborted[rid] = time.monotonic()
        await super().abort(rid)

    async def pull_end(self, rid, forget=False):
        if forget:
            self.forgotten.append(rid)
        end = self._t0[rid] + self.ends_at
        done = self.how is not None and time.monotonic() >= end
        return {self.how: end - self._aborted[rid]} if done else {}


def _given_up_in_kv_transfer(tmp_path, decode: DeadPullEngine, deadline_s: float = 1.0) -> tuple[Any, float, bool]:
    """One request through RequestFlow on the wall clock to its timeout in kv_transfer on ``decode``,
    then its dead pull's watch to its end: (the run directory, the flow clock's origin on
    time.monotonic, whether the pull was still watched when the request had ended)."""
    spec = _spec(deadline_s=deadline_s)
    with RunContext(spec, "testbed", "LC", 0, tmp_path / "testbed", build_topology(spec), {"requests": 1}) as ctx:
        t0 = time.monotonic()
        flow = RequestFlow(ctx, [ScriptedEngine({"alloc": 0.0}, end=0.05)], [decode], spec.deadline_s,
                           lambda: time.monotonic() - t0, vocab=2048, kv_bytes_per_token=KV,
                           block_tokens=spec.engine.kv_block_tokens)

        async def go():
            out = await flow.handle(0, 0.0, 256, 10)
            watched = bool(flow.watches)
            await flow.drain()
            return out, watched

        outcome, watched = asyncio.run(go())
        assert outcome == "timeout"
    return ctx.run_dir, t0, watched


@pytest.mark.parametrize("how, ending", [("recv_done", "done"), ("recv_failed", "failed"), (None, "unseen")])
def test_a_dead_pull_is_watched_after_the_deadline_and_recorded(tmp_path, monkeypatch, how, ending):
    from testbed.router import flow as serve

    monkeypatch.setattr(serve, "DEAD_PULL_WATCH_S", 2.0)  # "unseen" after 2 s rather than a minute
    monkeypatch.setattr(serve, "DEAD_PULL_POLL_S", 0.05)
    decode = DeadPullEngine(ends_at=2.0, how=how)
    run_dir, _, watched = _given_up_in_kv_transfer(tmp_path, decode)
    assert watched  # the request had ended; its pull was still watched
    (row,) = read_table(run_dir, "requests").itertuples()
    assert row.failed_stage == "kv_transfer"
    (dead,) = read_table(run_dir, "dead_pulls").itertuples()
    assert dead.ending == ending and dead.kv_bytes == row.kv_bytes > 0
    assert dead.given_up_s == pytest.approx(1.0)
    if how is None:
        assert math.isnan(dead.end_s) and math.isnan(dead.bytes_after) and decode.forgotten == ["req-0-0"]
        return
    sent = row.kv_start_s - 0.05  # the decode call's start (alloc_remote 0.05 s after it)
    assert dead.end_s == pytest.approx(sent + 2.0, abs=0.01)
    if how == "recv_done":  # the pull's mean rate over its 1.95 s, of which ~1 s came after the deadline
        share = (dead.end_s - 1.0) / (dead.end_s - row.kv_start_s)
        assert dead.bytes_after == pytest.approx(row.kv_bytes * share)
    else:
        assert math.isnan(dead.bytes_after)


def test_a_dead_pulls_end_counts_the_decode_calls_dispatch_and_lies_after_its_give_up(tmp_path, monkeypatch):
    # The decode call reaches the engine 0.8 s after it was sent (a loaded host: CI, 2026-11-25, saw
    # a pull end placed 1.2 s before its give-up), its pull then ends 1.5 s later, at 2.3 s: after
    # the give-up (1 s). An offset from the call's arrival would place it at 1.5 s; one from the
    # abort's, as the engine tells it, places it where it was.
    from testbed.router import flow as serve

    monkeypatch.setattr(serve, "DEAD_PULL_POLL_S", 0.05)
    decode = DeadPullEngine(ends_at=1.5, how="recv_done", dispatch_s=0.8)
    run_dir, t0, _ = _given_up_in_kv_transfer(tmp_path, decode)
    truth = decode._t0["req-0-0"] + 1.5 - t0
    (dead,) = read_table(run_dir, "dead_pulls").itertuples()
    assert dead.ending == "done" and dead.end_s > dead.given_up_s
    assert dead.end_s == pytest.approx(truth, abs=0.05) and truth > 2.2


# --- when a call reached its engine (CallClock) -------------------------------------------------------


def test_a_calls_arrival_is_placed_by_the_engines_clock_offset_bounded_by_every_call():
    from types import SimpleNamespace as Res

    from testbed.router.flow import CallClock

    clock = CallClock()  # the engine's clock runs 100 s ahead of the router's
    assert clock.arrived(("decode", 0), 0.0, Res(submitted_s=100.01)) == pytest.approx(0.0)  # the fastest yet
    # sent at 5 s, reached the engine at 5.51 s: placed 0.5 s after its send (0.01 s: the fastest's own delay)
    assert clock.arrived(("decode", 0), 5.0, Res(submitted_s=105.51)) == pytest.approx(5.5)
    # a faster call tightens the bound; another engine has its own offset; no result: the send
    assert clock.arrived(("decode", 0), 10.0, Res(submitted_s=109.992)) == pytest.approx(10.0)
    assert clock.arrived(("decode", 0), 20.0, Res(submitted_s=120.492)) == pytest.approx(20.5)
    assert clock.arrived(("prefill", 0), 3.0, Res(submitted_s=-7.0)) == pytest.approx(3.0)
    assert clock.arrived(("prefill", 0), 4.0, None) == 4.0
    s = clock.summary()
    assert s["decode"]["n"] == 4 and s["decode"]["max_s"] == pytest.approx(0.5) and s["prefill"]["n"] == 1
    # the return leg: the last decode call reached the engine at 20.5 s (engine 120.492) and ended
    # there at engine 121.492, i.e. 21.5 s; the router has its result at 21.53 s
    clock.returned("decode", 20.5, Res(submitted_s=120.492, finished_s=121.492), 21.53)
    clock.returned("decode", 20.5, Res(submitted_s=120.492, finished_s=None), 30.0)  # nothing to place: skipped
    r = clock.return_summary()
    assert r == {"decode": {"n": 1, "p50_s": pytest.approx(0.03), "p90_s": pytest.approx(0.03),
                            "max_s": pytest.approx(0.03)}}


class DispatchedEngine(ScriptedEngine):
    """A scripted engine whose calls reach it after the delays given, in order (a busy actor)."""

    def __init__(self, events: dict[str, float], end: float, first: float | None, delays: list[float]) -> None:
        super().__init__(events, end, first)
        self.delays = list(delays)

    async def decode(self, rid, ids, max_tokens, kv_transfer_params=None):
        await asyncio.sleep(self.delays.pop(0))
        return await super().decode(rid, ids, max_tokens, kv_transfer_params)


def test_a_decode_calls_dispatch_delay_is_counted_in_the_stage_times_after_it(tmp_path):
    # Two requests in turn; the second's decode call reaches its engine 0.6 s after it was sent.
    # Its admission, pull end and first token come 0.05, 0.1 and 0.15 s after that arrival, so
    # after the send by 0.65, 0.7 and 0.75 s (placed at the send, they would be 0.6 s early).
    spec = _spec(deadline_s=5.0)
    decode = DispatchedEngine({"alloc_remote": 0.05, "recv_done": 0.1}, end=0.3, first=0.15, delays=[0.0, 0.6])
    topo = build_topology(spec)
    sent: list[float] = []
    with RunContext(spec, "testbed", "LC", 0, tmp_path / "testbed", topo, {"requests": 2}) as ctx:
        t0 = time.monotonic()
        clock = lambda: time.monotonic() - t0  # noqa: E731
        flow = RequestFlow(ctx, [ScriptedEngine({"alloc": 0.0}, end=0.05)], [decode], spec.deadline_s, clock,
                           vocab=2048, kv_bytes_per_token=KV, block_tokens=spec.engine.kv_block_tokens)
        inner = decode.decode

        async def timed(*a, **kw):
            sent.append(clock())
            return await inner(*a, **kw)

        decode.decode = timed

        async def go():
            return [await flow.handle(0, 0.0, 256, 10), await flow.handle(1, 0.0, 256, 10)]

        assert asyncio.run(go()) == ["ok", "ok"]
    req = read_table(ctx.run_dir, "requests").set_index("request_id")
    late = req.loc[1]
    assert late.kv_start_s - sent[1] == pytest.approx(0.65, abs=0.03)
    assert late.kv_end_s - sent[1] == pytest.approx(0.70, abs=0.03)
    assert late.first_token_s - sent[1] == pytest.approx(0.75, abs=0.03)
    assert req.loc[0].first_token_s - sent[0] == pytest.approx(0.15, abs=0.03)
    assert flow.calls.summary()["decode"]["max_s"] == pytest.approx(0.6, abs=0.03)  # what run.json gets
