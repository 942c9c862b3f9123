"""Typed fault, health-label and telemetry specs (the file boundary: pydantic v2).

Times are seconds since run start. Pods are numbered ``0 .. n_pods-1``; the
range is checked by :class:`faults.schedule.FaultSchedule`, which knows n_pods.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from vocab import ROLE_BOTH, Role

# Faults must never outlive the experiment, so an infinite duration is refused
# (allow_inf_nan=False) rather than read as "forever".
_CONFIG = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

Pod = Annotated[int, Field(ge=0)]


class _OnPods(BaseModel):
    model_config = _CONFIG

    pods: list[Pod] = Field(min_length=1)
    start_s: float = Field(ge=0)

    @field_validator("pods")
    @classmethod
    def _unique_pods(cls, pods: list[int]) -> list[int]:
        # One apply and one clear per (fault, pod): a repeated pod would double them.
        dup = sorted(p for p, n in Counter(pods).items() if n > 1)
        if dup:
            raise ValueError(f"pods listed twice: {dup}")
        return pods


class _FaultBase(_OnPods):
    duration_s: float = Field(gt=0)

    @property
    def end_s(self) -> float:
        """End of the half-open active interval [start_s, end_s)."""
        return self.start_s + self.duration_s


class LinkFault(_FaultBase):
    """The pods' core links (simulator) or NICs (testbed) keep ``residual_bw`` of their bandwidth.

    ``residual_bw: 0`` is a link down, the commonest real link fault: nothing crosses it, so a
    KV pull across it never completes (its request times out). On the testbed the shaped
    traffic is dropped whole (testbed/faults/shaping.py)."""

    kind: Literal["link"] = "link"
    residual_bw: float = Field(ge=0, le=1)  # r: 0.2, 0.1, 0.05, 0.01 in the study; 0: down
    # uplink: traffic leaving the pod (KV its prefill engines serve, since decode
    # pulls); downlink: traffic entering it (KV its decode engines pull).
    direction: Literal["both", "uplink", "downlink"] = "both"
    # Testbed only: shape just the KV-transfer connections, not Ray's control
    # traffic (in the simulator every flow on a link is KV anyway).
    kv_only: bool = False
    # Testbed only, where the kernel has netem: added one-way delay and packet loss.
    delay_ms: float = Field(0.0, ge=0)
    loss: float = Field(0.0, ge=0, lt=1)

    @model_validator(mode="after")
    def _down_carries_nothing(self) -> "LinkFault":
        if self.residual_bw == 0 and (self.delay_ms > 0 or self.loss > 0):
            raise ValueError("a link down (residual_bw 0) carries nothing to delay or lose: drop delay_ms and loss")
        return self

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


class EngineFault(_OnPods):
    """The pods' engines of ``role`` die at ``start_s``, as after a crash or the OOM killer: on the
    testbed their process is SIGKILLed (``core``: vLLM's engine core, under an actor that lives on
    and then raises EngineDeadError; ``actor``: the engine actor's own process, vLLM's front end
    with it). The requests they hold end as ``error`` in the stage they are in, and the router stops
    choosing them from their own state, in both worlds by the testbed's liveness rule
    (docs/reliability.md "Engine death in both worlds"). With ``restart_s`` a new engine core is
    started that long after the kill, as a supervisor restarts a crashed process; it serves once
    started (``engine.engine_start_s`` in the simulator) and the router's liveness check finds it
    up. Without, the engines stay down for the rest of the run (the testbed's next run starts on a
    new set of engines)."""

    kind: Literal["engine"] = "engine"
    role: Role = ROLE_BOTH
    process: Literal["core", "actor"] = "core"
    restart_s: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _restart_of_a_core(self) -> "EngineFault":
        if self.restart_s is not None and self.process != "core":
            # the actor's process is Ray's to restart (max_restarts), with its own timing and errors
            raise ValueError("restart_s restarts an engine core (process: core); a dead actor stays dead")
        return self

    @property
    def end_s(self) -> float:
        """When the engines are started again (the fault's ``clear``); inf: never within the run."""
        return math.inf if self.restart_s is None else self.start_s + self.restart_s

    @property
    def severity(self) -> float:
        return 0.0  # the capacity the dead engines keep

    def kills(self, role: str) -> bool:
        """Whether this fault kills the engines of ``role`` (vocab.ENGINE_ROLES)."""
        return self.role in (ROLE_BOTH, role)


FaultSpec = Annotated[LinkFault | ComputeFault | EngineFault, Field(discriminator="kind")]


class HealthSpec(BaseModel):
    """How the health labels the router's mask reads are made.

    ``model: checks`` (the default) is what production runs (``faults/health.py``): an active
    probe of each pod, Kubernetes style, with a timeout on what it observes, and passive outlier
    detection on the requests' own failures, Envoy style. Neither sees a link running at a
    fraction of its rate as such: the probe's answer is tiny, and requests only fail once the
    degradation is severe enough to time them out. Detection thus depends on severity, and soft
    degradations pass. ``model: alert`` is a monitor that sees the ground truth itself and flags
    every degradation after ``detection_delay_s`` (an alert rule's ``for:`` window): the study's
    "delayed label", the knob for sweeps of label delay and noise.

    Noise (misses, false positives, flapping) applies to either; off by default so that a
    baseline run's labels are easy to interpret.
    """

    model_config = _CONFIG

    model: Literal["checks", "alert"] = "checks"
    # --- checks: the active probe (Kubernetes' readiness-probe defaults: periodSeconds 10,
    # timeoutSeconds 1, failureThreshold 3, successThreshold 1).
    probe_period_s: float = Field(10.0, gt=0)
    probe_timeout_s: float = Field(1.0, gt=0)
    probe_failure_threshold: int = Field(3, ge=1)
    probe_success_threshold: int = Field(1, ge=1)
    # What the probe's answer waits behind on a saturated pod core link: at most the switch's
    # buffer. Broadcom Tomahawk 5 (51.2 Tbit/s) has 165.2 MB of packet buffer shared by all its
    # ports; a queue cannot hold more. Round trip = this / the link's rate: 31 ms at r = 0.01 of
    # the flagship's 533 GB/s core links, so no link degradation short of a dead link fails the
    # probe, as in production.
    probe_queue_bytes: float = Field(165.2e6, ge=0)
    # --- checks: passive outlier detection (Envoy's outlier_detection defaults): a pod is
    # ejected after consecutive_5xx = 5 failed requests in a row (a timed-out request is a 504),
    # for base_ejection_time = 30 s x the times it was ejected, at most max_ejection_time = 300 s,
    # never more than max_ejection_percent = 10% of the pods at once (but at least one); the
    # multiplier drops by one per interval = 10 s spent not ejected. ``miss_prob`` is the chance
    # an ejection is not enforced (Envoy's enforcing_consecutive_5xx = 100% by default).
    outlier_consecutive_failures: int = Field(5, ge=1)
    outlier_base_ejection_s: float = Field(30.0, gt=0)
    outlier_max_ejection_s: float = Field(300.0, gt=0)
    outlier_max_ejection_percent: float = Field(10.0, ge=0, le=100)
    outlier_interval_s: float = Field(10.0, gt=0)

    # How often the router reads the labels (both models), and the alert monitor's cadence: a 1 s
    # scrape is common for serving fleets and short next to the delays, so it does not dominate.
    period_s: float = Field(1.0, gt=0)
    # --- alert: time a degradation must persist before it is labelled: e.g. five failed
    # 1 s probes, or an alert rule's `for:` window.
    detection_delay_s: float = Field(5.0, ge=0)
    # Hysteresis before a recovered pod is trusted again, so one good probe
    # does not re-admit it; symmetric with detection.
    clear_delay_s: float = Field(5.0, ge=0)
    # alert: probability an episode is never detected (drawn once per onset); checks: probability
    # an ejection is not enforced (1 - Envoy's enforcing_consecutive_5xx).
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

    @model_validator(mode="after")
    def _fields_of_its_model(self) -> "HealthSpec":
        return _check_model_fields(self)


_ALERT_ONLY = ("detection_delay_s", "clear_delay_s")


def _check_model_fields(spec: "HealthSpec") -> "HealthSpec":
    """A field of the other model set away from its default would be silently ignored: refuse it
    (a dumped spec carries every field at its default, which is fine)."""
    other = _ALERT_ONLY if spec.model == "checks" else [f for f in type(spec).model_fields
                                                         if f.startswith(("probe_", "outlier_"))]
    bad = [f for f in other if getattr(spec, f) != type(spec).model_fields[f].default]
    if bad:
        raise ValueError(f"{bad[0]} does not apply to model: {spec.model}")
    return spec


class TelemetrySpec(BaseModel):
    """What the risk price sees of the pods' bandwidth."""

    model_config = _CONFIG

    # direct: latest value; delayed: the value lag_s ago; none: no bandwidth
    # term (the price falls back on utilisation, timeout and failure history).
    mode: Literal["direct", "delayed", "none"] = "direct"
    lag_s: float = Field(10.0, ge=0)
    # The router's own requests still in flight as evidence too (core/in_flight.py): one handed
    # to decode longer ago than any that ended ok in the history window counts as a timeout of
    # its pods until it ends. Off: the study's plain history (finished requests only).
    in_flight: bool = False
