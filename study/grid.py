"""The study's grid: an experiment spec's ``study:`` block, expanded into cells.

A *cell* is one simulator run: a *point* of the grid (the base spec with some
fields swept to given values), one policy, one seed. The block itself (sweeps,
axes, :data:`core.spec.study.NAMED_AXES`) is :mod:`core.spec.study`. Every point is
validated as a whole spec before anything runs, and an error names the sweep
and the point. A cell's id hashes its resolved spec, policy and seed, so a cell
whose inputs are unchanged is the same cell across runs of the study and a
changed spec makes new cells.

Cells whose records cannot differ share one run: the same policy and seed at
two points whose specs differ only in their names (a sweep that repeats
another's point), or only in what feeds the risk price, for a policy that does
not read it (LC at telemetry direct and none). A cell's *run* id hashes what
its records depend on (:func:`run_inputs`); resuming skips finished runs.

Pure: no Ray, no simulator; ``study/runner.py`` runs the cells.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
import re
from dataclasses import dataclass, replace
from typing import Any

from core.spec.model import SpecError, parse_spec
from core.spec.study import AxisValue, StudySpec, axis_setter, field_setter

# A study directory's index and a finished run's mark (study/table.py reads them, study/ writes
# them): named here, below both, so the runner needs no analysis import to spell them.
STUDY_FILE = "study.json"
CELL_FILE = "cell.json"

__all__ = ["PRICE_ONLY_SECTIONS", "Cell", "ClaimSides", "choose_sweeps", "claim_sides", "distinct_runs",
           "expand_study", "run_inputs"]


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


def run_digest(point_spec: Any, policy: str, seed: int) -> str:
    """A run's id: the digest of :func:`run_inputs`."""
    return _digest(run_inputs(point_spec, policy, seed))


def expand_study(spec: Any, source: str = "<spec>") -> list[Cell]:
    """Every cell of ``spec.study``: per sweep, the product of its axes, then policies, then seeds. A cell
    whose run an earlier cell already has (same run id) gets that cell's ``run_dir``.

    Raises a one-line ``core.spec.model.SpecError`` naming the sweep and point that cannot be built.
    """
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
                    field_setter(path)(data, v)
                for n, v in axes.items():
                    axis_setter(n)(data, v)
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
                                run=run_digest(point_spec, p, s))
                    first = runs.setdefault(cell.run, cell)  # the first cell of a run holds it
                    cells.append(cell if first is cell else replace(cell, run_dir=first.run_dir))
    return cells


def choose_sweeps(spec: Any, cells: list[Cell], sweeps: list[str] | None, source: str = "<spec>") -> list[Cell]:
    """The cells of ``sweeps`` (all with None); a name the study lacks is a one-line ValueError."""
    names = [sw.name for sw in spec.study.sweeps]
    unknown = [n for n in sweeps or [] if n not in names]
    if unknown:
        raise ValueError(f"{source}: no sweep named {unknown[0]!r}; the study has {', '.join(names)}")
    return [c for c in cells if sweeps is None or c.sweep in sweeps]


def distinct_runs(cells: list[Cell], chosen: list[Cell]) -> list[Cell]:
    """One cell per run of ``chosen``: the run's first cell in the whole grid ``cells``, which holds its
    place (it may lie in a sweep not chosen)."""
    holders = {c.run: c for c in reversed(cells)}
    return list({c.run: holders[c.run] for c in chosen}.values())


# --------------------------------------------------------------------------- claims


@dataclass(frozen=True)
class ClaimSides:
    """Where a claim's effect is read: ``metric`` of (point, policy), minus that of ``vs`` if any."""

    name: str
    says: str
    metric: str
    point: str
    policy: str
    vs: tuple[str, str] | None  # (point, policy)
    direction: str  # how it is judged: core.spec.study.ClaimSpec
    margin: float
    measure: str
    minus: "ClaimSides | None" = None  # the claim whose effect is subtracted seed by seed


def claim_cells(s: ClaimSides) -> int:
    """The cells a claim's effect is made of: 1, or 2 with ``vs``, plus those of its ``minus``."""
    return (1 if s.vs is None else 2) + (claim_cells(s.minus) if s.minus is not None else 0)


def claim_points(s: ClaimSides) -> list[str]:
    """Every point a claim's effect reads, its ``minus``'s included."""
    return [s.point, *([s.vs[0]] if s.vs is not None else []), *(claim_points(s.minus) if s.minus is not None else [])]


def claim_reads(s: ClaimSides) -> list[tuple[str, str]]:
    """Every (point, policy) cell a claim's effect reads, its ``minus``'s included."""
    return [(s.point, s.policy), *([s.vs] if s.vs is not None else []), *(claim_reads(s.minus) if s.minus else [])]


_NO_AXIS = object()  # a cell's sweep does not vary the axis a claim names


def _select(cells: list[Cell], at: dict[str, AxisValue], policy: str, where: str) -> str:
    """The one point whose cells match ``at`` (axis values; ``sweep``: the sweep's name) and run ``policy``."""
    def matches(c: Cell) -> bool:
        return c.policy == policy and all(c.sweep == v if k == "sweep" else c.axes.get(k, _NO_AXIS) == v
                                          for k, v in at.items())

    points = sorted({c.point for c in cells if matches(c)})
    if len(points) != 1:
        found = f"{len(points)} points ({', '.join(points[:3])}{', ...' if len(points) > 3 else ''})" if points \
            else "no point"
        raise SpecError(f"{where}: at {json.dumps(at)} with policy {policy} selects {found}; it must select one "
                        f"(name the sweep and every axis it varies)")
    return points[0]


def claim_sides(spec: Any, cells: list[Cell], source: str = "<spec>") -> list[ClaimSides]:
    """Each of ``spec.study.claims`` resolved to the points and policies of ``cells`` (expand_study's) it
    reads; a claim that selects no point or several raises a one-line SpecError naming it."""
    out = []
    for i, c in enumerate(spec.study.claims if spec.study else []):
        where = f"{source}: study.claims[{i}] ({c.name})"
        point = _select(cells, c.at, c.policy, where)
        vs = None
        if c.vs is not None:
            other = c.vs.policy or c.policy
            vs = (_select(cells, {**c.at, **c.vs.at}, other, f"{where} vs"), other)
            if vs == (point, c.policy):
                raise SpecError(f"{where}: vs selects the claim's own cells ({point}, {other}): its effect would be 0")
        out.append(ClaimSides(c.name, c.says, c.metric, point, c.policy, vs, c.direction, c.margin, c.measure))
    by = {s.name: s for s in out}
    return [replace(s, minus=by[c.minus]) if c.minus else s for s, c in zip(out, spec.study.claims if spec.study else [])]
