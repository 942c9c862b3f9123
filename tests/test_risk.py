import numpy as np
import pytest

from core.policies import Weights
from core.risk import RiskPriceEstimator

pytestmark = pytest.mark.background  # needs no core of its own: under -n, beside the others (tests/conftest.py)

BW0 = np.full(4, 100.0)


def _est(**w):
    return RiskPriceEstimator(4, Weights(**w), window_s=10.0, bucket_s=1.0)


def test_price_rises_with_timeouts_and_falls_back_after_recovery():
    est = _est(alpha=0.0, beta=0.0, gamma=1.0, eta=0.0)
    util = np.zeros(4)
    prices = []
    for t in range(40):
        now = float(t)
        for _ in range(10):
            # pod 1 times out on 60% of its requests between t=5 and t=15
            bad = 5 <= t < 15 and _ < 6
            est.observe(now, 1, 2, "timeout" if bad else "ok", "kv_transfer" if bad else None)
            est.observe(now, 0, 3, "ok", None)
        prices.append(est.update(now + 0.5, util, BW0, BW0).price.copy())
    p = np.array(prices)
    assert p[:5, 1].max() == 0.0
    assert p[14, 1] > 0.5  # 60% of the window's requests timed out
    assert np.all(np.diff(p[5:15, 1]) >= 0)  # rises while timeouts accumulate
    assert p[14, 0] == 0.0  # a pod that did not time out is not charged
    assert p[39, 1] == 0.0  # 10 s window: back to zero long after recovery
    assert p[20, 1] < p[14, 1]  # already falling
    # a kv_transfer timeout is charged to both ends of the transfer
    assert p[14, 2] == p[14, 1]


def test_stage_attribution_of_charges():
    est = _est(alpha=0.0, beta=0.0, gamma=1.0, eta=1.0)
    est.observe(0.0, 0, 1, "timeout", "prefill_queue")
    est.observe(0.0, 2, 3, "timeout", "decode")
    est.observe(0.0, 0, 3, "error", "prefill")
    comp = est.update(0.5, np.zeros(4), BW0, BW0)
    np.testing.assert_allclose(comp.timeout_rate, [1 / 2, 0, 0, 1 / 2])
    np.testing.assert_allclose(comp.failure_rate, [1 / 2, 0, 0, 0])


def test_bandwidth_and_utilisation_terms_and_telemetry_none():
    est = _est(alpha=0.5, beta=2.0, gamma=0.0, eta=0.0)
    util = np.array([0.0, 1.0, 0.5, 0.0])
    bw = np.array([100.0, 100.0, 100.0, 5.0])
    comp = est.update(0.0, util, bw, BW0)
    np.testing.assert_allclose(comp.price, [0.0, 0.5, 0.25, 2.0 * 0.95])
    comp = est.update(0.0, util, None, BW0)  # telemetry "none": no bandwidth term at all
    np.testing.assert_allclose(comp.price, [0.0, 0.5, 0.25, 0.0])
    assert np.isnan(comp.bw_term).all()


def test_window_slides_by_bucket():
    est = RiskPriceEstimator(1, Weights(alpha=0, beta=0, gamma=1, eta=0), window_s=3.0, bucket_s=1.0)
    est.observe(0.2, 0, -1, "timeout", "prefill_queue")
    assert est.update(2.9, np.zeros(1), None, np.ones(1)).timeout_rate[0] == 1.0
    assert est.update(3.1, np.zeros(1), None, np.ones(1)).timeout_rate[0] == 0.0
