"""`testbed calibrate`: measure the running testbed's engines and links for the simulator.

Runs in the driver (connected to Ray, in the head's namespace) on the engines the
runs use, after they are started and every engine pair has made its first NIXL
handshake (:func:`warm_pairs`). What is measured, and how it is read, is what the
router records in a run (``testbed/router/flow.py``), so the simulator is fitted
to the quantities the two worlds are later compared on:

* **prefill**: a prompt sent to a prefill engine; from the scheduler's allocation
  (the stage log's ``alloc``) to the call's return, as ``prefill_start_s`` ->
  ``prefill_end_s``; prompts of several lengths alone, and batches of equal prompts
  sent at once (batch time: first allocation to last return);
* **KV pulls**: the same prompts pulled by a decode engine on another pod
  (``max_tokens=1``), from decode admission (``alloc_remote``) to the pull's end
  (``recv_done``), as ``kv_start_s`` -> ``kv_end_s``; unshaped, and with the prefill
  pod's uplink shaped by its fault agent (the very ``htb`` a link fault uses, KV
  traffic only) at the spec's link baseline and at fractions of it down to the
  shipped fault's r. Shaped pulls are fitted on NIXL's own transfer time (the
  decode engine's ``vllm:nixl_xfer_time_seconds``, read after each pull): the wire,
  without the host stalls of seconds that a 2-core machine puts before a pull now
  and then (docs/verified.md "Host stalls on two cores"; they made the stage-time fit useless
  on one CI run, R^2 0.63). What the stage adds to the wire is kept as noise (``pull_start_*``). The
  first pull after each rate change is measured apart (``rate_change_*``): TCP
  meets a queue seconds deep where it had milliseconds, and that pull took up to
  2.7x bytes / rate here, the ones after it 1.05x;
* **decode steps**: ``b`` equal requests decoded together on a decode engine; the
  gaps between successive token arrivals while all ``b`` run are the step time at
  batch ``b`` with their KV tokens; gaps far above the typical step are host stalls
  (:func:`core.calibration.stall_stats`);
* **NIXL's first handshake**: each pair's first pull minus its second of the same size.

The fits and the file are :mod:`core.calibration`'s.
"""

from __future__ import annotations

import itertools
import platform
import time
from datetime import datetime, timezone
from typing import Any, Sequence

import numpy as np
import ray
from rich.console import Console

from core.calibration import (Calibration, calibration_from_fits, fit_decode, fit_prefill, fit_pull,
                              fit_unshaped_pull, pull_noise, stall_stats)
from core.spec import ExperimentSpec
from core.topology import Topology, kv_transfer_bytes

from testbed.router.flow import CPU_BLOCK_TOKENS, prompt_ids

console = Console(stderr=True)
BLOCK = CPU_BLOCK_TOKENS  # prompts of a block or less move no KV (docs/verified.md "KV cache blocks of 128 tokens")
SALT = 424242  # calibration prompts never share a prefix with a run's
# Prompt lengths for prefill and unshaped pulls: one block and a bit to most of the tiny model's context.
PREFILL_LENGTHS = (160, 384, 768, 1536, 2560)
PREFILL_BATCHES = ((2, 384), (4, 384), (2, 1024))  # (requests, tokens each), sent together
REPEATS = 3
# Shaped pulls: rate as a fraction of the link baseline, and whole blocks per prompt (plus half
# a block): sizes chosen so a pull takes seconds, not tens, at that rate (a block of the tiny
# model is 1 MiB: 3.4 s at r = 0.01 of 250 Mbit/s).
SHAPED = ((1.0, (4, 16)), (0.1, (1, 4)), (0.02, (1, 2)), (0.01, (1,)))
SHAPE_TTL_S = 120.0
DECODE_BATCHES = (1, 2, 4, 8, 16)
DECODE_PROMPTS = (256, 1024)
DECODE_TOKENS = 32


class _Ids:
    """Unique prompts: a per-calibration counter, so no prompt hits another's prefix cache."""

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab
        self.n = itertools.count(10**8)

    def __call__(self, tokens: int) -> tuple[str, list[int]]:
        i = next(self.n)
        return f"cal-{i}", prompt_ids(i, tokens, self.vocab, salt=SALT)


XFER = "vllm:nixl_xfer_time_seconds"


def _xfer(decode: Any) -> tuple[float, float]:
    """The decode engine's cumulative NIXL transfer seconds and transfer count."""
    m = ray.get(decode.metrics.remote())
    return float(m[XFER + "_sum"]), float(m[XFER + "_count"])


