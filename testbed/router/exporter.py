"""Prometheus metrics of a run while it runs, made from the very records the run directory gets.

:class:`RunMetrics` is handed every record the router emits (decisions, prices, health labels,
finished requests: ``observe``, teed off the router's sink in the router actor), so a scrape
shows what the Parquet tables will hold, as it happens; in-flight counts per worker are read
from the router's own counters at scrape time. Served on the head node with prometheus_client's
HTTP server (``serve``), bound to localhost unless told otherwise.

Series (every name starts with ``testbed_``; labels in braces):

* ``risk_price{pod}`` and its components ``risk_utilisation``, ``risk_bandwidth_term``,
  ``risk_timeout_rate``, ``risk_failure_rate`` (the price table's columns, last slow-loop tick);
* ``health_label{pod}`` (1: the router's mask says unhealthy) and ``health_truth{pod}`` (1: the
  fault schedule degrades the pod), from the health table's changes;
* ``in_flight{role,worker,pod}``: requests routed to a worker and not through it yet;
* ``decisions_total{policy}`` and ``decision_latency_seconds{policy}`` (histogram);
* ``requests_total{outcome}``, ``request_failures_total{stage}``, ``retries_total{stage}`` (router.retry);
* ``kv_bytes_total``, ``kv_pull_seconds`` (histogram: ``kv_end_s - kv_start_s`` of requests whose
  pull ended), ``time_to_first_token_seconds`` (histogram).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from core.stages import FAILURE_STAGES
from core.topology import Topology
from core.view import Loads
from vocab import OUTCOMES, ROLE_DECODE, ROLE_PREFILL

__all__ = ["RunMetrics", "serve"]

# Decision latency: 1 us to 10 ms (bench_policies: 9-13 us at 1024 pods; the testbed's recorded
# p50 was 230-330 us).
_DECISION_BUCKETS = (1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 1e-2)
# KV pulls and first tokens: 10 ms to the 600 s deadline.
_SECONDS_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
_PRICE_COLUMNS = (("price", "risk_price", "the risk price"),
                  ("util", "risk_utilisation", "the price's utilisation term"),
                  ("bw_term", "risk_bandwidth_term", "the price's bandwidth term: 1 - bw/bw0 seen through telemetry"),
                  ("timeout_rate", "risk_timeout_rate", "the price's timeout-rate term"),
                  ("failure_rate", "risk_failure_rate", "the price's failure-rate term"))


class _InFlight(Collector):
    """``in_flight{role,worker,pod}``, read from the router's counters when scraped."""

    def __init__(self, topo: Topology, loads: Callable[[], Loads]) -> None:
        self.topo, self.loads = topo, loads

    def collect(self) -> Iterable[GaugeMetricFamily]:
        g = GaugeMetricFamily("testbed_in_flight", "requests routed to a worker and not through it yet",
                              labels=["role", "worker", "pod"])
        loads, topo = self.loads(), self.topo
        for role, ids, counts in ((ROLE_PREFILL, topo.prefill_ids, loads.prefill_outstanding),
                                  (ROLE_DECODE, topo.decode_ids, loads.decode_outstanding)):
            for w, n in zip(ids.tolist(), counts.tolist()):
                g.add_metric([role, str(w), str(int(topo.worker_pod[w]))], n)
        yield g


