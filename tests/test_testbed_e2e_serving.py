"""Serving on the shared cluster, end to end (tests/e2e_cluster.py): the router's Prometheus
metrics while the jobs run, and `testbed run --serve` answering the stock `openai` client. Slow."""

import math

import pytest

pytest.importorskip("vllm", reason="vLLM's CPU build is not installed (the README's install command installs it)")
pytest.importorskip("ray", reason="Ray is not installed (the README's install command installs it)")

from core.records import read_meta, read_table  # noqa: E402
from e2e_cluster import TIME_COLUMNS  # noqa: E402

pytestmark = pytest.mark.slow


def test_metrics_are_served_while_a_run_goes_on(testbed_runs):
    from prometheus_client.parser import text_string_to_metric_families

    scrapes = testbed_runs[4]["scrapes"]
    assert scrapes, "no scrape of http://127.0.0.1:9464/metrics in the head's namespace answered during the runs"
    seen: dict[str, float] = {}
    for text in scrapes:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                seen[s.name] = max(seen.get(s.name, 0.0), s.value)
    # The router's records as they happen: decisions and their latency, finished requests, prices,
    # labels, and in-flight counts for the 4 pods' workers.
    assert seen.get("testbed_decisions_total", 0) >= 1 and seen.get("testbed_requests_total", 0) >= 1
    assert seen.get("testbed_decision_latency_seconds_count", 0) >= 1
    for name in ("testbed_risk_price", "testbed_health_label", "testbed_health_truth", "testbed_in_flight"):
        assert name in seen, name


def test_the_openai_client_is_served_through_the_ingress_and_recorded(testbed_runs):
    """`testbed run --serve`: stock `openai` client calls, streaming and not, routed by the policy
    to real engines, recorded with their stages; Ctrl-C ends the run as finished."""
    out, cli = testbed_runs[0], testbed_runs[4]
    seen = cli["serve"]
    assert seen["rc"] == 0, seen["stderr"][-3000:]
    assert seen["health"]["status"] == "ok" and len(seen["health"]["engines"]) == 4
    assert all(e["healthy"] for e in seen["health"]["engines"].values())
    comp = seen["completion"]
    assert comp.usage.completion_tokens == 8 and comp.choices[0].text and comp.choices[0].finish_reason == "length"
    chunks = seen["chunks"]
    assert len(chunks) >= 3 and chunks[0].choices[0].delta.role == "assistant"  # streamed, not one blob
    assert chunks[-1].choices[0].finish_reason == "length"
    d = out / "e2e_serve" / "LC" / "seed-0"
    assert read_meta(d)["status"] == "finished"
    req = read_table(d, "requests").sort_values("request_id")
    assert len(req) == 2 and req.request_id.iloc[0] == seen["completion_id"]
    assert (req.output_tokens == 8).all()
    # a real run's request: ok (or the documented host stall's timeout), with its stages in order
    for _, r in req.iterrows():
        if r.outcome == "ok":
            times = [r[c] for c in TIME_COLUMNS]
            assert not any(math.isnan(t) for t in times) and all(b >= a - 1e-6 for a, b in zip(times, times[1:])), r
        else:
            assert r.outcome == "timeout", r
    assert (req.outcome == "ok").any()
    assert len(read_table(d, "decisions")) == 2
