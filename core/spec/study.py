"""An experiment spec's ``study:`` block: the grid of sweeps and the axes they vary.

A study is a list of *sweeps*, each the Cartesian product of its axes, so that a
grid of severity x telemetry and a grid of label delay x label noise need not be
multiplied into each other::

    study:
      seeds: [0, 1, 2, 3, 4]
      sweeps:
        - name: severity
          axes: {severity: [0.2, 0.1, 0.05, 0.01], telemetry: [direct, delayed, none]}
        - name: labels
          set: {health.model: alert}
          policies: [FaultAwareLC, FaultAwareOTF-R]
          axes: {label_delay_s: [0, 5, 15, 30], label_noise: [0, 0.05, 0.2]}

An axis is a named study variable (:data:`NAMED_AXES`) or any dotted path into
the spec (``router.slow_loop_s``, ``faults.0.start_s``); an unknown name is
refused when the spec is read. The grid's expansion into cells, which validates
every point as a whole spec, is :mod:`study.grid` (it imports ``core.spec.model``,
which imports this module for the block's model).
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from vocab import FAULT_LINK

__all__ = ["NAMED_AXES", "AxisValue", "ClaimSideSpec", "ClaimSpec", "StudySpec", "SweepSpec", "axis_setter",
           "field_setter"]


# A group-sequential design's limits (study/looks.py): each look costs every test a share of the
# level, so more than three looks cost more power than they save seeds; a look reads at least two seeds
# (one seed decides nothing: analysis/rule/verdict.py MIN_SEEDS, which tests/test_looks.py holds equal).
MAX_LOOKS = 3
LOOK_MIN_SEEDS = 2


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


AxisValue = float | int | str | bool


class SweepSpec(_Spec):
    """One Cartesian product of axes (a sub-grid), with fields held fixed across it."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    axes: dict[str, list[AxisValue]] = Field(min_length=1)
    # Fields set for every point of this sweep (dotted paths, as axes are, or a top-level field).
    set: dict[str, Any] = Field(default_factory=dict)
    policies: list[str] | None = Field(None, min_length=1)  # default: the study's
    seeds: list[int] | None = Field(None, min_length=1)  # default: the study's

    @field_validator("axes")
    @classmethod
    def _values(cls, axes: dict[str, list[AxisValue]]) -> dict[str, list[AxisValue]]:
        for name, values in axes.items():
            if not values:
                raise ValueError(f"axis {name} has no values")
            if len({json.dumps(v) for v in values}) != len(values):
                raise ValueError(f"axis {name} lists a value twice: {values}")
            axis_setter(name)  # an unknown name fails here, at the file boundary
        return axes


class ClaimSideSpec(_Spec):
    """What a claim's effect is measured against: another policy, or the same at other axis values."""

    policy: str | None = None  # default: the claim's
    at: dict[str, AxisValue] = Field(default_factory=dict)  # over the claim's ``at``