class RunMetrics:
    """The run's metrics in a registry of their own (several runs in one process never mix)."""

    def __init__(self, topo: Topology, loads: Callable[[], Loads], registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self._price = {col: Gauge(f"testbed_{name}", doc, ["pod"], registry=r) for col, name, doc in _PRICE_COLUMNS}
        self._label = Gauge("testbed_health_label", "1: the health mask says unhealthy", ["pod"], registry=r)
        self._truth = Gauge("testbed_health_truth", "1: the fault schedule degrades the pod", ["pod"], registry=r)
        for p in range(topo.n_pods):  # every pod present from the start: healthy until a record says otherwise
            self._label.labels(str(p)).set(0)
            self._truth.labels(str(p)).set(0)
        self._decisions = Counter("testbed_decisions", "routing decisions", ["policy"], registry=r)
        self._decision_latency = Histogram("testbed_decision_latency_seconds", "wall-clock time of a decision",
                                           ["policy"], buckets=_DECISION_BUCKETS, registry=r)
        self._requests = Counter("testbed_requests", "finished requests", ["outcome"], registry=r)
        self._failures = Counter("testbed_request_failures", "failed requests by the stage they failed in",
                                 ["stage"], registry=r)
        self._kv_bytes = Counter("testbed_kv_bytes", "KV bytes of the requests' transfers", registry=r)
        self._kv_pull = Histogram("testbed_kv_pull_seconds", "KV pull time (kv_end_s - kv_start_s)",
                                  buckets=_SECONDS_BUCKETS, registry=r)
        self._ttft = Histogram("testbed_time_to_first_token_seconds", "first token time after arrival",
                               buckets=_SECONDS_BUCKETS, registry=r)
        # sgl-router exports its retries likewise (sgl_router_retries_total{route})
        self._retries = Counter("testbed_retries", "attempts given up and retried (router.retry), by the stage "
                                "they failed in", ["stage"], registry=r)
        r.register(_InFlight(topo, loads))
        # Every outcome and stage present from the start at 0, as the health gauges: a counter born at
        # its first increment has no earlier sample, so Prometheus' rate() and increase() never see
        # that first failure (testbed/router/prometheus/rules.yml's failure ratio and alert read them).
        for outcome in OUTCOMES:
            self._requests.labels(outcome)
        for stage in FAILURE_STAGES:
            self._failures.labels(stage)
            self._retries.labels(stage)
        self._observers = {"decisions": self._decision, "prices": self._prices, "health": self._health,
                           "requests": self._request, "attempts": self._attempt}

    def observe(self, rec: Any) -> None:
        """One record as the router emits it (other tables are not metrics)."""
        fn = self._observers.get(rec.table)
        if fn is not None:
            fn(rec)

    def tee(self, sink: Callable[[Any], None]) -> Callable[[Any], None]:
        """``sink`` that also observes every record."""
        observe = self.observe

        def both(rec: Any) -> None:
            sink(rec)
            observe(rec)
        return both

    def _decision(self, rec: Any) -> None:
        self._decisions.labels(rec.policy).inc()
        self._decision_latency.labels(rec.policy).observe(rec.latency_s)

    def _prices(self, rec: Any) -> None:
        pod = str(rec.pod)
        for col, gauge in self._price.items():
            gauge.labels(pod).set(getattr(rec, col))

    def _health(self, rec: Any) -> None:
        self._label.labels(str(rec.pod)).set(int(rec.unhealthy))
        self._truth.labels(str(rec.pod)).set(int(rec.truth_degraded))

    def _attempt(self, rec: Any) -> None:
        self._retries.labels(rec.failed_stage).inc()

    def _request(self, rec: Any) -> None:
        self._requests.labels(rec.outcome).inc()
        if rec.failed_stage is not None:
            self._failures.labels(rec.failed_stage).inc()
        if rec.kv_bytes:
            self._kv_bytes.inc(rec.kv_bytes)
        if not (math.isnan(rec.kv_start_s) or math.isnan(rec.kv_end_s)):
            self._kv_pull.observe(rec.kv_end_s - rec.kv_start_s)
        if not math.isnan(rec.first_token_s):
            self._ttft.observe(rec.first_token_s - rec.arrival_s)


def serve(metrics: RunMetrics, host: str, port: int) -> Any:
    """Serve ``metrics`` at ``http://host:port/metrics`` from a thread; returns the server
    (``shutdown()`` stops it)."""
    from prometheus_client import start_http_server

    try:
        server, _thread = start_http_server(port, addr=host, registry=metrics.registry)
    except OSError as e:
        raise RuntimeError(f"metrics: cannot serve on {host}:{port} ({e.strerror}); "
                           f"choose another testbed.metrics_port, or 0 for none") from None
    return server
