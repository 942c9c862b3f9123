"""Engines that die mid-run: the router stops choosing them, from their own state (a call that
raised, then vLLM's health check through the engine's actor), never from a label. Through the
testbed's real request flow and its liveness check against scripted engines; the end-to-end test
kills real engines (tests/test_testbed_e2e_cluster.py)."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from core.experiment import build_topology, make_router, seed_streams
from core.policies import POLICY_NAMES
from core.records import read_table
from core.run import RunContext
from builders import parse, poisson, small_spec_dict
from test_stages import KV, ScriptedEngine
from testbed.router.flow import Liveness, RequestFlow


def _spec(**over):
    """4 pods by_pod, one worker each: pods 0-1 prefill (workers 0-1), pods 2-3 decode (workers 2-3)."""
    return parse(small_spec_dict(name="engine_death",
                                 topology={"pods": 4, "workers_per_pod": 1, "placement": "by_pod"},
                                 workload={"arrival": poisson(2.0), "max_requests": 10}, deadline_s=10.0), **over)


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_no_policy_chooses_a_down_engine_while_its_role_has_another(policy):
    spec = _spec(policies=[policy])
    rows = []
    router = make_router(spec, build_topology(spec), policy, seed_streams(2), rows.append)
    router.set_engine_state(1.0, 2, "RayActorError: the actor died")  # decode on pod 2
    router.set_engine_state(1.5, 2, "again")  # recorded once
    for i in range(30):
        t = router.route(2.0 + i, i, 2.0 + i, 256, 10)
        assert t.decode_worker == 3, policy
        t.finish(2.0 + i, "ok")
    (rec,) = [r for r in rows if r.table == "engines"]
    assert (rec.worker, rec.pod, rec.role, rec.state) == (2, 2, "decode", "down")
    # the filters (here the oracle's, with the pod degraded) cannot send a request back to it
    router.set_truth(np.array([False, False, False, True]))
    t = router.route(40.0, 99, 40.0, 256, 10)
    assert t.decode_worker == 3
    # every decode engine down: a request still goes somewhere (and fails there), as with filters
    router.set_engine_state(41.0, 3, "EngineDeadError")
    assert router.route(42.0, 100, 42.0, 256, 10).decode_worker in (2, 3)


class MortalEngine(ScriptedEngine):
    """A scripted engine that can die: its calls in flight and later ones raise, as a killed actor's
    do, and so does its health check. ``core``: only its engine core died, its actor lives on and
    still answers where a request was (its stage log); a dead actor answers nothing."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.dead = False
        self.actor_alive = False
        self.calls: list[str] = []

    def die(self, core: bool = False) -> None:
        self.dead, self.actor_alive = True, core
        for ev in self._abort.values():
            ev.set()

    async def stages(self, rid):
        if self.dead and not self.actor_alive:
            raise RuntimeError("RayActorError: the actor died unexpectedly")
        return await super().stages(rid)

    async def _call(self, rid):
        if self.dead:
            raise RuntimeError("RayActorError: the actor died unexpectedly")
        self.calls.append(rid)
        out = await super()._call(rid)
        if self.dead:
            raise RuntimeError("RayActorError: the actor died unexpectedly")
        return out

    async def health(self):
        if self.dead:
            raise RuntimeError("EngineDeadError: EngineCore encountered an issue")
        return {"unfinished": 0}


def _ok(**kw):
    return MortalEngine({"alloc": 0.0, "alloc_remote": 0.0, "recv_done": 0.01}, end=0.05, first=0.02, **kw)


def _run(tmp_path, prefill, decode, kill, n=12, gap=0.1, probe_s=None):
    """``n`` requests ``gap`` apart through RequestFlow with its liveness check; ``kill(t)`` runs
    before each send at run time t. Returns outcomes, requests, engines and decisions."""
    spec = _spec()
    topo = build_topology(spec)
    with RunContext(spec, "testbed", "LC", 0, tmp_path, topo, {"requests": n}) as ctx:
        t0 = time.monotonic()
        clock = lambda: time.monotonic() - t0  # noqa: E731
        flow = RequestFlow(ctx, prefill, decode, spec.deadline_s, clock, vocab=2048, kv_bytes_per_token=KV,
                           block_tokens=spec.engine.kv_block_tokens)
        live = Liveness(ctx, flow, clock, 1.0, ["p0", "p1", "d0", "d1"])
        flow.on_engine_error = live.error

        async def go():
            tasks = []
            ticker = None
            if probe_s is not None:
                async def every():
                    while True:
                        await asyncio.sleep(probe_s)
                        live.tick(clock())
                ticker = asyncio.ensure_future(every())
            for i in range(n):
                kill(clock())
                tasks.append(asyncio.ensure_future(flow.handle(i, clock(), 256, 10)))
                await asyncio.sleep(gap)
            out = await asyncio.gather(*tasks)
            if ticker is not None:
                ticker.cancel()
            await asyncio.gather(*live.checks, return_exceptions=True)
            return out

        outcomes = asyncio.run(go())
    d = ctx.run_dir
    return outcomes, read_table(d, "requests"), read_table(d, "engines"), read_table(d, "decisions")