def _pd_wire(prefill: Any, decode: Any, rid: str, ids: list[int]) -> tuple[float | None, float | None]:
    """One pull as :func:`_pd`, plus NIXL's own time for it: (stage seconds, NIXL seconds). The
    stats reach the engine's logger with the step after the read completes, so wait for them."""
    s0, c0 = _xfer(decode)
    _, pull, _ = _pd(prefill, decode, rid, ids)
    end = time.monotonic() + 5.0
    while True:
        s1, c1 = _xfer(decode)
        if c1 > c0 or time.monotonic() > end:
            break
        time.sleep(0.05)
    return pull, (s1 - s0 if c1 > c0 else None)


def _pd(prefill: Any, decode: Any, rid: str, ids: list[int]) -> tuple[float, float | None, float]:
    """One prompt through prefill then a 1-token decode; (prefill seconds as the router records
    them, pull seconds, the whole decode call's seconds in its engine)."""
    sent = time.monotonic()
    pre = ray.get(prefill.prefill.remote(rid, ids))
    back = time.monotonic()
    prefill_s = back - sent - pre.stages.get("alloc", 0.0)
    dec = ray.get(decode.decode.remote(rid, ids, 1, pre.kv_transfer_params))
    st = dict(dec.stages)
    pull = st["recv_done"] - st["alloc_remote"] if "recv_done" in st and "alloc_remote" in st else None
    return prefill_s, pull, dec.finished_s - dec.submitted_s


def warm_pairs(prefill: Sequence[Any], decode: Sequence[Any], vocab: int, tokens: int = 2 * BLOCK + 1) -> list[float]:
    """Make every (prefill, decode) pair's first NIXL transfer now, not in a run; returns the
    handshake cost per pair: the first decode call minus a second one of the same size (the
    handshake precedes decode admission, so it is not in the pull's own time)."""
    ids = _Ids(vocab)
    out = []
    for p, d in itertools.product(prefill, decode):
        first = _pd(p, d, *ids(tokens))[2]
        second = _pd(p, d, *ids(tokens))[2]
        out.append(max(first - second, 0.0))
    return out


def _prefill_batch(engine: Any, decode: Any, ids: _Ids, k: int, tokens: int) -> float:
    """k equal prompts at once: first allocation to last return (then pulled, freeing their KV)."""
    reqs = [ids(tokens) for _ in range(k)]
    sent = time.monotonic()
    refs = [engine.prefill.remote(rid, p) for rid, p in reqs]
    back: dict[Any, float] = {}
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        back[done[0]] = time.monotonic()
    res = ray.get(refs)
    start = min(sent + r.stages.get("alloc", 0.0) for r in res)
    ray.get([decode.decode.remote(rid, p, 1, r.kv_transfer_params) for (rid, p), r in zip(reqs, res)])
    return max(back.values()) - start


def _decode_steps(engine: Any, ids: _Ids, batch: int, tokens: int) -> tuple[list[float], float]:
    """Token-arrival gaps while all ``batch`` requests run together, and the median gap."""
    reqs = [ids(tokens) for _ in range(batch)]
    res = ray.get([engine.decode.remote(rid, p, DECODE_TOKENS) for rid, p in reqs])
    times = [np.asarray(r.token_times) for r in res if len(r.token_times) > 1]
    if len(times) < batch:
        return [], float("nan")
    lo = max(t[0] for t in times)  # every request is decoding from here ...
    hi = min(t[-1] for t in times)  # ... until the first one ends
    gaps = [float(g) for t in times for a, g in zip(t[1:], np.diff(t)) if lo < a <= hi]
    return gaps, float(np.median(gaps)) if gaps else float("nan")


