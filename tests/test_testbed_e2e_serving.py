"""Serving on the shared cluster, end to end (tests/e2e_cluster.py): the router's Prometheus
metrics while the jobs run, and `testbed run --serve` answering the stock `openai` client and vLLM's
own serve benchmark, its metrics on the host. Slow."""

import math

import pytest

pytest.importorskip("vllm", reason="vLLM's CPU build is not installed (the README's install command installs it)")
pytest.importorskip("ray", reason="Ray is not installed (the README's install command installs it)")

from core.records import read_meta, read_table  # noqa: E402
from e2e_cluster import PROMETHEUS_POLICY, TIME_COLUMNS  # noqa: E402
from e2e_serve import BENCH_PROMPTS  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.e2e]  # the shared cluster (tests/e2e_cluster.py)


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


def test_a_real_prometheus_on_the_host_keeps_a_policys_decisions_and_the_pods_prices(testbed_runs):
    """Debian's Prometheus with the shipped configuration (testbed/router/prometheus/) scraped the router's
    exporter on the host, where `testbed run` forwards it from the head's namespace, while the jobs
    ran; read back through Prometheus' own query API and held against the run directories."""
    out, cli = testbed_runs[0], testbed_runs[4]
    prom = cli.get("prometheus")
    assert prom and "error" not in prom, prom
    assert [t["health"] for t in prom["targets"]] and prom["targets"][0]["scrapeUrl"].startswith("http://127.0.0.1:"), \
        prom["targets"]
    # the one run of PROMETHEUS_POLICY: its decisions counter, at most what the run recorded (a scrape
    # every 0.5 s may miss the last ones before the run's exporter closed), and not nothing
    (decisions,) = prom["decisions"]
    recorded = len(read_table(out / "e2e_policies" / PROMETHEUS_POLICY / "seed-0", "decisions"))
    assert 1 <= decisions.value <= recorded, (decisions, recorded)
    # every pod's risk price, never above the highest any run recorded for that pod
    prices = {int(x.labels["pod"]): x.value for x in prom["price"]}
    assert sorted(prices) == [0, 1, 2, 3], prom["price"]
    recorded_max = {}
    for d in out.glob("e2e_*/*/seed-0"):
        try:
            t = read_table(d, "prices")
        except Exception:  # a run without a price table (killed before it flushed)
            continue
        for pod, v in t.groupby("pod").price.max().items():
            recorded_max[int(pod)] = max(recorded_max.get(int(pod), 0.0), float(v))
    assert all(0 <= prices[p] <= recorded_max[p] + 1e-9 for p in prices), (prices, recorded_max)
    # the link fault's failures, by stage, as the router counted them
    failures = {x.labels["stage"]: x.value for x in prom["failures"]}
    assert failures.get("kv_transfer", 0) >= 1, prom["failures"]


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
    assert req.request_id.iloc[0] == seen["completion_id"]
    req = req.iloc[:2]  # the openai client's two (vLLM's benchmark came after them)
    assert (req.output_tokens == 8).all()
    # a real run's request: ok (or the documented host stall's timeout), with its stages in order
    for _, r in req.iterrows():
        if r.outcome == "ok":
            times = [r[c] for c in TIME_COLUMNS]
            assert not any(math.isnan(t) for t in times) and all(b >= a - 1e-6 for a, b in zip(times, times[1:])), r
        else:
            assert r.outcome == "timeout", r
    assert (req.outcome == "ok").any()


def test_vllm_serve_benchmark_runs_against_the_ingress_and_every_prompt_completes(testbed_runs):
    """vLLM's own serve benchmark (`vllm bench serve`, started as docs/tools.md says) against `testbed
    run --serve`: every prompt completes, none fails, and each is one of the run's recorded requests."""
    out, seen = testbed_runs[0], testbed_runs[4]["serve"]
    bench = seen["bench"]
    assert bench["rc"] == 0 and bench["report"] is not None, bench["output"][-3000:]
    report = bench["report"]
    assert (report["num_prompts"], report["completed"], report["failed"]) == (BENCH_PROMPTS, BENCH_PROMPTS, 0), \
        bench["output"][-3000:]
    assert report["total_output_tokens"] == 16 * BENCH_PROMPTS and report["median_ttft_ms"] > 0
    req = read_table(out / "e2e_serve" / "LC" / "seed-0", "requests").sort_values("request_id").iloc[2:]
    # its prompts (and the ready check before them, one more) routed, decoded and recorded as ok
    ok = req[(req.outcome == "ok") & (req.output_tokens == 16)]
    assert len(ok) >= BENCH_PROMPTS and (ok.prompt_tokens > 100).all(), req[["request_id", "prompt_tokens", "outcome"]]
    assert len(read_table(out / "e2e_serve" / "LC" / "seed-0", "decisions")) == 2 + len(req)


def test_the_metrics_reach_the_host_while_serving(testbed_runs):
    """The exporter listens in the head's namespace; `testbed run` forwards its port on the host, as
    it does the ingress's, so a Prometheus on the host scrapes it."""
    text = testbed_runs[4]["serve"]["host_metrics"]
    assert 'testbed_decisions_total{policy="LC"}' in text and "testbed_risk_price{" in text, text[:2000]
