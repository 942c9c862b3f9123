"""The named policy variants, registered once. An unknown name lists the known ones."""

from __future__ import annotations

import numpy as np

from ..view import PodState
from .base import Policy, PolicyConfig
from .scorers import POD_SCORERS
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


POLICY_NAMES: tuple[str, ...] = tuple(_variants(Weights()))


class UnknownPolicy(ValueError):
    pass


def check_policy_name(name: str) -> str:
    if name not in POLICY_NAMES:
        raise UnknownPolicy(f"unknown policy {name!r}; known policies: {', '.join(POLICY_NAMES)}")
    return name


def reads_price(name: str, weights: Weights) -> bool:
    """Whether the policy's choices depend on the risk price: a pod scorer with a weight whose value
    moves with the price. `testbed study` runs a policy that does not read it once for every telemetry
    setting (study/grid.py), so a price reader taken for price-blind would share another point's runs:
    each scorer is probed, not looked up by name, and one added later cannot be forgotten here."""
    return any(w and _moves_with_price(scorer) for scorer, w in _variants(weights)[check_policy_name(name)].pod_scorers)


def _moves_with_price(scorer: str) -> bool:
    """Whether the pod scorer's values change when only the risk price does (0 to 1 across the pods)."""
    fn = POD_SCORERS[scorer]
    quiet = PodState.initial(21)
    return not np.array_equal(fn(quiet), fn(quiet.replace(price=np.linspace(0.0, 1.0, 21))))


def make_policy(name: str, weights: Weights, rng: np.random.Generator) -> Policy:
    return Policy(_variants(weights)[check_policy_name(name)], rng)
