"""The shipped Prometheus configuration (testbed/router/prometheus/, shipped in the package) is valid and its rules behave as
written (promtool), and a real Prometheus server scrapes a real exporter (testbed/router/exporter.py)
and answers for it: raw series, a recording rule and the risk-price alert, through its HTTP API
(testbed/router/prometheus_server.py). Needs Debian's prometheus package (./install.sh as root
installs it); skipped, saying so, where its binaries are missing."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest
import yaml

from core.experiment import build_topology
from core.records import DecisionRecord, HealthRecord, PriceRecord, RequestRecord
from core.spec import model as core_spec
from core.spec.model import parse_spec
from core.view import Loads
from testbed.router.exporter import RunMetrics, serve
from testbed.router.prometheus_server import SHIPPED_DIR, PrometheusMissing, PrometheusServer, scrape_config

PROMTOOL = shutil.which("promtool")
PROMETHEUS = shutil.which("prometheus")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="no promtool: install Debian's prometheus package")
needs_prometheus = pytest.mark.skipif(PROMETHEUS is None, reason="no prometheus: install Debian's prometheus package")
POLICY = "FaultAwareOTF-R"
HOT_POD = 1  # the pod whose price is above the alert's threshold
BUDGET_S = 30.0  # the real-server test's bound, start to stop


def _risk_threshold() -> float:
    """TestbedRiskPriceHigh's threshold, read from the shipped rules."""
    rules = yaml.safe_load((SHIPPED_DIR / "rules.yml").read_text())
    (expr,) = [r["expr"] for g in rules["groups"] for r in g["rules"] if r.get("alert") == "TestbedRiskPriceHigh"]
    name, op, value = expr.split()
    assert (name, op) == ("testbed_risk_price", ">")
    return float(value)


THRESHOLD = _risk_threshold()
HOT, COLD = THRESHOLD + 0.4, THRESHOLD / 5
def _promtool(*args: str) -> str:
    r = subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"promtool {' '.join(args)}:\n{r.stdout}{r.stderr}"
    return r.stdout + r.stderr


@needs_promtool
def test_the_shipped_config_and_rules_are_valid():
    out = _promtool("check", "config", str(SHIPPED_DIR / "prometheus.yml"))  # checks the rules it names too
    assert "SUCCESS" in out and "1 rule files found" in out
    out = _promtool("check", "rules", str(SHIPPED_DIR / "rules.yml"))
    assert "SUCCESS: 13 rules found" in out


@needs_promtool
def test_the_rules_behave_as_their_unit_tests_say():
    assert "SUCCESS" in _promtool("test", "rules", str(SHIPPED_DIR / "rules_test.yml"))


def test_the_shipped_config_scrapes_the_exporters_default_address_at_the_slow_loops_scale():
    cfg = yaml.safe_load((SHIPPED_DIR / "prometheus.yml").read_text())
    (job,) = [j for j in cfg["scrape_configs"] if j["job_name"] == "testbed"]
    tb = core_spec.TestbedSpec()  # through the module: pytest would collect a Test* name
    assert job["static_configs"] == [{"targets": [f"{tb.metrics_host}:{tb.metrics_port}"]}]
    assert cfg["global"]["scrape_interval"] == cfg["global"]["evaluation_interval"] == "2s"
    assert cfg["rule_files"] == ["rules.yml"]


def test_the_temporary_config_replaces_the_targets_and_keeps_the_shipped_rules():
    cfg = scrape_config(["127.0.0.1:1234", "10.0.0.2:9464"], interval_s=0.5)
    (job,) = [j for j in cfg["scrape_configs"] if j["job_name"] == "testbed"]
    assert job["static_configs"] == [{"targets": ["127.0.0.1:1234", "10.0.0.2:9464"]}]
    assert cfg["rule_files"] == [str(SHIPPED_DIR / "rules.yml")]
    assert cfg["global"] == {"scrape_interval": "500ms", "scrape_timeout": "500ms", "evaluation_interval": "500ms"}
    assert scrape_config(["h:1"])["global"]["scrape_interval"] == "2s"  # the shipped one otherwise


def test_a_missing_binary_says_which_package_to_install():
    with pytest.raises(PrometheusMissing, match="Debian's prometheus package") as e:
        PrometheusServer(["127.0.0.1:9464"], binary="no-such-prometheus-binary").start()
    assert "\n" not in str(e.value)


# --- a real Prometheus against a real exporter ---------------------------------------------

