"""Engines kept up between commands on one Ray cluster (`--keep-engines`).

Starting a set of engines is the slowest step of a command (minutes for a real model on a GPU
node: loading weights, profiling memory, allocating the KV cache; 1-2 minutes for the tiny model
on 2 cores: docs/performance.md "Measured figures"). As a serving cluster keeps its engines between
deployments, a command given `--keep-engines` leaves its engines up as detached Ray actors, named
by what makes them (every engine's configuration, its pod and its interface), and the next
`--keep-engines` command on the same cluster whose spec makes the same engines finds and reuses
them; one whose spec makes others stops them and starts its own. Between runs the driver checks
engines the same way whether they are new or reused (every pair's KV path, quiet engines with
their prefix caches reset): a reused engine starts a run as clean as a new one.

`testbed cluster stop-engines --address ADDR` stops them; so does bringing the cluster down.
A command without the flag refuses to start while kept engines hold the pods. How to use it:
docs/cluster.md "Engines kept between commands".
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import ray

log = logging.getLogger(__name__)

KEPT_NAMESPACE = "testbed-kept-engines"  # the Ray namespace of every kept engine of a cluster


@dataclass(frozen=True)
class KeptEngine:
    key: str  # engine_key of the set it belongs to
    generation: int  # restarts of that set (Engines.restart)
    name: str  # the engine's name (pod0-prefill, ...)

    @property
    def actor_name(self) -> str:
        return actor_name(self.key, self.generation, self.name)


def actor_name(key: str, generation: int, name: str) -> str:
    return f"{key}.{generation}.{name}"


def engine_key(made: list[dict[str, Any]]) -> str:
    """What makes a set of engines, as a short stable key: each engine's configuration (without the
    folder it logs to, which is the first command's), placement and interface."""
    text = json.dumps(made, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def list_kept() -> list[KeptEngine]:
    """Every kept engine alive on the connected cluster."""
    from ray.util import list_named_actors

    out = []
    for a in list_named_actors(all_namespaces=True):
        if a.get("namespace") != KEPT_NAMESPACE:
            continue
        key, gen, name = a["name"].split(".", 2)
        out.append(KeptEngine(key, int(gen), name))
    return out


def find_kept(key: str, names: list[str]) -> tuple[int, list[Any]] | None:
    """The kept set made by ``key``, one handle per name in that order, and its generation; None
    if no whole set of it is up."""
    mine = [k for k in list_kept() if k.key == key]
    if not mine:
        return None
    gen = max(k.generation for k in mine)
    if not set(names) <= {k.name for k in mine if k.generation == gen}:
        return None
    try:
        return gen, [ray.get_actor(actor_name(key, gen, n), namespace=KEPT_NAMESPACE) for n in names]
    except ValueError:  # one went away meanwhile
        return None


def stop_kept(timeout_s: float = 60.0) -> list[str]:
    """Stop every kept engine of the connected cluster (vLLM shut down, then the actor killed).
    Returns the actor names stopped."""
    stopped, handles = [], []
    for k in list_kept():
        try:
            handles.append((k.actor_name, ray.get_actor(k.actor_name, namespace=KEPT_NAMESPACE)))
        except ValueError:
            continue
    refs = [h.shutdown.remote() for _, h in handles]
    try:
        ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    finally:
        for name, h in handles:
            ray.kill(h)
            stopped.append(name)
    # A killed actor's name is released once Ray has it dead: new engines may be given the same names.
    until = time.monotonic() + timeout_s
    while stopped and {k.actor_name for k in list_kept()} & set(stopped) and time.monotonic() < until:
        time.sleep(0.2)
    return stopped
