"""Experiment specs for the tests, built in one place.

Three bases, each a plain dict a test can still edit before parsing it:

* :func:`small_spec_dict`: fixed request sizes on a couple of workers, small enough to work a
  run out by hand (with :data:`HAND_ENGINE`, the engine's times are round numbers too);
* :func:`faulted_spec_dict`: a 4 x 4 fat tree under long-context Poisson load with one pod's
  link throttled, a run that takes every hot path of both worlds' shared code;
* :func:`shipped_spec_dict`: a shipped scenario (``core/defaults``, ``experiments/``) as the spec
  loader resolves it.

Overrides merge one level deep (:func:`merge`): a dict given for a block the base holds as a dict
updates that block (``workload={"max_requests": 30}`` keeps the arrival); anything else, a list
or a scalar or a block the base lacks, replaces. A test that needs a block replaced whole, or
removed, edits the returned dict.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from core.spec.model import ExperimentSpec, load_spec, parse_spec

# Engine times that make hand-worked answers round: 1000 prompt tokens a second, 10 ms a decode step.
HAND_ENGINE: dict[str, float] = {"prefill_tokens_per_s": 1000.0, "prefill_overhead_s": 0.0,
                                 "decode_step_base_s": 0.01, "decode_step_per_seq_s": 0.0,
                                 "decode_step_per_kv_token_s": 0.0}


def merge(base: dict[str, Any], **over: Any) -> dict[str, Any]:
    """A deep copy of ``base`` with ``over`` merged one level deep (see the module's docstring)."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        value = copy.deepcopy(value)
        out[key] = {**out[key], **value} if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def poisson(rate_rps: float) -> dict[str, Any]:
    """A Poisson arrival block."""
    return {"kind": "poisson", "rate_rps": rate_rps}


def fixed(value: int) -> dict[str, Any]:
    """A length distribution of one value (prompt or output tokens)."""
    return {"kind": "fixed", "value": value}


def link_fault(pods: list[int], residual_bw: float, start_s: float, duration_s: float, **more: Any) -> dict[str, Any]:
    """A link fault on ``pods``: their links keep ``residual_bw`` of their rate for the window."""
    return {"kind": "link", "pods": pods, "residual_bw": residual_bw, "start_s": start_s, "duration_s": duration_s,
            **more}


def small_spec_dict(**over: Any) -> dict[str, Any]:
    """One request of 256 prompt and 10 output tokens on 2 pods x 2 workers at 8 Gbit/s, LC, a
    100 s deadline; engine and faults the spec's defaults unless given."""
    return merge({
        "name": "t",
        "topology": {"pods": 2, "workers_per_pod": 2, "nic_gbps": 8.0},
        "workload": {"arrival": poisson(1.0), "prompt": fixed(256), "output": fixed(10), "max_requests": 1},
        "deadline_s": 100.0,
        "policies": ["LC"],
    }, **over)


def faulted_spec_dict(**over: Any) -> dict[str, Any]:
    """Pod 1's link at r = 0.01 from 10 s to 40 s of a 60 s long-context run at 6 requests/s on
    4 pods x 4 workers: KV flows on a throttled link, requests fail at their deadline (20 s),
    health labels change (pass ``health`` for a label model: none is set), the price moves.
    Seed 0, FaultAwareOTF-R."""
    return merge({
        "name": "faulted",
        "seeds": [0],
        "topology": {"pods": 4, "workers_per_pod": 4, "uplink_gbps": 400.0},
        "workload": {"arrival": poisson(6.0), "profile": "long_context", "duration_s": 60},
        "faults": [link_fault([1], 0.01, 10.0, 30.0)],
        "deadline_s": 20.0,
        "policies": ["FaultAwareOTF-R"],
    }, **over)


def shipped_spec_dict(default: str = "default.yaml", *, path: str | Path | None = None,
                      exclude: set[str] | None = None, **over: Any) -> dict[str, Any]:
    """The embedded scenario ``default`` (or the spec file at ``path``, such as one of
    ``experiments/``) as resolved: every field, defaults filled in, less the fields in
    ``exclude``; with ``over`` merged."""
    return merge(load_spec(path, default=default).model_dump(mode="json", exclude=exclude), **over)


def parse(data: dict[str, Any], source: str = "<spec>", **over: Any) -> ExperimentSpec:
    """``data`` with ``over`` merged, validated as a spec file would be."""
    return parse_spec(merge(data, **over) if over else data, source)
