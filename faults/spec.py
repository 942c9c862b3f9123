"""Typed fault, health-label and telemetry specs (the file boundary: pydantic v2).

Times are seconds since run start. Pods are numbered ``0 .. n_pods-1``; the
range is checked by :class:`faults.schedule.FaultSchedule`, which knows n_pods.
"""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# Faults must never outlive the experiment, so an infinite duration is refused
# (allow_inf_nan=False) rather than read as "forever".
_CONFIG = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

Pod = Annotated[int, Field(ge=0)]


class _FaultBase(BaseModel):
    model_config = _CONFIG

    pods: list[Pod] = Field(min_length=1)
    start_s: float = Field(ge=0)
    duration_s: float = Field(gt=0)

    @field_validator("pods")
    @classmethod
    def _unique_pods(cls, pods: list[int]) -> list[int]:
        # One apply and one clear per (fault, pod): a repeated pod would double them.
        dup = sorted(p for p, n in Counter(pods).items() if n > 1)
        if dup:
            raise ValueError(f"pods listed twice: {dup}")
        return pods

    @property
    def end_s(self) -> float:
        """End of the half-open active interval [start_s, end_s)."""
        return self.start_s + self.duration_s


class LinkFault(_FaultBase):
    """The pods' core links (simulator) or NICs (testbed) keep ``residual_bw`` of their bandwidth."""

    kind: Literal["link"] = "link"
    residual_bw: float = Field(gt=0, le=1)  # r: 0.2, 0.1, 0.05, 0.01 in the study
    # uplink: traffic leaving the pod (KV its prefill engines serve, since decode
    # pulls); downlink: traffic entering it (KV its decode engines pull).
    direction: Literal["both", "uplink", "downlink"] = "both"
    # Testbed only: shape just the KV-transfer connections, not Ray's control
    # traffic (in the simulator every flow on a link is KV anyway).
    kv_only: bool = False
    # Testbed only, where the kernel has netem: added one-way delay and packet loss.
    delay_ms: float = Field(0.0, ge=0)
    loss: float = Field(0.0, ge=0, lt=1)

    @property
    def uplink(self) -> bool:
        return self.direction in ("both", "uplink")

    @property
    def downlink(self) -> bool:
        return self.direction in ("both", "downlink")

    @property
    def severity(self) -> float:
        return self.residual_bw


class ComputeFault(_FaultBase):
    """The pods' workers take ``slowdown`` times as long for the same work."""

    kind: Literal["compute"] = "compute"
    slowdown: float = Field(ge=1)

    @property
    def severity(self) -> float:
        return self.slowdown


FaultSpec = Annotated[LinkFault | ComputeFault, Field(discriminator="kind")]


class HealthSpec(BaseModel):
    """How the ground truth is turned into the health labels the router sees.

    The defaults model a faithful but not instant detector: no misses, no
    noise, a few seconds of delay each way. Noise is an experimental knob, off
    by default so that a baseline run's labels are easy to interpret.
    """

    model_config = _CONFIG

    # Label refresh period: a 1 s probe / scrape cadence is common for serving
    # fleets and is short next to the delays below, so it is not what dominates.
    period_s: float = Field(1.0, gt=0)
    # Time a degradation must persist before it is labelled: e.g. five failed
    # 1 s probes, or an alert rule's `for:` window.
    detection_delay_s: float = Field(5.0, ge=0)
    # Hysteresis before a recovered pod is trusted again, so one good probe
    # does not re-admit it; symmetric with detection.
    clear_delay_s: float = Field(5.0, ge=0)
    # Probability an episode is never detected (drawn once per onset).
    miss_prob: float = Field(0.0, ge=0, le=1)
    # Spurious unhealthy labels on truly healthy pods (Poisson, per pod).
    false_positive_rate_per_s: float = Field(0.0, ge=0)
    # A spurious alert lasts about as long as detection + clear hysteresis.
    false_positive_duration_s: float = Field(10.0, gt=0)
    # Spurious returns to healthy on detected pods (Poisson, per pod).
    flap_rate_per_s: float = Field(0.0, ge=0)
    # A flap lasts a couple of probe periods until the next failing probe re-flags.
    flap_duration_s: float = Field(2.0, gt=0)
    # Ground-truth thresholds. The study's r (<= 0.2) and slowdowns are all
    # meant to count, so by default any throttle (r < 1) or slowdown (> 1) does.
    min_residual_bw: float = Field(1.0, gt=0, le=1)
    min_slowdown: float = Field(1.0, ge=1)


class TelemetrySpec(BaseModel):
    """What the risk price sees of the pods' bandwidth."""

    model_config = _CONFIG

    # direct: latest value; delayed: the value lag_s ago; none: no bandwidth
    # term (the price falls back on utilisation, timeout and failure history).
    mode: Literal["direct", "delayed", "none"] = "direct"
    lag_s: float = Field(10.0, ge=0)
