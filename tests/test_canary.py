"""Canaries: requests whose tokens are checked against a single-engine greedy reference, so a
corrupted KV transfer ends as outcome ``corrupt`` instead of a success (core/canary.py).

The verdict and the request flow here (scripted engines, as in test_stages); a real corrupted
transfer between real engines is in test_runtime_engine.py, the canaries of real runs in
test_testbed_e2e_jobs.py, the simulator's lease in test_sim.py.
"""

from __future__ import annotations

import asyncio
import math
import time

import pytest

from core.canary import NEAR_TIE_NATS, canary_ids, reference, summary, verdict
from core.experiment import build_topology
from core.records import read_table
from core.run import RunContext
from testbed.engines.engine import DecodeResult
from testbed.router.flow import RequestFlow

from test_stages import KV, ScriptedEngine, _spec


def test_canaries_spread_over_the_run_first_and_last_included():
    assert canary_ids(100, 4) == [0, 33, 66, 99]
    assert canary_ids(3, 10) == [0, 1, 2]  # never more than the run has
    assert canary_ids(10, 0) == [] and canary_ids(0, 4) == []
    assert canary_ids(1, 4) == [0]


def test_a_divergence_is_corrupt_unless_it_took_the_references_second_choice_at_a_near_tie():
    # per step the reference's top two (logprob, token), the greedy token first
    ref = reference([5, 6, 7, 8], [(-0.1, -4.0), (-0.2, -0.3), (-0.05, -6.0), (-0.1,)],
                    [(5, 11), (6, 9), (7, 12), (8,)])
    assert ref.gaps[1] == pytest.approx(0.1) and math.isnan(ref.gaps[3]) and ref.runner_up == (11, 9, 12, -1)
    assert verdict(ref, [5, 6, 7, 8]).verdict == "equal"
    assert verdict(ref, [5, 6, 7]).verdict == "equal"  # compared up to the shorter
    v = verdict(ref, [5, 9, 1, 1])  # the second choice where the top two were 0.1 nats apart
    assert (v.verdict, v.position) == ("near_tie", 1) and v.gap < NEAR_TIE_NATS
    assert verdict(ref, [5, 4, 1, 1]).verdict == "corrupt"  # a near-tie, but a token neither top two
    v = verdict(ref, [5, 6, 12, 8])  # the second choice, but a 5.95-nat margin flipped: not numerics
    assert (v.verdict, v.position, v.gap) == ("corrupt", 2, pytest.approx(5.95))
    assert verdict(ref, [9, 6, 7, 8]).verdict == "corrupt"
    assert verdict(ref, [5, 6, 7, 9]).verdict == "corrupt"  # no top-2 gap known: not excused
    assert verdict(ref, [5, 6, 12, 8], tie_nats=6.0).verdict == "near_tie"
    # the greedy token listed second (an exact tie in the ranking): the other one is the second choice
    assert reference([5], [(-0.1, -0.1)], [(7, 5)]).runner_up == (7,)
    # without the tokens (the gap alone decides)
    assert verdict(reference([5, 6], [(-0.1, -4.0), (-0.2, -0.3)]), [5, 4]).verdict == "near_tie"


def test_the_summary_counts_each_verdict_and_the_canaries_without_one():
    ref = reference([1, 2], [(-0.1, -5.0), (-0.1, -0.2)])
    refs = {0: ref, 5: ref, 9: ref, 12: ref}
    got = {0: verdict(ref, [1, 2]), 5: verdict(ref, [1, 3]), 9: verdict(ref, [4, 2])}
    s = summary(refs, got)
    assert s["ids"] == [0, 5, 9, 12]
    assert (s["checked"], s["equal"], s["near_tie"], s["corrupt"], s["unchecked"]) == (3, 1, 1, 1, 1)
    assert s["diverged"] == {"5": {"verdict": "near_tie", "position": 1, "gap": 0.1},
                             "9": {"verdict": "corrupt", "position": 0, "gap": 4.9}}


class TokenEngine(ScriptedEngine):
    """A decode engine whose output is a given token sequence (what it decoded from the KV it read)."""

    def __init__(self, tokens, **kw) -> None:
        super().__init__({"alloc_remote": 0.0, "recv_done": 0.01}, end=0.03, first=0.02, **kw)
        self.tokens = tuple(tokens)

    async def decode(self, rid, ids, max_tokens, kv_transfer_params=None):
        res = await super().decode(rid, ids, max_tokens, kv_transfer_params)
        return DecodeResult(rid, self.tokens[:max_tokens], res.submitted_s, res.first_token_s, res.finished_s,
                            res.finish_reason, stages=res.stages)


def _flow_run(tmp_path, decoded, refs):
    spec = _spec(deadline_s=5.0)
    with RunContext(spec, "testbed", "LC", 0, tmp_path, build_topology(spec), {"requests": 2}) as ctx:
        t0 = time.monotonic()
        flow = RequestFlow(ctx, [ScriptedEngine({"alloc": 0.0}, end=0.01)], [TokenEngine(decoded)], spec.deadline_s,
                           lambda: time.monotonic() - t0, vocab=2048, kv_bytes_per_token=KV,
                           block_tokens=spec.engine.kv_block_tokens, canaries=refs)

        async def both():
            await asyncio.gather(flow.handle(0, 0.0, 256, 4), flow.handle(1, 0.0, 256, 4))

        asyncio.run(both())
    return read_table(ctx.run_dir, "requests").set_index("request_id"), flow


def test_a_canary_decoded_from_the_wrong_kv_ends_corrupt_in_the_transfer_and_others_stay_ok(tmp_path):
    # the reference says 1 2 3 4 with clear margins; the decode engine returns 1 2 9 9 for every
    # request: request 0 is a canary and is caught, request 1 is not checked (what a real router sees)
    ref = reference([1, 2, 3, 4], [(-0.1, -5.0)] * 4)
    r, flow = _flow_run(tmp_path / "a", [1, 2, 9, 9], {0: ref})
    assert (r.loc[0, "outcome"], r.loc[0, "failed_stage"]) == ("corrupt", "kv_transfer")
    assert not math.isnan(r.loc[0, "end_s"])  # it decoded to its end: vLLM called it a success
    assert r.loc[1, "outcome"] == "ok"
    assert flow.canary_verdicts[0].position == 2 and flow.outcomes == {"corrupt": 1, "ok": 1}
    # the same tokens, where the reference's second choice at a near-tie was 9: numerics, ok
    tie = reference([1, 2, 3, 4], [(-0.1, -5.0), (-0.1, -5.0), (-0.1, -0.4), (-0.1, -5.0)],
                    [(1, 7), (2, 7), (3, 9), (4, 7)])
    r, flow = _flow_run(tmp_path / "b", [1, 2, 9, 9], {0: tie, 1: tie})
    assert (r.outcome == "ok").all() and [v.verdict for v in flow.canary_verdicts.values()] == ["near_tie"] * 2
