"""A real Prometheus server over the shipped configuration (prometheus/ beside this module:
prometheus.yml and its rules), scraping the targets it is given: for the tests, and for users who want the run's
metrics kept and queried while it runs (the router actor serves them: exporter.py).

    with PrometheusServer(["127.0.0.1:9464"]) as prom:
        prom.wait_for('testbed_decisions_total > 0', timeout_s=30)
        print(prom.query("testbed:request_failure_ratio:rate1m"))

It writes a copy of the shipped config with the ``testbed`` job's targets replaced (and, if asked,
shorter intervals) into a temporary directory that also holds the TSDB, starts Debian's
``prometheus`` binary on a free localhost port, waits for ``/-/ready``, answers instant queries
through the HTTP API (``/api/v1/query``, ``/api/v1/alerts``) and on ``stop`` terminates it and
removes the directory. HTTP with the stdlib (urllib), the config with PyYAML (a dependency already).
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, NamedTuple, Sequence

import yaml

__all__ = ["SHIPPED_DIR", "PrometheusMissing", "PrometheusServer", "Sample", "scrape_config"]

# Package data beside this module (pyproject.toml [tool.setuptools.package-data]), not a folder of the
# repository: a wheel install has no repository around it. A plain path, as prometheus reads files.
SHIPPED_DIR = Path(__file__).resolve().parent / "prometheus"
JOB = "testbed"


class PrometheusMissing(RuntimeError):
    """No ``prometheus`` binary to run."""


class Sample(NamedTuple):
    """One element of an instant query's answer: its labels and value."""

    labels: dict[str, str]
    value: float


def _duration(seconds: float) -> str:
    """Prometheus' duration syntax, in milliseconds so that fractions of a second stay exact."""
    return f"{round(seconds * 1000)}ms"


def scrape_config(targets: Sequence[str], config_dir: Path = SHIPPED_DIR,
                  interval_s: float | None = None) -> dict[str, Any]:
    """The shipped prometheus.yml with the ``testbed`` job scraping ``targets``, its rule files made
    absolute (they are relative to the shipped file), and with ``interval_s`` as the scrape, scrape
    timeout and evaluation interval where given."""
    cfg = yaml.safe_load((config_dir / "prometheus.yml").read_text())
    jobs = [j for j in cfg["scrape_configs"] if j["job_name"] == JOB]
    if len(jobs) != 1:
        raise ValueError(f"{config_dir / 'prometheus.yml'}: expected one scrape job {JOB!r}, found {len(jobs)}")
    jobs[0]["static_configs"] = [{"targets": list(targets)}]
    cfg["rule_files"] = [str((config_dir / f).resolve()) for f in cfg.get("rule_files", [])]
    if interval_s is not None:
        d = _duration(interval_s)
        cfg["global"].update(scrape_interval=d, scrape_timeout=d, evaluation_interval=d)
    return cfg


class PrometheusServer:
    """A Prometheus process over a temporary copy of the shipped config; a context manager
    (``start`` on enter, ``stop`` on exit)."""

    def __init__(self, targets: Sequence[str], *, config_dir: Path = SHIPPED_DIR, interval_s: float | None = None,
                 binary: str = "prometheus", ready_timeout_s: float = 30.0) -> None:
        self.targets = list(targets)
        self.config_dir = Path(config_dir)
        self.interval_s = interval_s
        self.binary = binary
        self.ready_timeout_s = ready_timeout_s
        self.port: int | None = None
        self.tmp: Path | None = None
        self._proc: subprocess.Popen | None = None
        self._log: Any = None

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("prometheus: not started")
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "PrometheusServer":
        exe = shutil.which(self.binary)
        if exe is None:
            raise PrometheusMissing(f"prometheus: no {self.binary!r} on PATH; install Debian's prometheus package "
                                    f"(apt-get install --no-install-recommends prometheus; ./install.sh does as root)")
        self.tmp = Path(tempfile.mkdtemp(prefix="testbed-prometheus-"))
        try:
            config = self.tmp / "prometheus.yml"
            config.write_text(yaml.safe_dump(scrape_config(self.targets, self.config_dir, self.interval_s),
                                             sort_keys=False))
            from testbed.cluster.raynodes import free_ports

            self.port = free_ports(1)[0]
            # Its log to a file, not a pipe nobody reads (a full pipe would stall it).
            self._log = open(self.tmp / "prometheus.log", "wb")
            self._proc = subprocess.Popen(
                [exe, f"--config.file={config}", f"--storage.tsdb.path={self.tmp / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}"],
                stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, cwd=self.tmp)
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self._proc.returncode} before it was ready: "
                                   f"{self._log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass  # not listening yet, or 503 while the TSDB opens
            if time.monotonic() > deadline:
                raise TimeoutError(f"prometheus not ready after {self.ready_timeout_s:g} s: {self._log_tail()}")
            time.sleep(0.05)

    def _log_tail(self, lines: int = 5) -> str:
        try:
            return " | ".join((self.tmp / "prometheus.log").read_text(errors="replace").splitlines()[-lines:])
        except (OSError, TypeError):
            return "(no log)"

    def stop(self) -> None:
        """Terminate the server (killed if it does not stop in 10 s) and remove its directory."""
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.terminate()
                try:
                    self._proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait()
            self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None

    def __enter__(self) -> "PrometheusServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # --- the HTTP API ------------------------------------------------------------------------

    def _get(self, path: str, **params: str) -> Any:
        url = f"{self.url}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                body = json.load(r)
        except urllib.error.HTTPError as e:  # a bad query is a 400 with the reason in the body
            try:
                body = json.load(e)
            except ValueError:
                raise ValueError(f"prometheus {path}: HTTP {e.code} {e.reason}") from None
        if body.get("status") != "success":
            raise ValueError(f"prometheus {path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[Sample]:
        """An instant query's answer now: every element of a vector, or a scalar as one sample
        without labels (an empty list: no series matched)."""
        data = self._get("/api/v1/query", query=expr)
        kind, result = data["resultType"], data["result"]
        if kind == "vector":
            return [Sample(r["metric"], float(r["value"][1])) for r in result]
        if kind == "scalar":
            return [Sample({}, float(result[1]))]
        raise ValueError(f"prometheus: {expr!r} gives a {kind}, not an instant vector or scalar")

    def wait_for(self, expr: str, timeout_s: float, poll_s: float = 0.2) -> list[Sample]:
        """Poll ``expr`` until it answers with at least one sample that is not NaN (so a filter
        such as ``x > 0.5`` waits for the condition); TimeoutError with the last answer if not by
        ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            got = self.query(expr)
            if any(not math.isnan(s.value) for s in got):
                return got
            if time.monotonic() > deadline:
                raise TimeoutError(f"prometheus: {expr!r} still {got} after {timeout_s:g} s")
            time.sleep(poll_s)

    def alerts(self) -> list[dict[str, Any]]:
        """The alerts pending or firing now (``/api/v1/alerts``): labels, annotations, state, activeAt, value."""
        return self._get("/api/v1/alerts")["alerts"]

    def scrape_targets(self) -> list[dict[str, Any]]:
        """The scrape targets as Prometheus sees them (``/api/v1/targets``: health, lastError, ...)."""
        return self._get("/api/v1/targets")["activeTargets"]
