"""Policies from the user's own code: an installed package's entry points, or a dotted path in a spec.

A policy of one's own is a function of the spec's :class:`Weights` returning a :class:`PolicyConfig`
whose pieces are either the project's registered names ("health", "price", "load", "argmin") or the
user's callables: a filter or a pod scorer takes a :class:`PodState` and gives one value per pod; a
worker scorer takes ``(loads, capacity, decode, out)`` and gives one value per worker of the role; a
picker is a class whose instances ``pick(scores, allowed, rng)``. Two ways to name one, both made by
the same code in both worlds and by ``testbed study`` (each process resolves the name again):

* an entry point in the group ``pd_testbed.policies`` of an installed distribution; its name is the
  policy's (as llm-d's scheduler plugins and Vidur's policy classes are registered by name);
* a dotted import path, ``package.module.function``, named in the spec as it is.

The name a spec uses is the name every record carries (the config's own ``name`` is replaced). A
policy is checked when it is resolved: each piece called once on a small view, so a piece of the
wrong shape is a one-line error naming it, not a traceback in the middle of a run.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
from functools import lru_cache
from typing import Any, Callable

import numpy as np

from ..topology import Topology
from ..view import Capacity, ClusterView, Loads, PodState
from .base import Policy, PolicyConfig, resolve_pieces
from .weights import Weights

ENTRY_POINT_GROUP = "pd_testbed.policies"  # this distribution's (pd-reliability-testbed) group


class PolicyPluginError(ValueError):
    """A policy of the user's that cannot be used: the message is one line naming it and why."""


def is_dotted_path(name: str) -> bool:
    """A spec's policy name that is an import path (the built-in names and entry points hold no dot)."""
    return "." in name


@lru_cache(maxsize=None)
def entry_point_policies() -> dict[str, str]:
    """The installed distributions' policies: name -> ``module:attr``, as their metadata declares
    them (read once a process; :func:`forget_plugins` reads again). Two distributions declaring one
    name are refused here, in one line naming both."""
    found: dict[str, str] = {}
    owners: dict[str, str] = {}
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = ep.dist.name if ep.dist is not None else "?"
        if ep.name in found and found[ep.name] != ep.value:
            raise PolicyPluginError(f"policy {ep.name!r} is declared by two installed packages ({owners[ep.name]}: "
                                    f"{found[ep.name]}, {dist}: {ep.value}); uninstall one")
        found[ep.name], owners[ep.name] = ep.value, dist
    return found


# (name, weights) whose pieces check_pieces passed in this process: a spec is parsed, a run made and a
# study cell routed with the same policy, and its pieces need checking once, not at each.
_checked: set[tuple[str, str]] = set()


def forget_plugins() -> None:
    """Read the entry points and import the paths again (after installing a package in this process)."""
    entry_point_policies.cache_clear()
    _factory.cache_clear()
    _checked.clear()


def _import(target: str, name: str) -> Any:
    """The object ``module:attr`` or ``module.attr`` names; a one-line error where it does not import."""
    module, _, attr = target.partition(":") if ":" in target else target.rpartition(".")
    if not module or not attr:
        raise PolicyPluginError(f"policy {name!r}: {target!r} is not an import path (package.module.function)")
    try:
        obj: Any = importlib.import_module(module)
    except Exception as e:  # ImportError, or the module's own error while importing
        raise PolicyPluginError(f"policy {name!r}: cannot import {module!r}: {type(e).__name__}: {e}") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise PolicyPluginError(f"policy {name!r}: module {module!r} has no {attr!r}") from None
    return obj


@lru_cache(maxsize=None)
def _factory(name: str) -> Callable[[Weights], PolicyConfig]:
    target = name if is_dotted_path(name) else entry_point_policies()[name]
    fn = _import(target, name)
    if isinstance(fn, PolicyConfig) or not callable(fn):
        raise PolicyPluginError(f"policy {name!r}: {target} is a {type(fn).__name__}, not a function of the spec's "
                                "Weights returning a PolicyConfig")
    return fn


