"""The project's words, each defined once, on the ground floor: every package imports them and
they import nothing of the project (tests/test_architecture.py), so the pure fault model, the
workloads, the core, both worlds and the command line spell them alike.

A closed set of names is a ``Literal`` (what a spec field or a command's choices accept, built from
it) with its values as a tuple, and plain-str constants for the code that compares them; the
outcomes and the stages are also ``StrEnum`` s, whose members equal their strings. Hot paths (a
simulator event, a routing decision) use the plain strings: an enum member's Python-level hash
and comparison cost twice a str's.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal, get_args

__all__ = [
    "CLUSTER_MODES", "CORRUPT", "ClusterMode", "DECODE", "DECODE_QUEUE", "DEMAND_STATES", "DemandState", "EMULATED_MODES",
    "ENGINE_ROLES", "EmulatedMode", "ERROR", "EXECUTORS", "Executor", "FAULT_COMPUTE", "FAULT_ENGINE", "FAULT_KINDS",
    "FAULT_LINK", "FaultKind", "KV_TRANSFER", "LAUNCHERS", "LAUNCH_DIRECT", "LAUNCH_RAY_UP", "Launcher",
    "MEASURED_DEMANDS", "MODE_AUTO", "MODE_CLUSTER", "MODE_LOCAL", "MODE_NETNS", "MeasuredDemand", "OK", "OUTCOMES",
    "Outcome", "PREFILL", "PREFILL_QUEUE", "PULL_CANCELLED", "PULL_DONE", "PULL_ENDINGS", "PULL_FAILED", "PULL_UNSEEN",
    "PullEnding", "REJECTED", "ROLES", "ROLE_BOTH", "ROLE_DECODE", "ROLE_PREFILL", "Role", "SIM", "STAGES", "Stage",
    "TESTBED", "TIMEOUT", "WORLDS", "World",
]


# "corrupt": decoded to the end, but from KV that was not its prompt's (a canary's tokens against its
# single-engine reference on the testbed, core/canary.py; in the simulator a pull that outlived a
# KV lease nobody renewed, engine.kv_lease_s and kv_lease_renewed). Its failed_stage is kv_transfer:
# the only way a decode engine reads KV it did not compute.
class Outcome(StrEnum):
    """How a request (or one attempt of it) ended."""

    OK = "ok"
    TIMEOUT = "timeout"
    ERROR = "error"
    REJECTED = "rejected"
    CORRUPT = "corrupt"


OUTCOMES: tuple[str, ...] = tuple(o.value for o in Outcome)
OK, TIMEOUT, ERROR, REJECTED, CORRUPT = OUTCOMES


class Stage(StrEnum):
    """The stages, in the order a request passes through them (core/stages.py: where each starts,
    and the pods it blames)."""

    PREFILL_QUEUE = "prefill_queue"
    PREFILL = "prefill"
    DECODE_QUEUE = "decode_queue"
    KV_TRANSFER = "kv_transfer"
    DECODE = "decode"


STAGES: tuple[str, ...] = tuple(s.value for s in Stage)
PREFILL_QUEUE, PREFILL, DECODE_QUEUE, KV_TRANSFER, DECODE = STAGES

# An engine's role in a disaggregated cluster; "both" where something concerns either (an engine
# fault's ``role``, a colocated engine that prefills and decodes).
Role = Literal["prefill", "decode", "both"]
ROLES: tuple[str, ...] = get_args(Role)
ROLE_PREFILL, ROLE_DECODE, ROLE_BOTH = ROLES
ENGINE_ROLES: tuple[str, ...] = (ROLE_PREFILL, ROLE_DECODE)  # the two a disaggregated engine has

# What became of a KV pull the router gave up (core/records.py DeadPullRecord): "done" all of its KV
# arrived; "failed" the transfer failed (UCX gave it up); "cancelled" stopped at the abort;
# "unseen" still going DEAD_PULL_WATCH_S after it was given up.
PullEnding = Literal["done", "failed", "cancelled", "unseen"]
PULL_ENDINGS: tuple[str, ...] = get_args(PullEnding)
PULL_DONE, PULL_FAILED, PULL_CANCELLED, PULL_UNSEEN = PULL_ENDINGS

# Where a vLLM engine runs its model (core/spec/model.py TestbedSpec.executor): "uni" in the engine core's
# process, "mp" in a worker process of its own.
Executor = Literal["uni", "mp"]
EXECUTORS: tuple[str, ...] = get_args(Executor)

# How the testbed's nodes exist: "netns" one network namespace each on this machine (root),
# "local" one Ray node without namespaces, "cluster" a running Ray cluster's nodes. An emulated
# cluster (testbed.mode of a spec) is one of the first two, or "auto": netns where the privileges
# allow it, else local.
ClusterMode = Literal["netns", "local", "cluster"]
CLUSTER_MODES: tuple[str, ...] = get_args(ClusterMode)
MODE_NETNS, MODE_LOCAL, MODE_CLUSTER = CLUSTER_MODES
EmulatedMode = Literal["auto", "netns", "local"]
EMULATED_MODES: tuple[str, ...] = get_args(EmulatedMode)
MODE_AUTO = EMULATED_MODES[0]

# How an emulated cluster's Ray nodes start: "ray_up" through Ray's launcher and ssh, as a real
# cluster's; "direct" by `ray start` from this process.
Launcher = Literal["ray_up", "direct"]
LAUNCHERS: tuple[str, ...] = get_args(Launcher)
LAUNCH_RAY_UP, LAUNCH_DIRECT = LAUNCHERS

# The kinds of fault a spec injects (faults/spec.py: each model's ``kind``, the discriminator of
# FaultSpec): a link's bandwidth cut (to 0: the link down), an engine's compute slowed, an engine killed.
FaultKind = Literal["link", "compute", "engine"]
FAULT_KINDS: tuple[str, ...] = get_args(FaultKind)
FAULT_LINK, FAULT_COMPUTE, FAULT_ENGINE = FAULT_KINDS

# What an engine's work demands of its host's cores (core/host_model.py, the host calibration):
# computing, holding KV for a reader, pulling KV, decoding, and the machine's other load.
DemandState = Literal["compute", "hold", "pull", "decode", "background"]
DEMAND_STATES: tuple[str, ...] = get_args(DemandState)
# The states whose demand the host calibration measures in cores ("compute" is the reference the
# others are rated against: one engine's prefill).
MeasuredDemand = Literal["hold", "pull", "decode", "background"]
MEASURED_DEMANDS: tuple[str, ...] = get_args(MeasuredDemand)
assert set(MEASURED_DEMANDS) < set(DEMAND_STATES)

# The two worlds a spec runs in.
World = Literal["sim", "testbed"]
WORLDS: tuple[str, ...] = get_args(World)
SIM, TESTBED = WORLDS