def test_a_decode_engine_that_dies_fails_its_requests_then_is_never_chosen_and_prefill_goes_on(tmp_path):
    slow = MortalEngine({"alloc": 0.0, "alloc_remote": 0.0, "recv_done": 0.01}, end=0.3, first=0.02)
    decode = [slow, _ok()]
    killed = []

    def kill(now):
        if now > 0.35 and not killed:  # requests are on it, mid-call
            killed.append(now)
            slow.die()

    outcomes, req, eng, dec = _run(tmp_path, [_ok(), _ok()], decode, kill)
    (row,) = eng.itertuples()
    assert (row.worker, row.pod, row.role) == (2, 2, "decode") and "EngineDeadError" in row.reason
    on_dead = req[req.decode_worker == 2]
    failed = on_dead[on_dead.outcome != "ok"]
    assert len(failed) > 0 and (failed.outcome == "error").all()
    assert set(failed.failed_stage) <= {"decode_queue"}  # where a request waits on its decode call
    assert (on_dead[on_dead.outcome == "error"].routed_s < row.time_s + 1e-9).all()
    # from the moment it is down, no decision chooses it, and every later request is served
    assert (dec[dec.time_s > row.time_s].decode_worker != 2).all()
    later = req[req.routed_s > row.time_s]
    assert len(later) > 0 and (later.outcome == "ok").all()
    assert set(later.prefill_worker) == {0, 1}  # both prefill engines went on serving


def test_a_dead_engine_cores_requests_fail_in_the_stage_its_actor_still_reads(tmp_path):
    # the decode engine's core dies while requests decode on it (its script: pulled at 0.01 s, first
    # token at 0.02 s, done at 0.3 s): the actor lives on and its stage log puts them in decode, where
    # the simulator's engine fault fails them too; a dead actor's leave the router's own view
    slow = MortalEngine({"alloc": 0.0, "alloc_remote": 0.0, "recv_done": 0.01}, end=0.3, first=0.02)
    killed = []

    def kill(now):
        if now > 0.35 and not killed:
            killed.append(now)
            slow.die(core=True)

    _, req, eng, _ = _run(tmp_path, [_ok(), _ok()], [slow, _ok()], kill)
    failed = req[req.outcome == "error"]
    assert len(failed) > 0 and (failed.decode_worker == 2).all()
    # those on it at the kill died decoding; a decode call sent to it after never reached it
    held = failed[failed.kv_start_s < killed[0]]
    assert len(held) > 0 and (held.failed_stage == "decode").all(), held
    assert set(failed.failed_stage) <= {"decode", "decode_queue"}, failed.failed_stage


def test_a_prefill_engine_found_down_by_the_periodic_check_before_any_call_fails(tmp_path):
    prefill = [_ok(), _ok()]
    killed = []

    def kill(now):
        if not killed:
            killed.append(now)
            prefill[0].die()  # dead from the start, between calls

    # the first requests may reach it (and fail at once); the periodic check finds it too
    outcomes, req, eng, dec = _run(tmp_path, prefill, [_ok(), _ok()], kill, n=10, gap=0.1, probe_s=0.05)
    (row,) = eng.itertuples()
    assert (row.worker, row.role) == (0, "prefill")
    assert row.time_s < 0.2  # at the first tick or the first failed call, whichever came first
    on_dead = req[req.prefill_worker == 0]
    assert (on_dead.outcome == "error").all() and (on_dead.failed_stage == "prefill_queue").all()
    assert (req[req.prefill_worker == 1].outcome == "ok").all() and (req.prefill_worker == 1).sum() >= 8


def test_a_slow_engine_is_not_taken_for_a_dead_one(tmp_path):
    class Busy(MortalEngine):
        async def health(self):
            await asyncio.sleep(5.0)  # an engine step holding the actor past the check's timeout

    prefill = [Busy({"alloc": 0.0}, end=0.05), _ok()]
    outcomes, req, eng, _ = _run(tmp_path, prefill, [_ok(), _ok()], lambda now: None, n=6, probe_s=0.1)
    assert eng.empty and outcomes == ["ok"] * 6


