"""Parameters fitted from testbed runs (core/defaults/fits.yaml): each on a named set of runs, frozen,
with the prediction interval new runs are judged against (analysis/rule/verdict.py
``prediction_interval``; docs/verdicts.md "Fitting apart from judging").

A fit is read, never made here: refitting is naming a new set of runs in the file. The file also
records the testbed's run-to-run spread of the twin's checks (``testbed_spread``), which the verdict
rule's latency priors cite (core/defaults/priors.yaml).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

import yaml

STATISTICS = {"median": statistics.median, "mean": statistics.fmean}


@dataclass(frozen=True)
class Fit:
    """One fitted parameter: its samples, where they came from, the value the specs carry."""

    name: str
    what: str
    fitted_on: str
    samples: tuple[float, ...]
    statistic: str

    @property
    def value(self) -> float:
        return float(STATISTICS[self.statistic](self.samples))


@lru_cache(maxsize=1)
def _raw() -> dict[str, Any]:
    return yaml.safe_load(resources.files("core.defaults").joinpath("fits.yaml").read_text()) or {}


def fit(name: str) -> Fit:
    """The fit of ``name`` from core/defaults/fits.yaml; KeyError naming the known ones if absent."""
    raw = _raw()
    if name not in raw or name == "testbed_spread":
        known = ", ".join(k for k in raw if k != "testbed_spread")
        raise KeyError(f"no fit named {name!r} in core/defaults/fits.yaml (known: {known})")
    f = raw[name]
    if f["statistic"] not in STATISTICS:
        raise ValueError(f"fit {name}: unknown statistic {f['statistic']!r} (known: {', '.join(STATISTICS)})")
    return Fit(name, f["what"], f["fitted_on"], tuple(float(x) for x in f["samples"]), f["statistic"])
