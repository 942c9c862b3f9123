"""Metric parameters, as they appear under ``metrics:`` in an experiment spec.

SLO defaults follow the chatbot SLOs used in DistServe (Zhong et al., OSDI
2024, Fig. 8 and its artifact, ShareGPT workload): TPOT 0.1 s for OPT-13B and
OPT-66B (0.2 s for OPT-175B), i.e. about 10 tokens/s, faster than people read;
TTFT from 0.25 s (OPT-13B) to 4 s (OPT-175B). We take TPOT 0.1 s and a TTFT of
2 s, inside that range and loose enough for a CPU-served model, so the SLO
separates "served well" from "served late" rather than measuring raw speed.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from core.util.errors import first_error

Percentile = Annotated[float, Field(gt=0.0, le=100.0)]


class FidelityTolerances(BaseModel):
    """How far the simulator may sit from the testbed before ``testbed compare`` calls a metric a
    mismatch (see analysis/compare/fidelity.py). The failure-rate, latency and outcome-agreement targets are
    the ones the project set itself for a twin that carries over; the ranking targets, its first
    criteria for "the simulation carries over"."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Issue 27's Must show: failure rate within 3 percentage points of the testbed's, per policy.
    failure_rate_abs: float = Field(0.03, ge=0.0, description="max |testbed - sim| failure rate (0.03 = 3 pp)")
    # Issue 27's Must show: TTFT and E2E p50 within 15% and p90 within 30% of the testbed's.
    latency_p50_rel: float = Field(
        0.15, ge=0.0, description="max |sim - testbed| / testbed of TTFT and E2E p50 on ok requests"
    )
    latency_p90_rel: float = Field(
        0.30, ge=0.0, description="max |sim - testbed| / testbed of TTFT and E2E p90 on ok requests"
    )
    # Issue 27's Must show: per-request outcome agreement of at least 97% (analysis/compare/paired.py).
    outcome_agreement_min: float = Field(
        0.97, ge=0.0, le=1.0, description="min share of matched requests that end the same way in both worlds"
    )
    # Deflection is a ratio of two small shares (a few dozen requests on a small testbed), so it is
    # noisy; 0.2 separates "moved traffic away" from "did not" without flagging sampling noise.
    deflection_abs: float = Field(0.2, ge=0.0, description="max |testbed - sim| traffic deflection ratio")
    # When the router stops (or starts again) choosing an engine, in both worlds (engine_down_s,
    # engine_up_s): at the twin's 1 request/s over two engines of a role, a dead engine is offered
    # about 0.5 requests a second, so a detection time off by 1 s sends it about half a request more
    # or fewer per death: under one request, as the failure-rate tolerance (1.2 of 40) is.
    engine_lag_abs_s: float = Field(
        1.0, ge=0.0, description="max |testbed - sim| time from an engine's kill (restart) to the router's record, s"
    )
    # A failure's stage (the composition's shares): one failure of five in another stage, the twin's
    # LC failing 3-5 of 40 requests a run.
    composition_abs: float = Field(
        0.2, ge=0.0, description="max |testbed - sim| share of the failures in one stage"
    )
    # Kendall tau >= 0.6: one swapped neighbouring pair passes with 4 or more policies (tau 0.67 with
    # 4, 0.8 with 5), none with 3 (tau 0.33), two with 5 (tau 0.6): "mostly the same order". Judged on
    # the pairs of policies the two worlds separate alike (analysis/compare/checks.py).
    kendall_tau_min: float = Field(
        0.6, ge=-1.0, le=1.0, description="min Kendall tau between the worlds' per-policy failure rates"
    )
    # The ranking of LC vs OTF-R vs OracleAvoidance must be the same in both worlds: every pair of
    # them separated alike, within failure_rate_abs.
    rank_policies: tuple[str, ...] = Field(
        ("LC", "OTF-R", "OracleAvoidance"), description="policies whose failure-rate order must match"
    )

    @model_validator(mode="before")
    @classmethod
    def _one_latency_bound(cls, data: Any) -> Any:
        """Run directories written before the p50/p90 split hold one ``latency_rel`` for p50 and p90 (their
        run.json keeps the resolved spec); it is read as both bounds, so those runs still load."""
        if isinstance(data, dict) and "latency_rel" in data:
            data = dict(data)
            old = data.pop("latency_rel")
            data.setdefault("latency_p50_rel", old)
            data.setdefault("latency_p90_rel", old)
        return data


class MetricsSpec(BaseModel):
    """Parameters of the reliability and serving metrics (see analysis/run/metrics.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    bin_s: float = Field(5.0, gt=0.0, description="width of the success-ratio time bins, seconds")
    availability_target: float = Field(
        0.99, gt=0.0, le=1.0, description="a bin is 'available' when its success ratio is at least this"
    )
    recovery_horizon_s: float = Field(
        60.0, ge=0.0, description="how long after the last fault clears the resilience index keeps looking"
    )
    ttft_slo_s: float = Field(2.0, gt=0.0, description="time-to-first-token SLO for goodput, seconds")
    tpot_slo_s: float = Field(0.1, gt=0.0, description="time-per-output-token SLO for goodput, seconds")
    percentiles: tuple[Percentile, ...] = Field(
        (50.0, 90.0, 99.0), min_length=1, description="latency percentiles to report (50 and 99 are always added)"
    )

    fidelity: FidelityTolerances = Field(
        FidelityTolerances(), description="tolerances of the sim-vs-testbed comparison (testbed compare)"
    )

    @field_validator("percentiles")
    @classmethod
    def _sorted_unique(cls, v: tuple[float, ...]) -> tuple[float, ...]:
        return tuple(sorted(set(v)))


def parse_metrics_spec(raw: Any, where: str) -> MetricsSpec:
    """Validate a ``metrics`` mapping (None = defaults); a bad one raises a one-line ValueError naming ``where``."""
    if raw is None:
        return MetricsSpec()
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: metrics must be a mapping, got {type(raw).__name__} {raw!r}")
    try:
        return MetricsSpec(**raw)
    except ValidationError as exc:
        loc, msg, value, more = first_error(exc)
        raise ValueError(f"{where}: metrics.{loc}: {msg} (got {value!r}){more}") from None