class ClaimSpec(_Spec):
    """One claim of the study, as a number per world and seed (study/claims.py):
    ``metric`` of ``policy`` at the point ``at`` selects, minus (with ``vs``) the same metric of
    ``vs.policy`` at ``at`` updated by ``vs.at``. ``at`` names axis values and, optionally, the
    sweep (``sweep: name``); it must select exactly one point of the grid.

    How it is judged is fixed here, before any run (study/verdicts.py, docs/verdicts.md):
    ``direction`` the effect the study claims (``increase``, ``decrease``, or ``none``: no effect),
    ``margin`` the smallest effect that matters in the metric's units (for ``none``: the band inside
    which "no effect" holds; for every claim: how far the worlds may differ and still agree), and
    ``measure`` how the study states it: a ``difference``, or a ``ratio`` (``vs`` needed), e.g. "cuts
    failures by X%", reported beside the difference the verdict judges. ``minus`` names another claim
    whose effect is subtracted seed by seed: "the price's gain is larger with late labels" is the
    gain with late labels minus the gain on time (a difference of differences)."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    says: str = ""  # the claim in words, as the study states it
    metric: str
    policy: str
    at: dict[str, AxisValue] = Field(default_factory=dict)
    vs: ClaimSideSpec | None = None
    direction: Literal["increase", "decrease", "none"]
    margin: float = Field(gt=0)
    measure: Literal["difference", "ratio"] = "difference"
    minus: str | None = None

    @model_validator(mode="after")
    def _ratio_needs_vs(self) -> "ClaimSpec":
        if self.measure == "ratio" and self.vs is None:
            raise ValueError(f"claim {self.name}: a ratio needs a baseline (vs) to divide by")
        if self.measure == "ratio" and self.minus is not None:
            raise ValueError(f"claim {self.name}: a difference of two claims (minus) is a difference, not a ratio")
        return self


class StudySpec(_Spec):
    """The grid: ``sweeps`` x policies x seeds; and the claims its cells test."""

    policies: list[str] | None = Field(None, min_length=1)  # default: the spec's policies
    seeds: list[int] | None = Field(None, min_length=1)  # default: the spec's seeds
    sweeps: list[SweepSpec] = Field(min_length=1)
    claims: list[ClaimSpec] = Field(default_factory=list)
    # A group-sequential design (study/looks.py): the seed counts at which the claims are judged,
    # the last all of ``seeds``; a claim undecided at a look runs the next look's seeds. None: one look.
    looks: list[int] | None = None

    @model_validator(mode="after")
    def _looks_fit_the_seeds(self) -> "StudySpec":
        if self.looks is None:
            return self
        if not self.claims:
            raise ValueError("looks judge claims, and the study has none")
        if self.seeds is None:
            raise ValueError("looks read the first seeds of study.seeds in order: list them")
        if not 2 <= len(self.looks) <= MAX_LOOKS:
            raise ValueError(f"looks: two or {MAX_LOOKS} looks (each look costs the tests a share of the level), "
                             f"got {len(self.looks)}")
        if self.looks != sorted(set(self.looks)) or self.looks[0] < LOOK_MIN_SEEDS or self.looks[-1] != len(self.seeds):
            raise ValueError(f"looks {self.looks} must rise from at least {LOOK_MIN_SEEDS} seeds to the "
                             f"{len(self.seeds)} of study.seeds")
        return self

    @field_validator("sweeps", "claims")
    @classmethod
    def _unique_names(cls, items: list, info) -> list:
        names = [x.name for x in items]
        if len(set(names)) != len(names):
            raise ValueError(f"{info.field_name[:-1]} names must be unique, got {names}")
        return items

    @field_validator("claims")
    @classmethod
    def _minus_names_a_plain_claim(cls, claims: list[ClaimSpec]) -> list[ClaimSpec]:
        by = {c.name: c for c in claims}
        for c in claims:
            if c.minus is None:
                continue
            other = by.get(c.minus)
            if other is None or other is c:
                raise ValueError(f"claim {c.name}: minus names no other claim ({c.minus!r}; claims: {', '.join(by)})")
            if other.minus is not None or other.metric != c.metric:
                raise ValueError(f"claim {c.name}: minus {c.minus} must be a claim of the same metric ({c.metric}) "
                                 "without a minus of its own")
        return claims


# --------------------------------------------------------------------------- axes


def _set_path(spec: dict[str, Any], path: str, value: Any) -> None:
    """Set a dotted path (list items by index) in a spec dict; the parent must exist."""
    keys = path.split(".")
    node: Any = spec
    for i, k in enumerate(keys[:-1]):
        if isinstance(node, list):
            if not k.isdigit() or int(k) >= len(node):
                raise ValueError(f"{path}: {'.'.join(keys[:i])} has no item {k}")
            node = node[int(k)]
        elif isinstance(node, dict) and k in node and isinstance(node[k], (dict, list)):
            node = node[k]
        else:
            raise ValueError(f"{path}: the spec has no section {'.'.join(keys[: i + 1])}")
    last = keys[-1]
    if isinstance(node, list):
        if not last.isdigit() or int(last) >= len(node):
            raise ValueError(f"{path}: no item {last}")
        node[int(last)] = value
    else:
        node[last] = value  # an unknown field is refused when the point is validated


def _link_faults(spec: dict[str, Any], axis: str) -> list[dict[str, Any]]:
    links = [f for f in spec.get("faults", []) if f.get("kind", FAULT_LINK) == FAULT_LINK]
    if not links:
        raise ValueError(f"axis {axis} needs a link fault in the spec")
    return links


def _severity(spec: dict[str, Any], r: Any) -> None:
    """Every link fault's residual bandwidth factor: one severity per run, as the study does."""
    for f in _link_faults(spec, "severity"):
        f["residual_bw"] = r


