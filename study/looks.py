"""A group-sequential design for a study's claims: the verdicts read at two or three looks, seeds
added only where a claim is still undecided (docs/verdicts.md "Looks: seeds added only where claims
are undecided").

* **Looks** are seed counts n_1 < ... < n_K, the last the study's number of seeds (the spec's
  ``study.looks``); look k reads the first n_k of the study's seeds in the order ``study.seeds``
  lists them. Without looks a study has one, at all its seeds.
* **The level split across looks**: every one-sided test of look k at ALPHA / K (Bonferroni). A
  claim whose true paired difference lies on a margin is wrongly said to carry over at one look with
  probability at most ALPHA / K, so over the K looks at most ALPHA, however the looks correlate (the
  union bound). Pocock's and O'Brien-Fleming's boundaries spend the level less wastefully but are
  derived for a z statistic of known variance (Jennison & Turnbull, Group Sequential Methods with
  Applications to Clinical Trials, 2000, ch. 2-3); with 2 to 12 seeds and a pooled t, the union bound
  is the split that holds without a further approximation. :func:`simulate` measures what it costs.
* **The variance frozen at each look**: a look's interval pools its own seeds' variance with the
  prior, as a study of n_k seeds would (analysis/rule/verdict.py); a later look never rewrites an earlier one.
* **A decided claim is never judged again**: its verdict is that of the first look that decides it
  either way (the finding's equivalence test); a claim undecided at look k runs look k+1's seeds.
  Judging is stateless: the same runs give the same look and verdict whenever they are judged, and
  seeds a decided claim's cells ran for another claim's sake are not read for it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np
from scipy import stats

from analysis.rule.verdict import ALPHA, EPS, FAIL, MIN_SEEDS, PASS, UNDECIDED, Prior, NO_PRIOR, pooled_sd

T = TypeVar("T")


def look_level(looks: int) -> float:
    """Each one-sided test's level at a look of a design of ``looks`` looks (module docstring)."""
    if looks < 1:
        raise ValueError(f"a design has at least one look, got {looks}")
    return ALPHA / looks


def look_seeds(looks: Sequence[int] | None, seeds: Sequence[int]) -> list[list[int]]:
    """The seeds each look reads: the first n_k of ``seeds`` (one look of them all without ``looks``)."""
    if not looks:
        return [list(seeds)]
    if list(looks) != sorted(set(looks)) or looks[0] < MIN_SEEDS or looks[-1] != len(seeds):
        raise ValueError(f"looks {list(looks)} must rise from at least {MIN_SEEDS} seeds to the study's "
                         f"{len(seeds)}")
    return [list(seeds[:n]) for n in looks]


def first_decided(looks: Sequence[int] | None, seeds: Sequence[int],
                  judge: Callable[[list[int], float], tuple[str, T]]) -> tuple[int, T | None, str]:
    """Judge look after look: ``judge(its seeds, its level)`` returns (the finding's equivalence
    verdict, whatever the caller keeps, or "" when the look's seeds are not all there yet) and the
    first look that decides ends it. Returns (the look judged, 1-based, 0 where look 1 is not reached;
    what the judge kept at that look; why later looks were not read: "" or "look k needs n seeds")."""
    per_look = look_seeds(looks, seeds)
    level = look_level(len(per_look))
    kept: T | None = None
    judged = 0
    for k, chosen in enumerate(per_look, start=1):
        verdict, out = judge(chosen, level)
        if verdict == "":  # the look's seeds are not all run yet: stop at the last complete look
            return judged, kept, f"look {k} needs {len(chosen)} seeds in both worlds"
        judged, kept = k, out
        if verdict != UNDECIDED:
            break
    return judged, kept, ""


def simulate(looks: Sequence[int], sigma: float, lo: float, hi: float, delta: float,
             prior: Prior = NO_PRIOR, reps: int = 20000, seed: int = 0,
             level: float | None = None) -> dict[str, float]:
    """The design's operating characteristics by simulation: ``reps`` studies whose per-seed values
    are normal(``delta``, ``sigma``), each judged look by look by the rule (the equivalence test of
    [lo, hi] at each look's level, the variance pooled with ``prior`` at each look, the first
    decision kept). Returns the share of studies that pass ("carries over"), fail, stay undecided,
    and the mean number of seeds run. At delta on a bound, "pass" is the design's error rate.
    ``level``: each test's level instead of the split's (to show what the split prevents)."""
    rng = np.random.default_rng(seed)
    n_max = looks[-1]
    x = rng.normal(delta, sigma, size=(reps, n_max))
    level = look_level(len(looks)) if level is None else level
    open_ = np.ones(reps, dtype=bool)
    verdict = np.full(reps, UNDECIDED, dtype=object)
    used = np.full(reps, float(n_max))
    for n in looks:
        m = x[:, :n].mean(axis=1)
        s2 = x[:, :n].var(axis=1, ddof=1) if n > 1 else np.zeros(reps)
        sd, df = pooled_sd(s2, n, prior)  # the rule's own pooling, one per simulated study
        half = float(stats.t.ppf(1.0 - level, df)) * sd / np.sqrt(n) if df > 0 else np.full(reps, np.nan)
        ok = half > EPS  # the rule's comparisons at the bounds (analysis/rule/verdict.py inside)
        passed = ok & (m - half >= lo - EPS) & (m + half <= hi + EPS)
        failed = ok & ((m + half < lo - EPS) | (m - half > hi + EPS))
        for mask, v in ((passed, PASS), (failed, FAIL)):
            hit = open_ & mask
            verdict[hit], used[hit] = v, n
            open_ &= ~hit
    return {"pass": float(np.mean(verdict == PASS)), "fail": float(np.mean(verdict == FAIL)),
            "undecided": float(np.mean(verdict == UNDECIDED)), "mean_seeds": float(used.mean())}
