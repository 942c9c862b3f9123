"""Scorers: comparable per-candidate values, summed with the spec's weights.

Worker-level scorers write into ``out`` (a buffer the policy owns) to spare an
allocation per decision.

Pod-level scorers change only with the slow loop or the labels, so the policy
caches them; worker-level scorers read the live load counters every decision.
"""

from __future__ import annotations

import numpy as np

from ..view import Capacity, Loads, PodState


# --- pod-level ----------------------------------------------------------
def price(pods: PodState) -> np.ndarray:
    return pods.price


def health_penalty(pods: PodState) -> np.ndarray:
    return pods.unhealthy.astype(float)


POD_SCORERS = {"price": price, "health": health_penalty}


# --- worker-level: (prefill term, decode term) ----------------------------
def outstanding(loads: Loads, cap: Capacity, decode: bool, out: np.ndarray) -> np.ndarray:
    """Least-load: requests in flight at the worker over its slots."""
    if decode:
        return np.multiply(loads.decode_outstanding, 1.0 / cap.decode_slots, out=out)
    return np.multiply(loads.prefill_outstanding, 1.0 / cap.prefill_slots, out=out)


def banaserve(loads: Loads, cap: Capacity, decode: bool, out: np.ndarray) -> np.ndarray:
    """BanaServe's load-aware order: utilisation first (compute, and memory for decode),
    in buckets of 10%, then queue length: floor(10 * util) + q / (1 + q)."""
    if decode:
        util = np.maximum(np.minimum(loads.decode_outstanding / cap.decode_slots, 1.0),
                          loads.decode_kv_tokens / cap.decode_kv_tokens)
        q = loads.decode_outstanding
    else:
        util = loads.prefill_tokens / cap.prefill_token_budget
        q = loads.prefill_outstanding
    np.floor(10.0 * np.minimum(util, 1.0), out=out)
    out += q / (1.0 + q)
    return out


WORKER_SCORERS = {"load": outstanding, "banaserve": banaserve}


# --- worker-level, both roles in one pass ---------------------------------
def outstanding_both(loads: Loads, scale: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``outstanding`` of every worker at once: loads.outstanding (prefill workers, then decode
    workers) times ``scale`` (each one's 1 / slots), the very numbers of the two calls."""
    return np.multiply(loads.outstanding, scale, out=out)


# Worker scorers that can score both roles in one pass, when the loads allow it (Loads.outstanding).
BOTH_ROLES_SCORERS = {"load": outstanding_both}
