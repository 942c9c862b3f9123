"""The stages of a request, defined once for both worlds, and the one blame rule.

A request passes through these stages in order; each starts at one timestamp
column of ``requests.parquet`` and ends where the next starts:

| stage           | from (column)      | what the request waits for or does                          | blamed pod(s)   |
| --------------- | ------------------ | ----------------------------------------------------------- | --------------- |
| `prefill_queue` | `routed_s`         | its prefill worker to start it (queued behind other prompts) | prefill         |
| `prefill`       | `prefill_start_s`  | the prompt's forward pass                                   | prefill         |
| `decode_queue`  | `prefill_end_s`    | decode admission: KV memory and a batch slot on its decoder | decode          |
| `kv_transfer`   | `kv_start_s`       | the decode worker pulling the prompt's KV across the links  | prefill, decode |
| `decode`        | `kv_end_s`         | token generation (first token at `first_token_s`)           | decode          |

A request that fails records the stage it was in as ``failed_stage``.

The blame rule (what the risk price charges a failure to): a stage is charged to
the pod(s) whose resources it waits on or runs on. Queueing for prefill and
prefill itself depend on the prefill worker; decode admission depends on the
decode worker's KV memory and batch slots, never on the prefill pod that already
finished; a KV transfer depends on both ends' links (either pod's core link may
be the degraded one); decode depends on the decode worker.
"""

from __future__ import annotations

from vocab import DECODE, DECODE_QUEUE, KV_TRANSFER, PREFILL, PREFILL_QUEUE, STAGES

# The stages themselves, and their order, are the project's words (vocab/__init__.py); here, their rule.

# Where a request the router's admission limit refused ends (outcome "rejected", never routed):
# not a stage a routed request passes through, and charged to no pod.
ADMISSION = "admission"
# Where a request with outcome "corrupt" failed: it decoded to its end, so the stage it was in says
# nothing; its KV went wrong in transfer (a pull that read blocks its prefill engine had freed).
CORRUPTED_IN = KV_TRANSFER
# What a failure's composition counts (analysis): admission, then the stages.
FAILURE_STAGES: tuple[str, ...] = (ADMISSION, *STAGES)

# The record column at which each stage starts (the previous stage ends there).
STAGE_START: dict[str, str] = {
    PREFILL_QUEUE: "routed_s",
    PREFILL: "prefill_start_s",
    DECODE_QUEUE: "prefill_end_s",
    KV_TRANSFER: "kv_start_s",
    DECODE: "kv_end_s",
}

# Which end of the request each stage depends on: the blame rule above.
BLAMED_ENDS: dict[str, tuple[str, ...]] = {  # the ends: the prefill and the decode worker
    PREFILL_QUEUE: ("prefill",),
    PREFILL: ("prefill",),
    DECODE_QUEUE: ("decode",),
    KV_TRANSFER: ("prefill", "decode"),
    DECODE: ("decode",),
}

# Stages after which the prefill worker holds nothing of the request any more.
AFTER_PREFILL = frozenset({DECODE_QUEUE, KV_TRANSFER, DECODE})


def blamed_pods(stage: str | None, prefill_pod: int, decode_pod: int) -> tuple[int, ...]:
    """The pods a failure in ``stage`` is charged to (an unknown stage: every pod touched)."""
    ends = BLAMED_ENDS.get(stage or "", ("prefill", "decode"))
    pods = {"prefill": prefill_pod, "decode": decode_pod}
    return tuple(sorted({pods[e] for e in ends} - {-1}))

