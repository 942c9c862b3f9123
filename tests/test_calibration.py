"""Calibration: the fits recover known parameters, the file round-trips, bad files are one line."""

import json

import numpy as np
import pytest

from core.calibration.fit import (CalibrationError, apply_calibration, calibration_from_fits, fit_decode, fit_prefill,
                              fit_pull, fit_unshaped_pull, load_calibration, save_calibration, stall_stats)
from core.experiment import build_topology
from core.spec.model import load_spec
from core.topology import GBPS

pytestmark = pytest.mark.background  # needs no core of its own: under -n, beside the others (tests/conftest.py)

TRUE = {"overhead": 0.12, "per_token": 1 / 1800.0, "base": 0.018, "per_seq": 0.0015, "per_kv": 2e-7,
        "latency": 0.015, "wire": 1.05, "unshaped_Bps": 0.3e9}


PLANTED: dict[str, int] = {}


def _stalls(rng: np.random.Generator, y: np.ndarray, name: str, share: float = 0.1) -> np.ndarray:
    """What this machine does to a measurement: a few percent noise, and now and then a stall of seconds."""
    y = y * rng.normal(1.0, 0.03, y.size)
    hit = rng.random(y.size) < share
    PLANTED[name] = int(hit.sum())
    return y + hit * rng.uniform(2.0, 20.0, y.size)


def _synthetic(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    tokens = np.repeat([160, 384, 768, 1536, 2560, 768, 1536, 2048], 4).astype(float)
    pre = _stalls(rng, TRUE["overhead"] + tokens * TRUE["per_token"], "prefill")
    batch = np.tile([1, 2, 4, 8, 16], 8).astype(float)
    kv = batch * rng.choice([272.0, 1040.0], batch.size)
    step = _stalls(rng, TRUE["base"] + TRUE["per_seq"] * batch + TRUE["per_kv"] * kv, "decode", share=0.05)
    nbytes = np.repeat([2, 5, 17, 3], 6) * 2.0**20
    rate = np.repeat([250e6, 25e6, 5e6, 2.5e6], 6)
    pull = _stalls(rng, TRUE["latency"] + 8 * nbytes * TRUE["wire"] / rate, "pull")
    ub = np.repeat([2, 4, 6, 12, 20], 5) * 2.0**20
    upull = _stalls(rng, TRUE["latency"] + ub / TRUE["unshaped_Bps"], "unshaped", share=0.08)
    return dict(tokens=tokens, pre=pre, batch=batch, kv=kv, step=step, nbytes=nbytes, rate=rate, pull=pull,
                ub=ub, upull=upull)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_fits_recover_known_parameters_within_5_percent_despite_host_stalls(seed):
    d = _synthetic(seed)
    pre = fit_prefill(d["tokens"], d["pre"])
    assert pre.coef[0] == pytest.approx(TRUE["overhead"], rel=0.05)
    assert pre.coef[1] == pytest.approx(TRUE["per_token"], rel=0.05)
    dec = fit_decode(d["batch"], d["kv"], d["step"])
    assert dec.coef[0] == pytest.approx(TRUE["base"], rel=0.05)
    assert dec.coef[1] == pytest.approx(TRUE["per_seq"], rel=0.05)
    # the KV term is small beside the others at these sizes: known to within 5% of the step it explains
    assert abs(dec.coef[2] - TRUE["per_kv"]) * 16 * 1040 < 0.05 * (TRUE["base"] + 16 * TRUE["per_seq"])
    pull = fit_pull(d["nbytes"], d["rate"], d["pull"])
    assert pull.coef[1] == pytest.approx(TRUE["wire"], rel=0.05)
    un = fit_unshaped_pull(d["ub"], d["upull"])
    assert 1 / un.coef[1] == pytest.approx(TRUE["unshaped_Bps"], rel=0.05)
    assert un.coef[0] == pytest.approx(TRUE["latency"], rel=0.05)
    # the stalls are reported, not fitted: exactly the ones planted, and the fit explains the rest
    for name, f in zip(("prefill", "decode", "pull", "unshaped"), (pre, dec, pull, un)):
        assert f.n_outliers == PLANTED[name] and f.r2 > 0.95, name


def test_an_ordinary_least_squares_line_would_not_recover_them():
    """The robust loss is what makes the test above pass (so it checks something)."""
    d = _synthetic(0)
    ols = np.linalg.lstsq(np.c_[np.ones_like(d["tokens"]), d["tokens"]], d["pre"], rcond=None)[0]
    assert abs(ols[0] - TRUE["overhead"]) > 0.05 * TRUE["overhead"] or abs(ols[1] - TRUE["per_token"]) > 0.05 * TRUE["per_token"]


def test_stalls_are_counted_from_step_gaps():
    gaps = [0.02] * 95 + [0.5, 1.0, 3.0, 0.03, 0.025]
    s = stall_stats(gaps, 0.02)
    assert s["n_steps"] == 100 and s["n_stalls"] == 3
    assert s["stall_rate_per_step"] == pytest.approx(0.03)
    assert s["stall_max_s"] == 3.0 and s["stall_p50_s"] == 1.0


def _calibration():
    d = _synthetic(0)
    return calibration_from_fits(
        created="2026-11-22T00:00:00+00:00", source={"model": "tiny"},
        prefill=fit_prefill(d["tokens"], d["pre"]), decode=fit_decode(d["batch"], d["kv"], d["step"]),
        pull=fit_pull(d["nbytes"], d["rate"], d["pull"]), unshaped=fit_unshaped_pull(d["ub"], d["upull"]),
        kv_bytes_per_token=8192, kv_block_tokens=128, decode_kv_tokens=32768, handshake_s=[1.4, 1.6],
        noise=stall_stats([0.02] * 10, 0.02), samples={"prefill_tokens_s": [[160, 0.2]]})


def test_a_calibration_round_trips_and_becomes_the_simulators_model(tmp_path):
    cal = _calibration()
    path = save_calibration(cal, tmp_path / "c" / "calibration.json")
    back = load_calibration(path)
    assert back == cal
    spec = load_spec(None, default="testbed.yaml")
    sim = apply_calibration(spec, back)
    e = sim.engine
    assert e.prefill_tokens_per_s == pytest.approx(1 / TRUE["per_token"], rel=0.05)
    assert e.kv_block_tokens == 128 and e.decode_kv_tokens == 32768
    assert e.kv_transfer_latency_s == cal.engine.kv_transfer_latency_s
    # batch limits are the spec's (they are how the real engines were started), not measured
    assert (e.prefill_slots, e.decode_max_batch) == (spec.engine.prefill_slots, spec.engine.decode_max_batch)
    topo = build_topology(sim)
    # healthy links: the unshaped rate measured, headers included; a fault's r still of the spec's baseline
    assert topo.nic_Bps == pytest.approx(cal.network.unshaped_gbps * cal.network.kv_wire_overhead * GBPS)
    assert topo.core_link_Bps(0.01) == pytest.approx(0.01 * spec.topology.link_baseline_gbps * GBPS)
    assert sim.workload == spec.workload and sim.faults == spec.faults and sim.deadline_s == spec.deadline_s


@pytest.mark.parametrize("content, needle", [
    (None, "calibration file not found"),
    ("{not json", "invalid JSON"),
    ("[1, 2]", "a JSON object expected"),
    ('{"version": 1}', "invalid calibration at created"),
])
def test_a_missing_or_malformed_calibration_file_is_one_line(tmp_path, content, needle):
    path = tmp_path / "cal.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(CalibrationError) as e:
        load_calibration(path)
    assert needle in str(e.value) and "\n" not in str(e.value) and str(path) in str(e.value)


def test_a_calibration_with_a_wrong_value_names_it(tmp_path):
    data = _calibration().model_dump(mode="json")
    data["engine"]["prefill_tokens_per_s"] = -3
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(data))
    with pytest.raises(CalibrationError, match=r"engine\.prefill_tokens_per_s"):
        load_calibration(path)