def _label_noise(spec: dict[str, Any], q: Any) -> None:
    """Labels wrong a fraction q of the time, both ways. False positives (and flaps) are
    episodes of fixed length D started by a Poisson process of rate lambda while none runs
    (faults/health.py), so a label is wrong a fraction lambda D / (1 + lambda D) of the time:
    lambda = q / ((1 - q) D)."""
    if not isinstance(q, (int, float)) or not 0 <= q < 1:
        raise ValueError(f"axis label_noise is a fraction of time in [0, 1), got {q!r}")
    h = spec.setdefault("health", {})
    from faults.spec import HealthSpec

    d = HealthSpec.model_fields
    fp_d = h.get("false_positive_duration_s", d["false_positive_duration_s"].default)
    flap_d = h.get("flap_duration_s", d["flap_duration_s"].default)
    h["false_positive_rate_per_s"] = q / ((1 - q) * fp_d)
    h["flap_rate_per_s"] = q / ((1 - q) * flap_d)


def _load(spec: dict[str, Any], x: Any) -> None:
    """The arrival rate times x (load relative to the base spec's)."""
    arrival = spec.get("workload", {}).get("arrival", {})
    if "rate_rps" not in arrival or not isinstance(x, (int, float)) or x <= 0:
        raise ValueError(f"axis load scales workload.arrival.rate_rps by a number > 0 (got {x!r}; "
                         f"arrival kind {arrival.get('kind')!r})")
    arrival["rate_rps"] = arrival["rate_rps"] * x


def _degraded_pods(spec: dict[str, Any], n: Any) -> None:
    """Every link fault on pods 0 .. n-1: the share of the cluster's pods degraded, n / topology.pods."""
    pods = spec.get("topology", {}).get("pods")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1 or (pods is not None and n > pods):
        raise ValueError(f"axis degraded_pods is a number of pods from 1 to topology.pods ({pods}), got {n!r}")
    for f in _link_faults(spec, "degraded_pods"):
        f["pods"] = list(range(n))


def _fault_s(spec: dict[str, Any], s: Any) -> None:
    """Every link fault's length (duration_s), its start kept."""
    if isinstance(s, bool) or not isinstance(s, (int, float)) or s <= 0:
        raise ValueError(f"axis fault_s is a length in seconds > 0, got {s!r}")
    for f in _link_faults(spec, "fault_s"):
        f["duration_s"] = s


def _in_flight(spec: dict[str, Any], on: Any) -> None:
    """The router's own requests in flight as evidence for the price (telemetry.in_flight,
    core/in_flight.py): what a router without bandwidth telemetry can still see."""
    if not isinstance(on, bool):
        raise ValueError(f"axis in_flight is true or false, got {on!r}")
    _set_path(spec, "telemetry.in_flight", on)


def _label_miss(spec: dict[str, Any], p: Any) -> None:
    """Labels that never come: the chance a degradation's alert is never raised (model alert) or an
    ejection is not enforced (model checks): health.miss_prob."""
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 1:
        raise ValueError(f"axis label_miss is a probability in [0, 1], got {p!r}")
    _set_path(spec, "health.miss_prob", p)


