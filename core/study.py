"""The study's grid: an experiment spec's ``study:`` block, expanded into cells.

A *cell* is one simulator run: a *point* of the grid (the base spec with some
fields swept to given values), one policy, one seed. A study is a list of
*sweeps*, each the Cartesian product of its axes, so that a grid of
severity x telemetry and a grid of label delay x label noise need not be
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
the spec (``router.slow_loop_s``, ``faults.0.start_s``). Every point is
validated as a whole spec before anything runs, and an error names the sweep
and the point. A cell's id hashes its resolved spec, policy and seed, so a cell
whose inputs are unchanged is the same cell across runs of the study and a
changed spec makes new cells.

Cells whose records cannot differ share one run: the same policy and seed at
two points whose specs differ only in their names (a sweep that repeats
another's point), or only in what feeds the risk price, for a policy that does
not read it (LC at telemetry direct and none). A cell's *run* id hashes what
its records depend on (:func:`run_inputs`); resuming skips finished runs.

Pure: no Ray, no simulator; ``cli/study_runner.py`` runs the cells.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
import re
from dataclasses import dataclass, replace
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["NAMED_AXES", "PRICE_ONLY_SECTIONS", "Cell", "StudySpec", "SweepSpec", "expand_study", "run_inputs"]


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


AxisValue = float | int | str | bool


class SweepSpec(_Spec):
    """One Cartesian product of axes (a sub-grid), with fields held fixed across it."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    axes: dict[str, list[AxisValue]] = Field(min_length=1)
    # Fields set for every point of this sweep (dotted paths, as axes are).
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
            _axis_setter(name)  # an unknown name fails here, at the file boundary
        return axes


class StudySpec(_Spec):
    """The grid: ``sweeps`` x policies x seeds."""

    policies: list[str] | None = Field(None, min_length=1)  # default: the spec's policies
    seeds: list[int] | None = Field(None, min_length=1)  # default: the spec's seeds
    sweeps: list[SweepSpec] = Field(min_length=1)

    @field_validator("sweeps")
    @classmethod
    def _unique_names(cls, sweeps: list[SweepSpec]) -> list[SweepSpec]:
        names = [s.name for s in sweeps]
        if len(set(names)) != len(names):
            raise ValueError(f"sweep names must be unique, got {names}")
        return sweeps


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


def _severity(spec: dict[str, Any], r: Any) -> None:
    """Every link fault's residual bandwidth factor: one severity per run, as the study does."""
    links = [f for f in spec.get("faults", []) if f.get("kind", "link") == "link"]
    if not links:
        raise ValueError("axis severity needs a link fault in the spec (it sets every link fault's residual_bw)")
    for f in links:
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
}


def _axis_setter(name: str) -> Callable[[dict[str, Any], Any], None]:
    if name in NAMED_AXES:
        return NAMED_AXES[name]
    if "." in name and all(re.fullmatch(r"[A-Za-z0-9_]+", k) for k in name.split(".")):
        return _path(name)
    raise ValueError(f"unknown axis {name!r}: use one of {', '.join(NAMED_AXES)} or a dotted path into the spec")


# --------------------------------------------------------------------------- cells


@dataclass(frozen=True)
class Cell:
    """One cell of the grid: a point, a policy, a seed; and the run that gives its records."""

    cell: str  # id: hash of the resolved point spec, policy and seed
    point: str  # the point's name (also its spec's name and the run directory's scenario)
    sweep: str
    axes: dict[str, AxisValue]  # the sweep's axes at this point
    policy: str
    seed: int
    spec: Any  # the resolved ExperimentSpec of the point (without the study block)
    # The run whose records are this cell's: a hash of what the run's records depend on
    # (:func:`run_inputs`). Cells with the same run share one run directory, the first's.
    run: str = ""
    run_dir: str = ""  # relative to the study directory

    def __post_init__(self) -> None:
        if not self.run:
            object.__setattr__(self, "run", self.cell)
        if not self.run_dir:  # core.experiment.run_dir_for with out = cells
            object.__setattr__(self, "run_dir", f"cells/{self.point}/{self.policy}/seed-{self.seed}")

    @property
    def shared(self) -> bool:
        """True when another cell's run gives this cell's records."""
        return self.run_dir != f"cells/{self.point}/{self.policy}/seed-{self.seed}"

    def index_row(self) -> dict[str, Any]:
        """The cell as study.json lists it."""
        return {"cell": self.cell, "point": self.point, "sweep": self.sweep, "axes": dict(self.axes),
                "policy": self.policy, "seed": self.seed, "run": self.run, "run_dir": self.run_dir}