def calibrate(spec: ExperimentSpec, topo: Topology, prefill: Sequence[Any], decode: Sequence[Any],
              pod_agents: Sequence[Any], model_meta: dict[str, Any], handshake_s: Sequence[float]) -> Calibration:
    """Measure and fit (module docstring): the first prefill engine, and the first decode engine
    on another pod, so pulls cross the prefill pod's link; ``pod_agents[p]`` is pod p's fault
    agent (it shapes that link)."""
    p_pod = int(topo.worker_pod[topo.prefill_ids[0]])
    others = np.flatnonzero(topo.worker_pod[topo.decode_ids] != p_pod)
    if others.size == 0:
        raise ValueError("calibrate: needs a decode engine on another pod than the first prefill engine "
                         "(a pull inside a pod crosses no link to shape)")
    kvpt = int(model_meta["kv_bytes_per_token"])
    P, D = prefill[0], decode[int(others[0])]
    ids = _Ids(int(model_meta["vocab"]))
    t0 = time.monotonic()

    prefill_samples: list[list[float]] = []
    unshaped: list[list[float]] = []
    for tokens in PREFILL_LENGTHS:
        for _ in range(REPEATS):
            pre_s, pull_s, _ = _pd(P, D, *ids(tokens))
            prefill_samples.append([tokens, pre_s, 1])
            if pull_s is not None:
                unshaped.append([kv_transfer_bytes(tokens, BLOCK, kvpt), pull_s])
    for k, tokens in PREFILL_BATCHES:
        prefill_samples.append([k * tokens, _prefill_batch(P, D, ids, k, tokens), k])
    console.print(f"  calibrate: prefill and unshaped pulls ({len(prefill_samples)} + {len(unshaped)} samples) "
                  f"in {time.monotonic() - t0:.0f} s")

    baseline_bps = topo.fault_baseline_Bps * 8  # what the link faults shape against
    agent, ifname = pod_agents[p_pod], spec.testbed.fault_interfaces[0]
    shaped: list[list[float]] = []  # bytes, rate, NIXL seconds, stage seconds
    first: list[list[float]] = []  # the same, for the first pull after each rate change
    t1 = time.monotonic()
    for frac, blocks in SHAPED:
        rate = frac * baseline_bps
        ray.get(agent.apply_link.remote("calibrate", ifname, ["uplink"], rate, SHAPE_TTL_S, True))
        try:
            for i, b in enumerate((blocks[0],) + tuple(blocks)):
                tokens = b * BLOCK + BLOCK // 2  # b + 1 blocks: the partial last one moves too
                nbytes = kv_transfer_bytes(tokens, BLOCK, kvpt)
                ideal_s = nbytes * 8 / rate  # short pulls are cheap: repeat them more
                for _ in range(1 if i == 0 else 3 if ideal_s < 1.0 else 2 if ideal_s < 2.0 else 1):
                    stage_s, wire_s = _pd_wire(P, D, *ids(tokens))
                    if stage_s is not None and wire_s is not None:
                        (first if i == 0 else shaped).append([nbytes, rate, wire_s, stage_s])
        finally:
            ray.get(agent.clear.remote("calibrate"))
    console.print(f"  calibrate: {len(shaped)} shaped pulls (+{len(first)} after a rate change) "
                  f"in {time.monotonic() - t1:.0f} s")

    t2 = time.monotonic()
    decode_samples: list[list[float]] = []
    gaps: list[float] = []
    for tokens in DECODE_PROMPTS:
        for b in DECODE_BATCHES:
            if b > spec.engine.decode_max_batch:
                continue
            g, step = _decode_steps(D, ids, b, tokens)
            gaps += g
            if np.isfinite(step):
                decode_samples.append([b, b * (tokens + DECODE_TOKENS / 2), step])
    console.print(f"  calibrate: decode steps ({len(gaps)} gaps) in {time.monotonic() - t2:.0f} s")

    ps, us, ss, ds = (np.asarray(x, float) for x in (prefill_samples, unshaped, shaped, decode_samples))
    f_pre = fit_prefill(ps[:, 0], ps[:, 1])
    f_dec = fit_decode(ds[:, 0], ds[:, 1], ds[:, 2])
    f_pull = fit_pull(ss[:, 0], ss[:, 1], ss[:, 2])
    f_un = fit_unshaped_pull(us[:, 0], us[:, 1])
    noise = stall_stats(gaps, float(np.median(gaps))) | pull_noise(shaped, first)
    return calibration_from_fits(
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        source={"model": model_meta.get("model"), "host": platform.node(), "cores": _cores(),
                "link_baseline_gbps": spec.topology.link_baseline_gbps, "scenario": spec.name,
                "max_model_len": spec.testbed.max_model_len, "kv_cache_bytes": spec.testbed.kv_cache_bytes,
                "measure_s": time.monotonic() - t0},
        prefill=f_pre, decode=f_dec, pull=f_pull, unshaped=f_un, kv_bytes_per_token=kvpt, kv_block_tokens=BLOCK,
        decode_kv_tokens=spec.testbed.kv_cache_bytes // kvpt, handshake_s=handshake_s, noise=noise,
        samples={"prefill_tokens_s_batch": prefill_samples, "pull_unshaped_bytes_s": unshaped,
                 "pull_shaped_bytes_bps_nixl_s_stage_s": shaped, "pull_after_rate_change_bytes_bps_nixl_s_stage_s": first,
                 "decode_batch_kvtokens_step_s": decode_samples})


def _cores() -> int:
    import os

    return len(os.sched_getaffinity(0))