# The fields of each kind of length distribution (workloads/spec.py) that are lengths in tokens.
_LENGTH_FIELDS = {"fixed": ("value",), "uniform": ("low", "high"), "lognormal": ("median",),
                  "choice": ("values",)}


def _prompt_scale(spec: dict[str, Any], x: Any) -> None:
    """Every prompt x times as long (the length distribution's tokens and bounds, its shape kept), at
    the same prompt tokens per second: the arrival rate divided by x. So prefill's offered load
    stays what the base spec sizes it to, and what moves is a request's KV (a pull's bytes, as the
    KV a token moves them) and how many requests carry it; without the division a longer prompt
    would also overload prefill. Output lengths stay."""
    if isinstance(x, bool) or not isinstance(x, (int, float)) or x <= 0:
        raise ValueError(f"axis prompt_scale is a factor > 0, got {x!r}")
    w = spec.get("workload", {})
    arrival = w.get("arrival", {})
    if "rate_rps" not in arrival:
        raise ValueError(f"axis prompt_scale needs synthetic arrivals with rate_rps (arrival kind "
                         f"{arrival.get('kind')!r}: a trace's lengths come from its file)")
    prompt = w.get("prompt")
    if prompt is None and w.get("profile") is not None:
        from workloads.spec import preset

        prompt = preset(w["profile"]).prompt.model_dump(mode="json")
    if not isinstance(prompt, dict) or prompt.get("kind") not in _LENGTH_FIELDS:
        raise ValueError("axis prompt_scale needs workload.prompt or a workload profile")
    prompt = dict(prompt)

    def scaled(n: Any) -> Any:
        return max(1, round(n * x)) if isinstance(n, int) else n * x  # a lognormal's median is a float

    for f in (*_LENGTH_FIELDS[prompt["kind"]], "min", "max"):
        v = prompt.get(f)
        if v is not None:
            prompt[f] = [scaled(n) for n in v] if isinstance(v, list) else scaled(v)
    w["prompt"] = prompt
    arrival["rate_rps"] = arrival["rate_rps"] / x


def _path(path: str) -> Callable[[dict[str, Any], Any], None]:
    return lambda spec, v: _set_path(spec, path, v)


# The study's variables by name (what the report's figures group by); any other axis is a
# dotted path into the spec.
NAMED_AXES: dict[str, Callable[[dict[str, Any], Any], None]] = {
    "severity": _severity,
    "telemetry": _path("telemetry.mode"),
    "label_delay_s": _path("health.detection_delay_s"),
    "label_noise": _label_noise,
    "load": _load,
    "ttft_timeout_s": _path("ttft_timeout_s"),
    "deadline_s": _path("deadline_s"),
    "degraded_pods": _degraded_pods,
    "fault_s": _fault_s,
    "kv_bytes_per_token": _path("topology.kv_bytes_per_token"),
    "in_flight": _in_flight,
    "label_miss": _label_miss,
    "prompt_scale": _prompt_scale,
}


def field_setter(name: str) -> Callable[[dict[str, Any], Any], None]:
    """What sets ``name`` of a sweep's ``set``: an axis (:func:`axis_setter`), or a top-level field of
    the spec (``faults``: a sweep with a fault list of its own)."""
    if name in NAMED_AXES or "." in name:
        return axis_setter(name)
    if re.fullmatch(r"[A-Za-z0-9_]+", name):
        return _path(name)
    raise ValueError(f"unknown field {name!r}: use one of {', '.join(NAMED_AXES)}, a field of the spec or a "
                     "dotted path into it")


def axis_setter(name: str) -> Callable[[dict[str, Any], Any], None]:
    """What sets axis ``name`` in a spec dict: a named axis, else a dotted path; ValueError if neither."""
    if name in NAMED_AXES:
        return NAMED_AXES[name]
    if "." in name and all(re.fullmatch(r"[A-Za-z0-9_]+", k) for k in name.split(".")):
        return _path(name)
    raise ValueError(f"unknown axis {name!r}: use one of {', '.join(NAMED_AXES)} or a dotted path into the spec")