def _request(i: int, outcome: str = "ok", stage: str | None = None) -> RequestRecord:
    t = 10.0 + i
    return RequestRecord(i, t, 500, 16, prefill_worker=0, decode_worker=4, prefill_pod=0, decode_pod=1, routed_s=t,
                         prefill_start_s=t, prefill_end_s=t + 0.2, kv_start_s=t + 0.2, kv_end_s=t + 0.3,
                         first_token_s=t + 0.5, end_s=t + 1.0, outcome=outcome, failed_stage=stage, kv_bytes=4_000_000)


def _decision(i: int) -> DecisionRecord:
    return DecisionRecord(time_s=10.0 + i, request_id=i, policy=POLICY, n_candidates=16, n_filtered=0, latency_s=2.5e-4,
                          prefill_worker=0, decode_worker=4, prefill_pod=0, decode_pod=1, score=0.3)


@needs_prometheus
def test_a_real_prometheus_scrapes_the_exporter_and_raises_the_risk_price_alert(faulted_spec):
    start = time.monotonic()

    def left() -> float:
        return max(0.1, BUDGET_S - (time.monotonic() - start))

    topo = build_topology(parse_spec(faulted_spec))
    metrics = RunMetrics(topo, lambda: Loads.zeros(topo))
    for i in range(5):
        metrics.observe(_decision(i))
        metrics.observe(_request(i))
    metrics.observe(_request(5, "timeout", "kv_transfer"))
    for pod in range(topo.n_pods):  # one pod above the threshold, the others well below
        hot = pod == HOT_POD
        metrics.observe(PriceRecord(12.0, pod, price=HOT if hot else COLD, util=0.4, bw_term=0.8 if hot else 0.0,
                                    timeout_rate=0.0, failure_rate=0.0))
    metrics.observe(HealthRecord(12.0, HOT_POD, True, True))
    exporter = serve(metrics, "127.0.0.1", 0)  # port 0: the OS picks a free one
    target = f"127.0.0.1:{exporter.server_port}"
    try:
        # Scrapes and rule evaluations every 0.5 s rather than the shipped 2 s: the test's time.
        with PrometheusServer([target], interval_s=0.5) as prom:
            # Raw series, as scraped from the exporter.
            (up,) = prom.wait_for(f'up{{job="testbed", instance="{target}"}} == 1', timeout_s=left())
            dec = prom.wait_for(f'testbed_decisions_total{{policy="{POLICY}"}}', timeout_s=left())
            assert [(s.labels["instance"], s.value) for s in dec] == [(target, 5.0)]
            prices = {s.labels["pod"]: s.value for s in prom.query("testbed_risk_price")}
            assert prices == {str(p): (HOT if p == HOT_POD else COLD) for p in range(topo.n_pods)}
            assert [s.value for s in prom.query(f'testbed_health_label{{pod="{HOT_POD}"}}')] == [1.0]
            (fail,) = prom.query('testbed_request_failures_total{stage="kv_transfer"}')
            assert fail.value == 1.0

            # A recording rule: rate() sees increases between scrapes, so more of the run happens now.
            for i in range(6, 16):
                metrics.observe(_decision(i))
                metrics.observe(_request(i, *(("timeout", "kv_transfer") if i % 2 else ("ok", None))))
            (rate,) = prom.wait_for('testbed:request_failures:rate1m{stage="kv_transfer"} > 0', timeout_s=left())
            assert rate.labels == {"__name__": "testbed:request_failures:rate1m", "stage": "kv_transfer"}
            (ratio,) = prom.wait_for("testbed:request_failure_ratio:rate1m > 0", timeout_s=left())
            assert 0 < ratio.value <= 1
            (per_s,) = prom.wait_for(f'testbed:decisions:rate1m{{policy="{POLICY}"}} > 0', timeout_s=left())
            assert per_s.value > 0

            # The risk-price alert, pending (its for: is 15 s) or firing, for the hot pod only.
            alert = prom.wait_for('ALERTS{alertname="TestbedRiskPriceHigh"}', timeout_s=left())
            assert [(s.labels["pod"], s.labels["alertstate"] in ("pending", "firing")) for s in alert] == \
                [(str(HOT_POD), True)]
            (api,) = [a for a in prom.alerts() if a["labels"]["alertname"] == "TestbedRiskPriceHigh"]
            assert api["labels"]["pod"] == str(HOT_POD) and float(api["value"]) == pytest.approx(HOT)
    finally:
        exporter.shutdown()
        exporter.server_close()
    assert time.monotonic() - start < BUDGET_S
