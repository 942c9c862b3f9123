"""The router's two limits on a request, defined once for both worlds and the analysis.

A request without its first token ``first_token_limit_s`` after its arrival, or unfinished
``deadline_s`` after it, is given up where it is (a timeout of the stage it was in). The
first-token limit is the spec's ``ttft_timeout_s``, never later than the deadline. The simulator
(simulator/cluster.py), the testbed's router (testbed/router/flow.py), the spec (core/spec/model.py) and
the analysis (analysis/run/host_stall.py, analysis/run/metrics.py) call these functions instead of retyping the
rule, so the worlds cannot drift apart on it.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def first_token_limit(deadline_s: float, ttft_timeout_s: float | None) -> float:
    """How long after its arrival a request may go without a first token: ``ttft_timeout_s``
    (None: no limit of its own), never later than the deadline."""
    return deadline_s if ttft_timeout_s is None else min(float(ttft_timeout_s), deadline_s)


def spec_first_token_limit(spec: dict[str, Any]) -> float:
    """:func:`first_token_limit` of a spec as run.json holds it (a dict; NaN without a deadline)."""
    return first_token_limit(float(spec.get("deadline_s", np.nan)), spec.get("ttft_timeout_s"))


def give_up_s(arrival_s: Any, has_first_token: Any, first_token_limit_s: float, deadline_s: float) -> np.ndarray:
    """When the router gives each request up at the latest: ``arrival_s`` + the first-token limit
    without a first token, else + the deadline (element-wise over arrays)."""
    return np.asarray(arrival_s, dtype=float) + np.where(has_first_token, deadline_s, first_token_limit_s)
