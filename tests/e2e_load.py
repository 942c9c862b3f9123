"""The throttled job's load sized to the engines at hand (tests/e2e_cluster.py runs it after the
engines' calibration): the job asks what a link fault decides, so nothing else may sit near the deadline.

Its workload (600-700-token prompts at 1 request/s, Random over 2 prefill pods) was sized on engines
that prefill 4,100-14,900 tokens/s, where a prefill pod is busy 2-8% of the time. On a CPU without
AVX-512 they prefill 390-580 tokens/s (docs/performance.md), the pods are busy about all the time,
batches of three prompts took 4.6-5.8 s, and requests that never crossed the faulted link ended
within a second of the 10 s deadline on either side: the calibrated twin, whose prefill under that
contention ran 1.3-1.7 times the testbed's, ended some of them otherwise (2026-11-30, three suites:
the twin failed 6, 4 and 2 of the 8 requests where the testbed failed 2, 2 and 3;
docs/history/2026-11-30-e2e-load.md).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from core.records import read_table
from core.spec.model import ExperimentSpec

# Each rate tried is this share of the one before, from the job's own, down to 0.8**10 = 0.11 of it.
RATE_STEP = 0.8
RATE_TRIES = 11
# The twin's requests clear of the fault end within this share of the deadline: a factor of 2 over
# the twin's own time covers its prefill running up to 1.7 times the testbed's under contention.
DEADLINE_SHARE = 0.5


def twin_requests(spec: ExperimentSpec, calibration: Path, policy: str) -> pd.DataFrame:
    """The requests of ``spec``'s seed 0 under ``policy`` in the simulator calibrated to ``calibration``:
    the twin the testbed's run is compared with."""
    from core.calibration.fit import apply_calibration, load_calibration
    from simulator.run import run_sim

    with tempfile.TemporaryDirectory() as tmp:
        return read_table(run_sim(apply_calibration(spec, load_calibration(calibration)), policy, 0, Path(tmp)),
                          "requests")


def sized_to_engines(build: Callable[[float], ExperimentSpec], rate_rps: float, calibration: Path,
                     policy: str) -> ExperimentSpec:
    """``build(rate)`` at ``rate_rps``, or at the highest of its shares RATE_STEP**k below it, at which
    the simulator calibrated to these engines (``calibration``), the twin the job is compared with,
    ends every request that passes no faulted pod ok, within DEADLINE_SHARE of the deadline. The same
    requests in the same order either way (the arrivals of a seed scale with 1/rate); on engines as
    fast as the shipped spec's, the job's own rate."""
    for k in range(RATE_TRIES):
        spec = build(rate_rps * RATE_STEP ** k)
        faulted = {p for f in spec.faults for p in f.pods}
        req = twin_requests(spec, calibration, policy)
        clear = req[~req.prefill_pod.isin(faulted) & ~req.decode_pod.isin(faulted)]
        took = (clear.end_s - clear.arrival_s).where(clear.outcome == "ok")  # NaN: it failed
        if (took <= DEADLINE_SHARE * spec.deadline_s).all():
            return spec
    raise RuntimeError(f"{spec.name}: even at {spec.workload.arrival.rate_rps:.3g} requests/s the twin calibrated to "
                       f"{calibration} fails a request clear of the fault or ends one past {DEADLINE_SHARE} of "
                       f"the {spec.deadline_s} s deadline")