def _fmt(v: AxisValue) -> str:
    if isinstance(v, float) and v.is_integer() and not math.isinf(v):
        v = int(v)
    return re.sub(r"[^A-Za-z0-9.]+", "-", str(v)).strip("-") or "x"


def point_name(sweep: str, axes: dict[str, AxisValue]) -> str:
    """A readable, file-name-safe, unique name of a point: ``sweep__axis-value_axis-value``."""
    parts = [f"{re.sub(r'[^A-Za-z0-9]+', '-', k)}-{_fmt(v)}" for k, v in axes.items()]
    return f"{sweep}__{'_'.join(parts)}"


def _digest(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _cell_id(point_spec: dict[str, Any], policy: str, seed: int) -> str:
    return _digest({"spec": point_spec, "policy": policy, "seed": seed})


# Spec sections that feed nothing but the risk price (bandwidth telemetry: core/routing.py hands it to
# the price estimator only). A policy that does not read the price (core.policies.reads_price: LC,
# FaultAwareLC, OracleAvoidance...) routes the same whatever they hold, so its requests, decisions,
# health and faults are the same (tests/test_study.py checks it); only prices.parquet, the price it
# ignored, differs.
PRICE_ONLY_SECTIONS = ("telemetry",)


def run_inputs(point_spec: Any, policy: str, seed: int) -> dict[str, Any]:
    """What a run's records depend on: the resolved point spec without its name, description, seeds and
    policy list (a run is one policy: only its weights count), without the price-only sections for a
    policy that does not read the price; plus the policy and seed."""
    from core.policies import reads_price

    weights = point_spec.weights_for(policy)
    inputs = point_spec.model_dump(mode="json", exclude={"name", "description", "seeds", "policies", "weights",
                                                         "study"})
    if not reads_price(policy, weights):
        for section in PRICE_ONLY_SECTIONS:
            inputs.pop(section, None)
    return {"spec": inputs, "weights": weights.model_dump(mode="json"), "policy": policy, "seed": seed}


def expand_study(spec: Any, source: str = "<spec>") -> list[Cell]:
    """Every cell of ``spec.study``: per sweep, the product of its axes, then policies, then seeds. A cell
    whose run an earlier cell already has (same run id) gets that cell's ``run_dir``.

    Raises a one-line ``core.spec.SpecError`` naming the sweep and point that cannot be built.
    """
    from core.spec import SpecError, parse_spec

    study: StudySpec | None = spec.study
    if study is None:
        raise SpecError(f"{source}: no study: block (a study needs sweeps of axes; see experiments/study.yaml)")
    base = spec.model_dump(mode="json", exclude={"study"})
    known = [p["name"] for p in base["policies"]]
    cells: list[Cell] = []
    seen: dict[str, str] = {}
    runs: dict[str, Cell] = {}
    for i, sw in enumerate(study.sweeps):
        policies = sw.policies or study.policies or known
        seeds = sw.seeds or study.seeds or base["seeds"]
        names = list(sw.axes)
        for values in itertools.product(*(sw.axes[n] for n in names)):
            axes = dict(zip(names, values))
            name = point_name(sw.name, axes)
            where = f"{source}: study.sweeps[{i}] ({sw.name}) point {name}"
            data = copy.deepcopy(base)
            data["name"] = name
            data["seeds"] = list(seeds)
            for p in policies:  # a study policy the spec does not list runs with the spec-wide weights
                if p not in known:
                    data["policies"].append({"name": p})
            try:
                for path, v in sw.set.items():
                    _axis_setter(path)(data, v)
                for n, v in axes.items():
                    _axis_setter(n)(data, v)
            except ValueError as e:
                raise SpecError(f"{where}: {e}") from None
            point_spec = parse_spec(data, where)
            resolved = point_spec.model_dump(mode="json")
            if name in seen:
                raise SpecError(f"{where}: two points share this name (from {seen[name]})")
            seen[name] = sw.name
            for p in policies:
                for s in seeds:
                    cell = Cell(_cell_id(resolved, p, s), name, sw.name, axes, p, s, point_spec,
                                run=_digest(run_inputs(point_spec, p, s)))
                    first = runs.setdefault(cell.run, cell)  # the first cell of a run holds it
                    cells.append(cell if first is cell else replace(cell, run_dir=first.run_dir))
    return cells
