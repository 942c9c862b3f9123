"""The named policy variants, registered once, and the user's own (core/policies/plugins.py: an
installed package's entry points, or a dotted path). An unknown name lists the known ones."""

from __future__ import annotations

import numpy as np

from ..view import PodState
from .base import Policy, PolicyConfig, resolve_pieces
from .plugins import entry_point_policies, plugin_config
from .weights import Weights


def _variants(w: Weights) -> dict[str, PolicyConfig]:
    price = (("price", w.lambda_r),)
    return {
        "LC": PolicyConfig("LC"),
        "FaultAwareLC": PolicyConfig("FaultAwareLC", filters=("health",)),
        "OTF-R": PolicyConfig("OTF-R", pod_scorers=price, path_weight=w.lambda_p),
        "FaultAwareOTF-R": PolicyConfig(
            "FaultAwareOTF-R", filters=("health",), pod_scorers=price + (("health", w.lambda_f),), path_weight=w.lambda_p
        ),
        "OracleAvoidance": PolicyConfig("OracleAvoidance", filters=("oracle",)),
        "Random": PolicyConfig("Random", worker_scorer=None, picker="random"),
        "RoundRobin": PolicyConfig("RoundRobin", worker_scorer=None, picker="round_robin"),
        "PowerOfTwo": PolicyConfig("PowerOfTwo", picker="p2c"),
        "BanaServe": PolicyConfig("BanaServe", worker_scorer="banaserve"),
    }


POLICY_NAMES: tuple[str, ...] = tuple(_variants(Weights()))  # the built-in ones, in the README's order


class UnknownPolicy(ValueError):
    pass


def policy_names() -> tuple[str, ...]:
    """Every policy a spec can name by a plain name: the built-in ones, then the installed packages'
    (entry points in the group ``pd_testbed.policies``; one named as a built-in is refused). A dotted
    path names one too."""
    plugins = entry_point_policies()
    for name in plugins:
        if name in POLICY_NAMES:
            plugin_config(name, Weights(), POLICY_NAMES)  # the one-line refusal
    return POLICY_NAMES + tuple(sorted(plugins))


def _config(name: str, weights: Weights) -> PolicyConfig:
    # A built-in name never reads the installed packages' metadata (a quarter of a second a process).
    if name in POLICY_NAMES:
        return _variants(weights)[name]
    try:
        return plugin_config(name, weights, POLICY_NAMES)
    except KeyError:
        raise UnknownPolicy(f"unknown policy {name!r}; known policies: {', '.join(policy_names())} "
                            "(or a dotted path to a function of your own: package.module.function)") from None


def check_policy_name(name: str) -> str:
    """``name``, once it names a usable policy (a user's one is imported and its pieces checked)."""
    _config(name, Weights())
    return name


def reads_price(name: str, weights: Weights) -> bool:
    """Whether the policy's choices depend on the risk price: a pod scorer with a weight whose value
    moves with the price. `testbed study` runs a policy that does not read it once for every telemetry
    setting (study/grid.py), so a price reader taken for price-blind would share another point's runs:
    each scorer is probed, not looked up by name, and one added later cannot be forgotten here."""
    _, pod_scorers, _, _ = resolve_pieces(_config(name, weights))
    return any(w and _moves_with_price(fn) for fn, w in pod_scorers)


def _moves_with_price(fn) -> bool:
    """Whether the pod scorer's values change when only the risk price does (0 to 1 across the pods)."""
    quiet = PodState.initial(21)
    return not np.array_equal(fn(quiet), fn(quiet.replace(price=np.linspace(0.0, 1.0, 21))))


def make_policy(name: str, weights: Weights, rng: np.random.Generator) -> Policy:
    return Policy(_config(name, weights), rng)
