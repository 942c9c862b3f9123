"""The run's Prometheus metrics (testbed/router/exporter.py) say what the run's records say: a
simulated run's records, handed to the exporter in the order the router wrote them, and its scrape
over HTTP compared with the Parquet tables."""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from core.experiment import build_topology
from core.records import DecisionRecord, HealthRecord, PriceRecord, RequestRecord, read_table
from core.spec.model import parse_spec
from core.view import Loads
from simulator.run import run_sim
from testbed.router.exporter import RunMetrics, serve

pytestmark = pytest.mark.background  # needs no core of its own: under -n, beside the others (tests/conftest.py)

def _records(run_dir) -> list[tuple]:
    """Every router record of the run, in time order (requests at their end)."""
    out = []
    for cls, key in ((DecisionRecord, "time_s"), (PriceRecord, "time_s"), (HealthRecord, "time_s"),
                     (RequestRecord, "end_s")):
        df = read_table(run_dir, cls.table)[list(cls._fields)]
        for row in df.itertuples(index=False, name=None):
            rec = cls(*row)
            out.append((getattr(rec, key), rec))
    out.sort(key=lambda x: x[0])
    return [r for _, r in out]


def _scrape(url: str) -> dict[tuple[str, tuple], float]:
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def _scrape_served(metrics: RunMetrics) -> dict[tuple[str, tuple], float]:
    """Serve ``metrics`` over HTTP on a free port, scrape them once, stop."""
    server = serve(metrics, "127.0.0.1", 0)
    try:
        return _scrape(f"http://127.0.0.1:{server.server_port}/metrics")
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def run(tmp_path_factory, faulted_spec):
    spec = parse_spec(faulted_spec)
    run_dir = run_sim(spec, "FaultAwareOTF-R", 0, tmp_path_factory.mktemp("run"))
    return spec, run_dir


def test_a_scrape_shows_what_the_records_hold(run):
    spec, run_dir = run
    topo = build_topology(spec)
    loads = Loads.zeros(topo)
    loads.prefill_outstanding[2] = 3  # what the router counts in flight is read at scrape time
    loads.decode_outstanding[0] = 1
    metrics = RunMetrics(topo, lambda: loads)
    for rec in _records(run_dir):
        metrics.observe(rec)
    m = _scrape_served(metrics)

    req = read_table(run_dir, "requests")
    assert (req.outcome != "ok").any()  # the fault bit: failures to count
    for outcome, n in req.outcome.value_counts().items():
        assert m[("testbed_requests_total", (("outcome", outcome),))] == n
    for stage, n in req.failed_stage.dropna().value_counts().items():
        assert m[("testbed_request_failures_total", (("stage", stage),))] == n
    assert m[("testbed_kv_bytes_total", ())] == req.kv_bytes.sum()
    pulled = req.dropna(subset=["kv_start_s", "kv_end_s"])
    assert m[("testbed_kv_pull_seconds_count", ())] == len(pulled)
    assert m[("testbed_kv_pull_seconds_sum", ())] == pytest.approx((pulled.kv_end_s - pulled.kv_start_s).sum())
    assert m[("testbed_time_to_first_token_seconds_count", ())] == req.first_token_s.notna().sum()

    dec = read_table(run_dir, "decisions")
    assert m[("testbed_decisions_total", (("policy", "FaultAwareOTF-R"),))] == len(dec)
    le = m[("testbed_decision_latency_seconds_bucket", (("le", "0.001"), ("policy", "FaultAwareOTF-R")))]
    assert le == (dec.latency_s <= 0.001).sum()

    prices = read_table(run_dir, "prices")
    last = prices.sort_values("time_s", kind="stable").groupby("pod").last()
    for pod, row in last.iterrows():
        assert m[("testbed_risk_price", (("pod", str(pod)),))] == pytest.approx(row.price)
        assert m[("testbed_risk_utilisation", (("pod", str(pod)),))] == pytest.approx(row.util)
    health = read_table(run_dir, "health")
    assert health.truth_degraded.any() and health.unhealthy.any()  # the fault was labelled, then cleared
    health = health.sort_values("time_s", kind="stable").groupby("pod").last()
    for pod in range(topo.n_pods):
        want = health.loc[pod] if pod in health.index else None
        assert m[("testbed_health_label", (("pod", str(pod)),))] == (0 if want is None else int(want.unhealthy))
        assert m[("testbed_health_truth", (("pod", str(pod)),))] == (0 if want is None else int(want.truth_degraded))

    w = int(topo.prefill_ids[2])
    assert m[("testbed_in_flight", (("pod", str(int(topo.worker_pod[w]))), ("role", "prefill"),
                                    ("worker", str(w))))] == 3
    in_flight = {k: v for k, v in m.items() if k[0] == "testbed_in_flight"}
    assert len(in_flight) == topo.prefill_ids.size + topo.decode_ids.size and sum(in_flight.values()) == 4


def test_every_outcome_and_stage_is_a_series_from_the_start(run):
    """Counters at 0 before the first record: Prometheus' rate() of a series born at its first
    increment never counts that increment (the rules' failure ratio would miss a run's first failures)."""
    from vocab import OUTCOMES
    from core.stages import FAILURE_STAGES

    spec, _ = run
    topo = build_topology(spec)
    metrics = RunMetrics(topo, lambda: Loads.zeros(topo))
    m = _scrape_served(metrics)
    assert {k[1][0][1]: v for k, v in m.items() if k[0] == "testbed_requests_total"} == {o: 0 for o in OUTCOMES}
    for name in ("testbed_request_failures_total", "testbed_retries_total"):
        assert {k[1][0][1]: v for k, v in m.items() if k[0] == name} == {s: 0 for s in FAILURE_STAGES}


def test_the_tee_hands_every_record_to_the_sink_and_the_metrics(run):
    spec, run_dir = run
    topo = build_topology(spec)
    metrics = RunMetrics(topo, lambda: Loads.zeros(topo))
    got: list[tuple] = []
    sink = metrics.tee(got.append)
    recs = _records(run_dir)[:200]
    for rec in recs:
        sink(rec)
    assert got == recs
    n_dec = sum(r.table == "decisions" for r in recs)
    assert n_dec > 0
    assert metrics.registry.get_sample_value("testbed_decisions_total", {"policy": "FaultAwareOTF-R"}) == n_dec
