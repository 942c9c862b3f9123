"""The end-to-end cluster's jobs sized to the engines at hand by their calibration (tests/e2e_death.py,
tests/e2e_load.py), checked in the calibrated twin on two calibrations: engines as fast as the AVX-512
machines' (docs/twin.md) and as slow as a CPU without AVX-512 (docs/performance.md), both on the 2-core
host with its demand by state as measured there (2026-11-30)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from builders import shipped_spec_dict

# (prefill s/token, decode step base, per sequence, per KV token): the engines' fits
ENGINES = {"fast": (1 / 12_500, 0.0036, 0.0008, 4e-7), "slow": (1 / 407.6, 0.0117, 0.0030, 1.7e-6)}
DEMAND = {"hold": 0.55, "pull": 0.53, "decode": 1.58, "background": 0.50}  # cores, the slow machine's calibration


@pytest.fixture(scope="module")
def calibrations(tmp_path_factory) -> dict[str, Path]:
    from core.calibration.fit import HostCalibration, LinearFit, calibration_from_fits, save_calibration

    def fit(*coef: float) -> LinearFit:
        return LinearFit(np.array(coef, float), 1.0, 10, 0, 0.0, 0.0)

    out = tmp_path_factory.mktemp("calibrations")
    host = HostCalibration(cores=2.0, engines=4, hosts=1, gpus_per_engine=0, shared=True, demand=DEMAND, spin_s=0.0)
    return {name: save_calibration(calibration_from_fits(
        created="2026-11-30T00:00:00+00:00", source={"model": "tiny"}, prefill=fit(0.0, per_token),
        decode=fit(base, per_seq, per_kv), pull=fit(0.0, 1.04), unshaped=fit(0.0003, 1 / 0.25e9),
        kv_bytes_per_token=8192, kv_block_tokens=128, decode_kv_tokens=32768, handshake_s=[], noise={},
        samples={}, host=host), out / f"{name}.json") for name, (per_token, base, per_seq, per_kv) in ENGINES.items()}


def _base() -> dict:
    from e2e_cluster import LEASE_S

    base = shipped_spec_dict("testbed.yaml", faults=[])
    base["engine"] = {**base["engine"], "kv_lease_s": LEASE_S}
    return base


def _twin(spec, calibration: Path, policy: str):
    from e2e_load import twin_requests

    return twin_requests(spec, calibration, policy)


@pytest.mark.parametrize("engines", ["fast", "slow"])
def test_the_engine_faults_first_kill_ends_one_decode_on_pod_2_in_the_twin(calibrations, engines):
    """The first kill lands in the middle of a decode that has pod 2 to itself in the twin, early
    enough for requests after the second kill, on outputs the engines decode in 2.3 s (256 tokens on
    fast ones): in the twin run with the faults, exactly that request fails, in its decode."""
    from e2e_death import DEATH_OUTPUT_MAX, KILL_GAP_S, engine_death_spec

    spec = engine_death_spec(_base(), calibrations[engines])
    tokens = spec.workload.output.value
    assert (tokens == DEATH_OUTPUT_MAX) if engines == "fast" else (16 <= tokens < DEATH_OUTPUT_MAX), tokens
    first, second = (f.start_s for f in spec.faults)
    assert first >= 15.0 and second == pytest.approx(first + KILL_GAP_S)
    req = _twin(spec, calibrations[engines], "LC")
    assert req.arrival_s.max() > second + spec.testbed.engine_check_s  # requests after pod 0's death is seen
    on2 = req[(req.decode_pod == 2) & (req.outcome == "error")]
    assert len(on2) == 1 and on2.failed_stage.iloc[0] == "decode", on2
    assert on2.first_token_s.iloc[0] < first, on2
    # no request meets a limit: those on live engines have their first token and their end within a
    # quarter of either limit, a margin over the testbed running 3.3 times slower than the twin under the
    # other test worker's load (tests/e2e_death.py DEATH_DEADLINE_S)
    assert set(req.outcome) == {"ok", "error"}, req.outcome.value_counts()
    ok = req[req.outcome == "ok"]
    assert (ok.end_s - ok.arrival_s).max() <= spec.deadline_s / 4, ok
    assert (ok.first_token_s - ok.arrival_s).max() <= spec.ttft_timeout_s / 4, ok


def test_the_throttled_job_keeps_its_rate_on_fast_engines_and_slows_until_the_twin_clears_the_deadline(calibrations):
    from e2e_cluster import LINK_FAULT_RPS, link_fault_spec
    from e2e_load import DEADLINE_SHARE, RATE_STEP, sized_to_engines

    base = _base()
    rates = {}
    for engines, path in calibrations.items():
        spec = sized_to_engines(lambda rate: link_fault_spec(base, rate), LINK_FAULT_RPS, path, "Random")
        rates[engines] = rate = spec.workload.arrival.rate_rps
        assert spec.faults[0].duration_s == link_fault_spec(base, rate).faults[0].duration_s  # the fault follows it
        for r, fits in ((rate, True), (rate / RATE_STEP, False)):
            if r > LINK_FAULT_RPS:
                continue
            req = _twin(link_fault_spec(base, r), path, "Random")
            clear = req[(req.prefill_pod != 0) & (req.decode_pod != 0)]
            took = (clear.end_s - clear.arrival_s).where(clear.outcome == "ok")
            assert bool((took <= DEADLINE_SHARE * spec.deadline_s).all()) is fits, (engines, r, clear)
            # and the fault decides the rest: every pull from pod 0 given up in kv_transfer
            hit = req[req.prefill_pod == 0]
            assert len(hit) and (hit.failed_stage == "kv_transfer").all(), hit
    assert rates["fast"] == LINK_FAULT_RPS and rates["slow"] < LINK_FAULT_RPS, rates
