"""Routing policies: pure objects that pick a (prefill, decode) worker pair from a ClusterView."""

from .base import Choice, Policy, PolicyConfig
from .registry import POLICY_NAMES, UnknownPolicy, check_policy_name, make_policy, reads_price
from .weights import Weights

__all__ = ["Choice", "Policy", "PolicyConfig", "POLICY_NAMES", "UnknownPolicy",
           "check_policy_name", "make_policy", "reads_price", "Weights"]
