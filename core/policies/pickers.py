"""Pickers: choose one candidate index from scores (inf = not allowed).

Ties are broken by a rotating per-instance counter, never by index order, so a
quiet cluster does not pile every request onto worker 0.
"""

from __future__ import annotations

import numpy as np


class ArgMin:
    """The lowest score; among equal ones the first from a rotating start k (wrapping round)."""

    def __init__(self) -> None:
        self._turn = 0

    def pick(self, score: np.ndarray, allowed: np.ndarray, rng: np.random.Generator) -> int:
        n = score.size
        k = self._turn % n
        self._turn += 1
        j = int(score.argmin())  # the first lowest score overall
        if j >= k:  # none before k is as low: j is also the first from k on
            return j
        i = k + int(score[k:].argmin())  # the first lowest from k on
        return j if score[j] < score[i] else i


class _Uniforms:
    """Uniform draws taken from the generator in blocks: one Generator call per
    decision costs more than the rest of a decision."""

    def __init__(self) -> None:
        self._u = np.empty(0)
        self._i = 0

    def next(self, rng: np.random.Generator) -> float:
        if self._i >= self._u.size:
            self._u = rng.random(4096)
            self._i = 0
        self._i += 1
        return float(self._u[self._i - 1])


class Random(_Uniforms):
    def pick(self, score: np.ndarray, allowed: np.ndarray, rng: np.random.Generator) -> int:
        return int(allowed[int(self.next(rng) * allowed.size)])


class RoundRobin:
    def __init__(self) -> None:
        self._turn = 0

    def pick(self, score: np.ndarray, allowed: np.ndarray, rng: np.random.Generator) -> int:
        i = int(allowed[self._turn % allowed.size])
        self._turn += 1
        return i


class PowerOfTwo(_Uniforms):
    """Sample two allowed candidates uniformly, keep the lower score."""

    def pick(self, score: np.ndarray, allowed: np.ndarray, rng: np.random.Generator) -> int:
        n = allowed.size
        a = int(allowed[int(self.next(rng) * n)])
        b = int(allowed[int(self.next(rng) * n)])
        return a if score[a] <= score[b] else b


PICKERS = {"argmin": ArgMin, "random": Random, "round_robin": RoundRobin, "p2c": PowerOfTwo}