def test_the_calibrations_pulls_are_sized_for_the_models_kv_and_the_rate():
    """The shaped pulls last seconds whatever the model and NIC: on the tiny model (8 KiB of KV per
    token, blocks of 128) at 250 Mbit/s, the prompts of 4 and 16, 1 and 4, 1 and 2, and 1 blocks the
    calibration always took, and a hanging pull of 6; on an 8B model's KV (128 KiB per token,
    CUDA's blocks of 16) at 100 Gbit/s, many more blocks, never past the context."""
    from testbed.calibration.calibrate import HANG_S, SHAPED, pull_blocks

    def sizes(kvpt, block, baseline_bps, max_len):
        return [tuple(pull_blocks(s, f * baseline_bps, kvpt, block, max_len) for s in secs) for f, secs in SHAPED]

    assert sizes(8192, 128, 250e6, 4096) == [(4, 16), (1, 4), (1, 2), (1,)]
    assert pull_blocks(HANG_S, SHAPED[-1][0] * 250e6, 8192, 128, 4096) == 6
    big = sizes(131072, 16, 100e9, 8192)
    most = (8192 - 1 - 8) // 16  # a prompt of b blocks and a half within the context
    assert big[0] == (most, most) and big[-1][0] == round(6.7 * 1e9 / 8 / (131072 * 16)) - 1
    assert all(b * 16 + 8 < 8192 for bs in big for b in bs)
    assert pull_blocks(0.001, 1e6, 8192, 128, 4096) == 1  # at least one whole block moves beside the half