def plugin_config(name: str, weights: Weights, builtin: frozenset[str] | tuple[str, ...] = ()) -> PolicyConfig:
    """The config of a policy of the user's, named ``name`` (its records' name), checked: an entry
    point's name or a dotted path; KeyError when it is neither (the registry then lists what is known)."""
    if not is_dotted_path(name) and name not in entry_point_policies():
        raise KeyError(name)
    if name in builtin:  # an entry point shadowing a built-in (policy_names looks for them)
        raise PolicyPluginError(f"policy {name!r}: an installed package declares the name of a built-in policy; "
                                "give its entry point another name")
    try:
        cfg = _factory(name)(weights)
    except PolicyPluginError:
        raise
    except Exception as e:
        raise PolicyPluginError(f"policy {name!r}: its function failed: {type(e).__name__}: {e}") from None
    if not isinstance(cfg, PolicyConfig):
        raise PolicyPluginError(f"policy {name!r}: its function returned a {type(cfg).__name__}, not a PolicyConfig")
    cfg = dataclasses.replace(cfg, name=name)
    key = (name, weights.model_dump_json())
    if key not in _checked:
        check_pieces(cfg)
        _checked.add(key)
    return cfg


def _probe_view(n_pods: int = 3, workers_per_pod: int = 2) -> ClusterView:
    """A small view with some load and some price, on which every piece is called once."""
    topo = Topology.build(n_pods, workers_per_pod)
    view = ClusterView(topo, Capacity(prefill_slots=4, prefill_token_budget=4096, decode_slots=16,
                                      decode_kv_tokens=50_000), Loads.zeros(topo), PodState.initial(n_pods))
    view.loads.prefill_outstanding[:] = np.arange(topo.prefill_ids.size) % 3
    view.loads.decode_outstanding[:] = np.arange(topo.decode_ids.size) % 2
    view.pods = view.pods.replace(price=np.linspace(0.0, 0.8, n_pods))
    return view


def _per(piece: str, name: str, got: Any, n: int, what: str) -> None:
    arr = np.asarray(got)
    if arr.shape != (n,) or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
        raise PolicyPluginError(f"policy {name!r}: {piece} gave {type(got).__name__} of shape {arr.shape}, "
                                f"not one number per {what} ({n} on a {n}-{what} view)")


def check_pieces(cfg: PolicyConfig) -> None:
    """Call each of the config's pieces once on a small view and then choose once; the first piece
    that fails or gives the wrong shape is the one-line error."""
    view = _probe_view()
    topo, n_pods = view.topo, view.topo.n_pods
    try:
        filters, pod_scorers, worker, picker = resolve_pieces(cfg)
    except KeyError as e:
        raise PolicyPluginError(f"policy {cfg.name!r}: no registered piece named {e.args[0]!r}") from None
    steps: list[tuple[str, Callable[[], Any], int, str]] = []
    for f in filters:
        steps.append((f"filter {_label(f)}", lambda f=f: f(view.pods), n_pods, "pod"))
    for s, _ in pod_scorers:
        steps.append((f"pod scorer {_label(s)}", lambda s=s: s(view.pods), n_pods, "pod"))
    if worker is not None:
        for decode, n in ((False, topo.prefill_ids.size), (True, topo.decode_ids.size)):
            steps.append((f"worker scorer {_label(worker)}",
                          lambda d=decode, n=n: worker(view.loads, view.capacity, d, np.empty(n)), n, "worker"))
    for piece, call, n, what in steps:
        try:
            got = call()
        except Exception as e:
            raise PolicyPluginError(f"policy {cfg.name!r}: {piece} failed on a {n_pods}-pod view: "
                                    f"{type(e).__name__}: {e}") from None
        _per(piece, cfg.name, got, n, what)
    try:
        obj = picker()
        if not callable(getattr(obj, "pick", None)):
            raise TypeError(f"{type(obj).__name__} has no pick(scores, allowed, rng)")
        choice = Policy(cfg, np.random.default_rng(0)).choose(view)
    except Exception as e:
        raise PolicyPluginError(f"policy {cfg.name!r}: a choice on a {n_pods}-pod view failed (picker "
                                f"{_label(picker)}): {type(e).__name__}: {e}") from None
    if not (0 <= choice.prefill < topo.prefill_ids.size and 0 <= choice.decode < topo.decode_ids.size):
        raise PolicyPluginError(f"policy {cfg.name!r}: picker {_label(picker)} chose an index outside the "
                                "candidates")


def _label(piece: Any) -> str:
    """A piece as its author finds it: module.qualname."""
    if isinstance(piece, str):
        return piece
    name = getattr(piece, "__qualname__", type(piece).__name__)
    module = getattr(piece, "__module__", None)
    return f"{module}.{name}" if module else name
