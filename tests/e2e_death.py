"""The end-to-end cluster's engine fault (tests/e2e_cluster.py runs it last, then its repeat): its
spec, sized to the engines at hand by their calibration: the output length they decode in the time the
workload was sized around, and the first kill placed in the middle of a decode of the calibrated
simulator, the twin the comparison runs."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from core.spec.model import ExperimentSpec, parse_spec

DEATH_REQUESTS = 30
# Between the kills: the test needs requests routed after pod 2's death is seen and at least 4 s
# before pod 0's. At 0.5 requests/s an 8 s gap left a window of under a second once pod 2's death
# was seen 5 s after its kill (fresh clone, 2026-11-23: no request in it); 16 s leaves about 7 s.
KILL_GAP_S = 16.0
DEATH_REPEAT = "e2e_engine_death_repeat"  # the same run again, on engines restarted: the testbed's repeatability
# The least margin the first kill needs (engine_death_spec): 0.3 s into a decode landed inside it in
# both worlds on engines with AVX-512, whose stages the twin matches within 10% (docs/twin.md).
MIN_MARGIN_S = 0.3
# The decode the workload was sized around: 256 tokens, 2.3 s at the shipped spec's engines (a step of
# 9.1 ms), long enough for a kill to land inside it, short enough to end well within the deadline.
# Slower engines decode as long as that in fewer tokens: on a CPU without AVX-512 (a step of 14.9 ms
# calibrated, about 32 ms a token under the job's load) 256 tokens took 8-14 s, and requests routed
# before either kill ran past the deadline in every run there (docs/history/2026-11-30-probe-reads.md).
DEATH_OUTPUT_MAX = 256
DEATH_DECODE_S = 2.3
# No request of this job may end by a limit: one on a dead engine ends with its error (a failed call,
# or the liveness check every testbed.engine_check_s), one on live engines with its output. At the base
# spec's 15 s deadline a request on live engines ran out of it (CI at 8e18f6f, both runs): under the
# other test worker's load the engines decoded a token in 33 ms where their calibration in the same
# suite took 9 ms, the twin's 2.2-3.8 s decodes took 3.4-10.7 s, first tokens came up to 7.0 s and
# ends up to 14.4 s after arrival, and one request ran past 15 s. The first token within 20 s, the
# longest first-token limit of the jobs (the KV lease, e2e_cluster.LEASE_S, is derived from it); the
# end within 60 s, the base's ttft_timeout_s: each about three and four times what that run took
# (docs/history/2026-11-30-ci-8e18f6f.md).
DEATH_TTFT_S = 20.0
DEATH_DEADLINE_S = 60.0


def death_output_tokens(calibration: Path, prompt_tokens: float = 350.0) -> int:
    """The engine fault's output length: DEATH_OUTPUT_MAX tokens, or as many as the calibrated engines
    decode alone in DEATH_DECODE_S (core/engine_timing.py, one sequence of the workload's mean prompt
    holding half its output), whichever is fewer: the whole length on engines as fast as the
    shipped spec's or faster (docs/twin.md's calibrations)."""
    from core.calibration.fit import load_calibration
    from core.engine_timing import decode_step_s

    e = load_calibration(calibration).engine
    step = decode_step_s(e.decode_step_base_s, e.decode_step_per_seq_s, e.decode_step_per_kv_token_s, 1,
                         prompt_tokens + DEATH_OUTPUT_MAX / 2)
    return int(min(DEATH_OUTPUT_MAX, max(16, round(DEATH_DECODE_S / step))))


def engine_death_spec(base: dict, calibration: Path) -> ExperimentSpec:
    """LC while an engine fault kills pod 2's decode engine core, then, KILL_GAP_S later, pod 0's
    prefill engine actor (SIGKILL each, by the pod's fault agent: a crash or the OOM killer); the
    run goes on with pods 1 and 3. At 0.5 requests/s: once pod 2 is gone, pod 3 decodes everything alone.

    The first kill lands in a decode on pod 2 in the run of the same workload without the fault by the
    simulator calibrated to these engines (``calibration``), the twin the comparison runs, chosen (below)
    so that the testbed's runs kill the same request while their stages start within a margin of the
    twin's. A kill placed by the shipped spec's engines missed the decode in the twin on engines slower
    (2026-11-30: 0.3 s after the shipped engines' first token, the request was still in prefill on a CPU
    without AVX-512) and faster (2026-11-26: 1.0 s in, the decode had ended 0.27 s before) than them."""
    from e2e_load import twin_requests

    spec = {**base, "name": "e2e_engine_death", "policies": ["LC"], "faults": [],
            "deadline_s": DEATH_DEADLINE_S, "ttft_timeout_s": DEATH_TTFT_S,
            "description": "pod 2's decode engine core, then pod 0's prefill engine actor, SIGKILLed",
            "workload": {"arrival": {"kind": "poisson", "rate_rps": 0.5}, "max_requests": DEATH_REQUESTS,
                         "prompt": {"kind": "uniform", "low": 300, "high": 400},
                         "output": {"kind": "fixed", "value": death_output_tokens(calibration)}}}
    req = twin_requests(parse_spec(spec), calibration, "LC")
    # The request whose decode the first kill lands in, chosen so that the testbed's runs kill it too:
    # * routed to pod 2 whatever the testbed's timing: neither decode pod holds a request for a
    #   margin around its routing, so LC breaks a tie there, by a turn that counts decisions, the same
    #   in both worlds (core/policies/pickers.py), where a busy pod 2 sent it to pod 3 in one run of two;
    # * the kill in the middle of the longest stretch of its decode that no other request depends on
    #   pod 2 in (from its routing to its end: one in prefill elsewhere would fail its pull too);
    # * after 15 s, off the liveness checks' grid (every testbed.engine_check_s from the run's start),
    #   and early enough that requests arrive after pod 0's death is seen (a liveness check after the
    #   second kill at the latest), two of them on average: a kill at 57.3 s put the second after the
    #   last arrival, and no one saw it (2026-11-30).
    # The widest margin wins: the worlds may disagree by that much on when each stage starts.
    check_s = parse_spec(spec).testbed.engine_check_s
    latest = float(req.arrival_s.max()) - KILL_GAP_S - check_s - 2 / spec["workload"]["arrival"]["rate_rps"]
    decoding = req[req.decode_pod.isin([2, 3])]
    best, kill = 0.0, None
    for r in decoding[(decoding.decode_pod == 2) & (decoding.first_token_s > 15.0)].itertuples():
        others = decoding[decoding.request_id != r.request_id]
        on2 = others[others.decode_pod == 2]
        mid, half = _longest_free(r.first_token_s, r.end_s, zip(on2.routed_s, on2.end_s))
        routed = float(np.maximum(others.routed_s - r.routed_s, r.routed_s - others.end_s).min())
        margin = min(half, routed)
        if mid <= latest and margin > best:
            best, kill = margin, round(mid, 2)
    if kill is None or best < MIN_MARGIN_S:
        raise RuntimeError(f"no decode on pod 2 from 15 to {latest:.1f} s has {MIN_MARGIN_S} s to itself in the "
                           f"calibrated twin ({calibration}): the widest margin is {best:.2f} s")
    return parse_spec({**spec, "faults": [
        {"kind": "engine", "pods": [2], "role": "decode", "process": "core", "start_s": kill},
        {"kind": "engine", "pods": [0], "role": "prefill", "process": "actor", "start_s": round(kill + KILL_GAP_S, 2)}]})


def _longest_free(lo: float, hi: float, busy: Iterable[tuple[float, float]]) -> tuple[float, float]:
    """The middle of the longest stretch of [lo, hi] that no interval of ``busy`` covers, and half its
    length (0 where they cover all of it)."""
    free, t = [], lo
    for a, b in sorted((max(lo, a), min(hi, b)) for a, b in busy if a < hi and b > lo):
        if a > t:
            free.append((t, a))
        t = max(t, b)
    if t < hi:
        free.append((t, hi))
    a, b = max(free, key=lambda x: x[1] - x[0], default=(lo, lo))
    return float(a + b) / 2, float(b - a) / 2