def test_an_engine_calls_exception_reaches_the_router_without_vllms_types():
    from testbed.engines.actor import _plain_errors
    from testbed.engines.engine import EngineError

    class EngineDeadError(Exception):  # stands for vLLM's (vllm/v1/engine/exceptions.py)
        pass

    @_plain_errors
    async def call():
        raise EngineDeadError("EngineCore encountered an issue")

    @_plain_errors
    async def stream():
        yield 1
        raise EngineDeadError("gone mid-stream")

    async def drain():
        return [x async for x in stream()]

    with pytest.raises(EngineError, match="^EngineDeadError: EngineCore encountered an issue$") as info:
        asyncio.run(call())
    assert info.value.__cause__ is None and info.value.__suppress_context__
    with pytest.raises(EngineError, match="EngineDeadError: gone mid-stream"):
        asyncio.run(drain())


def test_the_routers_modules_and_an_engine_error_do_not_import_vllm_or_torch():
    """Importing vLLM (and torch) into the router's process took 7-10 s of its event loop."""
    import subprocess
    import sys

    code = ("import pickle, sys\n"
            "import testbed.router.flow, testbed.router.exporter, core.run\n"
            "from testbed.engines.engine import EngineError\n"
            "pickle.loads(pickle.dumps(EngineError('EngineDeadError: x')))\n"
            "print([m for m in ('vllm', 'torch') if m in sys.modules])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_restarted_engine_is_found_up_by_the_periodic_check_and_chosen_again(tmp_path):
    # a decode engine dies (its core: the actor answers again once restarted), is found down, then
    # comes back: the next periodic check records it up and the router sends requests to it again
    dying = _ok()
    events = []

    def kill(now):
        if now > 0.3 and not events:
            events.append(("kill", now))
            dying.die(core=True)
        elif events and len(events) == 1 and now > 0.9:
            events.append(("restart", now))
            dying.dead = False  # a new engine core answers its health check and its calls

    outcomes, req, eng, dec = _run(tmp_path, [_ok(), _ok()], [dying, _ok()], kill, n=20, gap=0.1, probe_s=0.05)
    (down,), (up,) = eng[eng.state == "down"].itertuples(), eng[eng.state == "up"].itertuples()
    assert (down.worker, up.worker) == (2, 2) and events[0][1] <= down.time_s < up.time_s
    assert events[1][1] <= up.time_s < events[1][1] + 0.2  # at the next periodic check after the restart
    assert not ((dec.time_s > down.time_s) & (dec.time_s < up.time_s) & (dec.decode_worker == 2)).any()
    assert ((dec.time_s > up.time_s) & (dec.decode_worker == 2)).any()
    assert (req[req.routed_s > up.time_s].outcome == "ok").all()


def test_the_liveness_rule_changes_state_only_on_an_error_or_an_answer_from_a_down_engine(tmp_path):
    """core/liveness.py, the rule both worlds feed: a dead answer puts a live engine down, an alive one
    puts a down engine up, no answer (a busy engine) changes nothing; each change recorded once."""
    from core.liveness import ALIVE, DEAD, NO_ANSWER, EngineLiveness, next_state

    assert [next_state(False, a) for a in (ALIVE, DEAD, NO_ANSWER)] == [False, True, False]
    assert [next_state(True, a) for a in (ALIVE, DEAD, NO_ANSWER)] == [False, True, True]
    with pytest.raises(ValueError, match="unknown liveness answer 'late'"):
        next_state(False, "late")  # type: ignore[arg-type]
    spec = _spec()
    with RunContext(spec, "testbed", "LC", 0, tmp_path, build_topology(spec), {"requests": 0}) as ctx:
        live = EngineLiveness(ctx)
        seen = [live.answered(1.0, 2, NO_ANSWER, ""), live.answered(2.0, 2, DEAD, "EngineDeadError"),
                live.answered(3.0, 2, DEAD, "again"), live.answered(4.0, 2, NO_ANSWER, ""),
                live.answered(5.0, 2, ALIVE, "restarted"), live.answered(6.0, 2, ALIVE, "still")]
        assert seen == [None, True, None, None, False, None] and not live.is_down(2)
    eng = read_table(ctx.run_dir, "engines")
    assert list(zip(eng.time_s, eng.worker, eng.state, eng.reason)) == [(2.0, 2, "down", "EngineDeadError"),
                                                                   (5.0, 2, "up", "restarted")]
