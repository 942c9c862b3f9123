"""Filters: which pods a policy may use. Each returns a per-pod keep mask."""

from __future__ import annotations

import numpy as np

from ..view import PodState


def health_mask(pods: PodState) -> np.ndarray:
    """Keep pods whose health label says healthy."""
    return ~pods.unhealthy


def oracle(pods: PodState) -> np.ndarray:
    """Keep pods that are truly not degraded (ground truth: the upper bound)."""
    return ~pods.degraded


FILTERS = {"health": health_mask, "oracle": oracle}
