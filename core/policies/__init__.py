"""Routing policies: pure objects that pick a (prefill, decode) worker pair from a ClusterView."""

from .base import Choice, Policy, PolicyConfig
from .plugins import ENTRY_POINT_GROUP, PolicyPluginError, forget_plugins
from .registry import POLICY_NAMES, UnknownPolicy, check_policy_name, make_policy, policy_names, reads_price
from .weights import Weights

__all__ = ["Choice", "ENTRY_POINT_GROUP", "Policy", "PolicyConfig", "PolicyPluginError", "POLICY_NAMES",
           "UnknownPolicy", "check_policy_name", "forget_plugins", "make_policy", "policy_names", "reads_price",
           "Weights"]
