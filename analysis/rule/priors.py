"""The verdict rule's priors for the seeds' variance (core/defaults/priors.yaml; analysis/rule/verdict.py
``Prior``, docs/verdicts.md): per metric and kind of fault, fixed before the runs they judge; a run's
size, which scales a share's prior, is core.spec.sizes.workload_requests.

The kind of fault of a run is what its spec's faults are (:func:`fault_kind`): a study's cells of
one kind pool their repeat, and a claim reading cells of several kinds takes the widest prior among
them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from functools import lru_cache
from importlib import resources
from typing import Any

import yaml

from core.spec.sizes import field_of
from vocab import FAULT_LINK

# The kinds of fault a prior may differ by, in the order :func:`fault_kind` takes the first present.
NONE, LINK, LINK_DOWN, COMPUTE, ENGINE = KINDS = ("none", "link", "link_down", "compute", "engine")
_ORDER = (LINK_DOWN, ENGINE, LINK, COMPUTE)


def fault_kind(faults: Iterable[Any]) -> str:
    """The kind of fault of a run's faults (faults.spec models, or their dicts as run.json holds
    them): a link down (residual_bw 0) before an engine fault before a degraded link before a slow
    engine; "none" without faults."""
    kinds: set[str] = set()
    for f in faults or ():
        kind = field_of(f, "kind")
        kinds.add(LINK_DOWN if kind == FAULT_LINK and field_of(f, "residual_bw") == 0 else kind)
    return next((k for k in _ORDER if k in kinds), NONE)


def widest(kinds: Iterable[str]) -> str:
    """The first of ``kinds`` in the order :func:`fault_kind` takes them ("none" for none)."""
    have = set(kinds)
    return next((k for k in _ORDER if k in have), NONE)


@lru_cache(maxsize=1)
def _raw() -> dict[str, Any]:
    return yaml.safe_load(resources.files("core.defaults").joinpath("priors.yaml").read_text()) or {}


def prior_of(metric: str, kind: str = NONE, requests: float = math.nan) -> tuple[float, float] | None:
    """(sigma per run, df) of ``metric`` under ``kind``, scaled to a run of ``requests`` where the
    metric is a share of a run's requests; None where no prior is shipped for the metric."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind of fault {kind!r} (known: {', '.join(KINDS)})")
    entry = _raw().get(metric)
    if not entry:
        return None
    p = entry.get(kind) or entry["default"]
    sigma = float(p["sigma"])
    if "per_requests" in entry and requests and not math.isnan(requests):
        sigma *= math.sqrt(float(entry["per_requests"]) / requests)
    return sigma, float(p["df"])
