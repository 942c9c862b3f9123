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
  (:func:`core.calibration.fit.stall_stats`);
* **NIXL's first handshake**: each pair's first pull minus its second of the same size;
* **the host** (:func:`measure_host`): on each engine's node, the CPUs its processes may run on
  (their affinity) and the machine's boot id, so engines on one machine are counted together;
  where CPU engines outnumber its cores the simulator shares them (docs/simulator.md "The host
  model");
* **the host under load** (:func:`concurrent_phase`): a prompt timed on the first prefill engine
  alone, on every prefill engine at once, and on every prefill engine at once while a pull from
  the first hangs on its shaped link (its decoder waits, its prefill engine holds the KV: vLLM's
  CPU engines spin on both ends), each after the workers' busy-wait of the last call has ended;
  the slowdown against alone beside the host model's for the same demand;
* **demand by state** (:func:`demand_window`): while that pull still hangs, a second prefill
  engine computes and a second decode engine decodes; each engine's CPU over the window (its own
  host samples, hoststats.py) against the computing one's is what it demands in the host model's
  units, and the machine's busy CPU beyond the engines' is the rest of the host's
  (docs/simulator.md "Demand by state").

The fits and the file are :mod:`core.calibration.fit`'s.
"""

from __future__ import annotations

import math
import platform
import time
from datetime import datetime, timezone
from typing import Any, Sequence

import numpy as np
import ray
from rich.console import Console

from core.calibration.fit import (Calibration, HostCalibration, calibration_from_fits, fit_decode, fit_prefill,
                              fit_pull, fit_unshaped_pull, pull_noise, stall_stats)
from core.host_model import host_shared, host_speed, rate_against, sample_intervals, worker_spin_s
from core.spec.model import ExperimentSpec
from core.topology import Topology, kv_transfer_bytes
from testbed.engines.engine import EngineConfig

from testbed.engines.pairs import PromptIds, prefill_then_pull, pull_with_wire
from vocab import DEMAND_STATES

console = Console(stderr=True)
# Prompt lengths for prefill and unshaped pulls: one block and a bit to most of the tiny model's context.
PREFILL_LENGTHS = (160, 384, 768, 1536, 2560)
PREFILL_BATCHES = ((2, 384), (4, 384), (2, 1024))  # (requests, tokens each), sent together
REPEATS = 3
# Shaped pulls: rate as a fraction of the link baseline, and how long each pull lasts at that rate
# (seconds, not tens), from which a prompt's KV blocks follow for the model's KV and the rate
# (pull_blocks): on the tiny model (a block of 1 MiB) at 250 Mbit/s, prompts of 4 and 16, 1 and 4,
# 1 and 2, and 1 whole blocks and half a block; on a GPU model and NIC, as many as take as long.
SHAPED = ((1.0, (0.17, 0.57)), (0.1, (0.67, 1.68)), (0.02, (3.4, 5.0)), (0.01, (6.7,)))
SHAPE_TTL_S = 120.0
DECODE_BATCHES = (1, 2, 4, 8, 16)
DECODE_PROMPTS = (256, 1024)
DECODE_TOKENS = 32
# The concurrent phase: prompts of this length (about 0.4 s alone on the CI machine's engines), each
# setting this many times; a hanging pull at SHAPED's last rate lasts HANG_S (6 blocks and a half of
# the tiny model at r = 0.01 of 250 Mbit/s), past the 1.5 s wait, the prefills timed
# during it and the demand window after them: 12 s in all on the quiet 2-core machine, and a
# loaded one has taken 2.2x as long for its prefills (docs/simulator.md "The host model").
HOST_PROMPT = 1536
HOST_REPEATS = 3
HANG_S = 23.5
# The demand window: the reference engine prefills HOST_PROMPT prompts at once, as many as take
# DEMAND_WINDOW_SAMPLES of the engines' host sample periods (EngineConfig.host_sample_s) at the
# speed measured alone, so that every engine samples its CPU at least twice in it whatever its
# phase, the window running slower under load than alone. Two prompts (0.6-0.7 s here) held fewer
# than two samples of an engine in 2 of 3 windows of one calibration and in all 3 of two e2e runs
# (2026-11-26: the demand by state measured nothing). Meanwhile another decode engine decodes up to
# DEMAND_DECODE_TOKENS tokens, 14 s at the spec's quiet decode step (9.1 ms), six times the
# window of six prompts measured under load (2.2 s, an e2e run of 2026-11-26); it is aborted when
# the window closes.
DEMAND_WINDOW_SAMPLES = 3
DEMAND_MIN_PROMPTS = 2
DEMAND_DECODE_TOKENS = 1536
DEMAND_SETTLE_S = 0.5  # after the window opens: the decode's pull is done and its steps run
HOST_PROBE_TIMEOUT_S = 60.0


def _prefill_batch(engine: Any, decode: Any, ids: PromptIds, k: int, tokens: int) -> float:
    """k equal prompts at once: first allocation to last return (then pulled, freeing their KV)."""
    reqs = [ids(tokens) for _ in range(k)]
    sent, back, res = _timed_prefills([engine] * k, reqs)
    start = min(sent + r.stages.get("alloc", 0.0) for r in res)
    ray.get([decode.decode.remote(rid, p, 1, r.kv_transfer_params) for (rid, p), r in zip(reqs, res)])
    return max(back) - start


def _timed_prefills(engines: Sequence[Any],
                    reqs: Sequence[tuple[str, list[int]]]) -> tuple[float, list[float], list[Any]]:
    """Each request prefilled on its engine, all sent at once: when they were sent, when each
    came back (in request order) and the results."""
    sent = time.monotonic()
    refs = [e.prefill.remote(rid, p) for e, (rid, p) in zip(engines, reqs)]
    back: dict[Any, float] = {}
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        back[done[0]] = time.monotonic()
    return sent, [back[r] for r in refs], ray.get(refs)


def _decode_steps(engine: Any, ids: PromptIds, batch: int, tokens: int) -> tuple[list[float], float]:
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


def _prefill_phase(P: Any, D: Any, ids: PromptIds, kvpt: int) -> tuple[list[list[float]], list[list[float]]]:
    """Prefills alone and in batches, each pulled unshaped: (prefill samples, unshaped pulls)."""
    t0 = time.monotonic()
    prefill_samples: list[list[float]] = []
    unshaped: list[list[float]] = []
    for tokens in PREFILL_LENGTHS:
        for _ in range(REPEATS):
            pre_s, pull_s, _ = prefill_then_pull(P, D, *ids(tokens))
            prefill_samples.append([tokens, pre_s, 1])
            if pull_s is not None:
                unshaped.append([kv_transfer_bytes(tokens, ids.block, kvpt), pull_s])
    for k, tokens in PREFILL_BATCHES:
        prefill_samples.append([k * tokens, _prefill_batch(P, D, ids, k, tokens), k])
    console.print(f"  calibrate: prefill and unshaped pulls ({len(prefill_samples)} + {len(unshaped)} samples) "
                  f"in {time.monotonic() - t0:.0f} s")
    return prefill_samples, unshaped


def pull_blocks(seconds: float, rate_bps: float, kvpt: int, block: int, max_model_len: int) -> int:
    """The whole blocks b of a calibration prompt (b blocks and half of one more, so b + 1 move: the
    partial last one too) whose pull lasts about ``seconds`` at ``rate_bps``, for a model of
    ``kvpt`` KV bytes per token in blocks of ``block`` tokens. At least 1; at most what the
    context holds, a shorter pull where the link is fast for the model's KV."""
    moved = round(seconds * rate_bps / 8 / (kvpt * block))
    most = (max_model_len - 1 - block // 2) // block
    return int(min(max(moved - 1, 1), most))


def _shaped_phase(P: Any, D: Any, ids: PromptIds, kvpt: int, agent: Any, ifname: str,
                  baseline_bps: float, max_model_len: int) -> tuple[list[list[float]], list[list[float]]]:
    """Pulls across the prefill pod's uplink shaped to each of SHAPED's rates: (shaped pulls, the
    first pull after each rate change), each row bytes, rate, NIXL seconds, stage seconds."""
    shaped: list[list[float]] = []
    first: list[list[float]] = []
    t1 = time.monotonic()
    for frac, seconds in SHAPED:
        rate = frac * baseline_bps
        blocks = [pull_blocks(s, rate, kvpt, ids.block, max_model_len) for s in seconds]
        ray.get(agent.apply_link.remote("calibrate", ifname, ["uplink"], rate, SHAPE_TTL_S, True))
        try:
            for i, b in enumerate((blocks[0],) + tuple(blocks)):
                tokens = b * ids.block + ids.block // 2  # b + 1 blocks: the partial last one moves too
                nbytes = kv_transfer_bytes(tokens, ids.block, kvpt)
                ideal_s = nbytes * 8 / rate  # short pulls are cheap: repeat them more
                for _ in range(1 if i == 0 else 3 if ideal_s < 1.0 else 2 if ideal_s < 2.0 else 1):
                    stage_s, wire_s = pull_with_wire(P, D, *ids(tokens))
                    if stage_s is not None and wire_s is not None:
                        (first if i == 0 else shaped).append([nbytes, rate, wire_s, stage_s])
        finally:
            ray.get(agent.clear.remote("calibrate"))
    console.print(f"  calibrate: {len(shaped)} shaped pulls (+{len(first)} after a rate change) "
                  f"in {time.monotonic() - t1:.0f} s")
    return shaped, first


def _decode_phase(spec: ExperimentSpec, D: Any, ids: PromptIds) -> tuple[list[list[float]], list[float]]:
    """Decode steps at each batch size and prompt length: (samples of batch, KV tokens, step; the
    gaps between steps)."""
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
    return decode_samples, gaps


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
    ids = PromptIds(int(model_meta["vocab"]), int(model_meta["kv_block_tokens"]))  # the engines' own block
    t0 = time.monotonic()
    prefill_samples, unshaped = _prefill_phase(P, D, ids, kvpt)
    baseline_bps = topo.fault_baseline_Bps * 8  # what the link faults shape against
    agent, ifname = pod_agents[p_pod], spec.testbed.fault_interfaces[0]
    shaped, first = _shaped_phase(P, D, ids, kvpt, agent, ifname, baseline_bps, spec.testbed.max_model_len)
    decode_samples, gaps = _decode_phase(spec, D, ids)

    host = measure_host(spec, topo, prefill, decode)
    if host is not None and len(prefill) > 0:
        t3 = time.monotonic()
        concurrent, rows, demand, ratios = concurrent_phase(
            spec, prefill, D, agent, ifname, SHAPED[-1][0] * baseline_bps, ids, host.cores, decoders=decode,
            one_host=host.hosts == 1, kvpt=kvpt)
        host = host.model_copy(update={"concurrent": concurrent, "demand": demand})
        console.print(f"  calibrate: host {host.cores:g} cores, {host.engines} engines, shared {host.shared}; "
                      f"under load {_show(concurrent)}; demand {_show_demand(demand)} "
                      f"in {time.monotonic() - t3:.0f} s")
    else:
        rows, ratios = [], []

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
        prefill=f_pre, decode=f_dec, pull=f_pull, unshaped=f_un, kv_bytes_per_token=kvpt, kv_block_tokens=ids.block,
        decode_kv_tokens=spec.testbed.kv_cache_bytes // kvpt, handshake_s=handshake_s, noise=noise,
        samples={"prefill_tokens_s_batch": prefill_samples, "pull_unshaped_bytes_s": unshaped,
                 "pull_shaped_bytes_bps_nixl_s_stage_s": shaped, "pull_after_rate_change_bytes_bps_nixl_s_stage_s": first,
                 "decode_batch_kvtokens_step_s": decode_samples, "host_phase_engine_s": rows,
                 "host_demand_repeat_state_ratio": ratios},
        host=host)


def _cores() -> int:
    import os

    return len(os.sched_getaffinity(0))


@ray.remote(num_cpus=0)
def _host_probe(pids: list[int]) -> tuple[str, list[int]]:
    """On an engine's node: the machine's boot id and the CPUs the engine's processes may run on."""
    import os
    from pathlib import Path

    cpus: set[int] = set()
    for pid in pids:
        try:
            cpus |= os.sched_getaffinity(pid)
        except OSError:  # gone since it was listed
            pass
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip(), sorted(cpus)


def measure_host(spec: ExperimentSpec, topo: Topology, prefill: Sequence[Any],
                 decode: Sequence[Any]) -> HostCalibration | None:
    """The host the engines share (module docstring); None, with a warning, where an engine's node
    cannot be probed (the simulator then keeps the spec's host)."""
    engines = [(int(topo.worker_pod[w]), e) for w, e in zip(topo.prefill_ids.tolist(), prefill)] + \
              [(int(topo.worker_pod[w]), e) for w, e in zip(topo.decode_ids.tolist(), decode)]
    try:
        pids = ray.get([e.compute_pids.remote() for _, e in engines], timeout=HOST_PROBE_TIMEOUT_S)
        probes = ray.get([_host_probe.options(resources={f"pod{pod}": 0.001}).remote(p)
                          for (pod, _), p in zip(engines, pids)], timeout=HOST_PROBE_TIMEOUT_S)
    except (ray.exceptions.GetTimeoutError, ray.exceptions.RayError) as e:
        console.print(f"  calibrate: the host was not measured ({type(e).__name__}: {e}); the simulator keeps the spec's")
        return None
    by_host: dict[str, list[set[int]]] = {}
    for boot, cpus in probes:
        by_host.setdefault(boot, []).append(set(cpus))
    busiest = max(by_host.values(), key=len)
    cores = float(len(set().union(*busiest)))
    gpus = spec.testbed.gpus_per_engine
    return HostCalibration(cores=cores, engines=len(busiest), hosts=len(by_host), gpus_per_engine=gpus,
                           shared=host_shared(cores, len(busiest), gpus, spec.engine.host_engine_cores),
                           spin_s=worker_spin_s(spec.testbed.executor))


def _quiet(spec: ExperimentSpec) -> None:
    """Wait until every engine's worker has stopped spinning after its last call (worker_spin_s)."""
    time.sleep(worker_spin_s(spec.testbed.executor) + 0.5)


def _prefill_all(engines: Sequence[Any], ids: PromptIds) -> tuple[list[float], list[tuple[str, list[int], Any]]]:
    """One prompt on each engine at once: each one's seconds as the router records them, and the
    requests (id, prompt, result) whose KV is still held."""
    reqs = [ids(HOST_PROMPT) for _ in engines]
    sent, back, res = _timed_prefills(engines, reqs)
    secs = [b - sent - x.stages.get("alloc", 0.0) for b, x in zip(back, res)]
    return secs, [(rid, p, x) for (rid, p), x in zip(reqs, res)]


def concurrent_phase(spec: ExperimentSpec, prefill: Sequence[Any], decode: Any, agent: Any, ifname: str,
                     rate_bps: float, ids: PromptIds, cores: float, *, decoders: Sequence[Any] = (),
                     one_host: bool = True, kvpt: int) -> tuple[dict[str, float], list[list[float]], dict[str, float],
                                                     list[list[float]]]:
    """The host under load (module docstring): a HOST_PROMPT prompt on prefill[0] alone (1 engine
    demanding), on every prefill engine at once (k), and on every one while a pull from prefill[0] to
    ``decode`` hangs on prefill[0]'s uplink shaped to ``rate_bps`` (k + 1: its decoder waits); then,
    with a second prefill engine, the demand window (:func:`demand_window`; ``decoders``: every
    decode engine, one other than ``decode`` decodes in it; ``one_host``: every engine on one
    machine, so its busy CPU beyond theirs is the rest of the host's). Returns the medians, the
    measured slowdowns against alone and the host model's for the same demand; rows (setting
    0/1/2, engine index, seconds); the demand by state (HostCalibration.demand) and its rows."""
    k, per = len(prefill), spec.engine.host_engine_cores
    rows: list[list[float]] = []
    for _ in range(HOST_REPEATS):
        _quiet(spec)
        secs, held = _prefill_all(prefill[:1], ids)
        rows += [[0, 0, secs[0]]]
        ray.get([decode.decode.remote(rid, p, 1, x.kv_transfer_params) for rid, p, x in held])
    for _ in range(HOST_REPEATS):
        _quiet(spec)
        secs, held = _prefill_all(prefill, ids)
        rows += [[1, i, s] for i, s in enumerate(secs)]
        ray.get([decode.decode.remote(rid, p, 1, x.kv_transfer_params) for rid, p, x in held])
    alone = float(np.median([x[2] for x in rows if x[0] == 0]))
    ratios: list[list[float]] = []
    windows: list[float] = []  # the demand windows' seconds, where they measured
    others = [e for e in decoders if e is not decode]
    hang_blocks = pull_blocks(HANG_S, rate_bps, kvpt, ids.block, spec.testbed.max_model_len)
    for r in range(HOST_REPEATS):
        rid, p = ids(hang_blocks * ids.block + ids.block // 2)
        pre = ray.get(prefill[0].prefill.remote(rid, p))
        ray.get(agent.apply_link.remote("calibrate-host", ifname, ["uplink"], rate_bps, SHAPE_TTL_S, True))
        try:
            hang = decode.decode.remote(rid, p, 1, pre.kv_transfer_params)
            _quiet(spec)  # the pull has started and hangs; only its two ends demand
            secs, held = _prefill_all(prefill, ids)
            rows += [[2, i, s] for i, s in enumerate(secs)]
            if k > 1:
                got, window_s = demand_window(prefill, decode, others[0] if others else None, ids, hang,
                                              list(decoders) or [decode], one_host, demand_prompts(alone))
                ratios += [[r, *x] for x in got]
                windows += [window_s] * bool(got)
        finally:
            ray.get(agent.clear.remote("calibrate-host"))
        ray.get([hang] + [decode.decode.remote(r, q, 1, x.kv_transfer_params) for r, q, x in held])
    a = np.asarray(rows, float)
    every, hung = (float(np.median(a[a[:, 0] == s, 2])) for s in (1, 2))
    demand = demand_of(ratios, per)
    out = {"prompt_tokens": float(HOST_PROMPT), "prefill_engines": float(k), "alone_s": alone,
           "all_prefill_s": every, "all_prefill_hang_s": hung}
    # the model's slowdown for each setting, with what each engine demands there (demand by state
    # where measured, else the spec's): alone, one engine computes; then k; then k and the hung
    # pull's decoder (its prefill engine computes as well)
    bg = demand.get("background", spec.engine.host_background_cores)
    pull = demand.get("pull", spec.engine.host_pull_cores)
    alone_speed = host_speed(cores, per + bg)
    for name, measured, engines, cores_demanded in (("all_prefill", every, k, k * per + bg),
                                                    ("all_prefill_hang", hung, k + 1, k * per + pull + bg)):
        out |= {f"{name}_demand_engines": float(engines), f"{name}_demand_cores": cores_demanded,
                f"{name}_slowdown": measured / alone,
                f"{name}_model_slowdown": alone_speed / host_speed(cores, cores_demanded)}
    if windows and len(demand) == len(DEMAND_STATES) - 1:
        # the window itself, a check of the model on the data it was measured on: demand_prompts
        # prompts at once against one alone, and every state's demand at once
        window = float(np.median(windows))
        out |= {"demand_window_s": window, "demand_window_slowdown": window / (demand_prompts(alone) * alone),
                "demand_window_model_slowdown": alone_speed / host_speed(cores, per + sum(demand.values()))}
    return out, rows, demand, ratios


# What demand_window measures, by index in its rows (HostCalibration.demand's keys but the first)


def demand_prompts(alone_s: float) -> int:
    """How many HOST_PROMPT prompts the demand window prefills at once: DEMAND_WINDOW_SAMPLES host
    sample periods at ``alone_s`` a prompt (the comment above DEMAND_WINDOW_SAMPLES), at least
    DEMAND_MIN_PROMPTS."""
    return max(DEMAND_MIN_PROMPTS, math.ceil(DEMAND_WINDOW_SAMPLES * EngineConfig.host_sample_s / alone_s))


def demand_window(prefill: Sequence[Any], hung: Any, decoder: Any | None, ids: PromptIds, hang: Any,
                  decoders: Sequence[Any], one_host: bool, prompts: int = DEMAND_MIN_PROMPTS
                  ) -> tuple[list[list[float]], float]:
    """While the pull ``hang`` from prefill[0] to ``hung`` hangs (prefill[0] holds its KV, ``hung``
    waits for it): prefill[1] computes ``prompts`` prompts at once and ``decoder`` (if any)
    decodes. Returns rows (state index in DEMAND_STATES, cores against the computing engine's, one
    per interval between two host samples: :func:`_window_rates`), empty where the window held
    fewer than two host samples of an engine, or the pull or the decode ended inside it (not the
    state measured); and the window's seconds."""
    ref = prefill[1]
    decoding = None
    if decoder is not None:
        dec_rid, p = ids(ids.block + ids.block // 2)
        pre = ray.get(ref.prefill.remote(dec_rid, p))
        decoding = decoder.decode.remote(dec_rid, p, DEMAND_DECODE_TOKENS, pre.kv_transfer_params)
        time.sleep(DEMAND_SETTLE_S)
    reqs = [ids(HOST_PROMPT) for _ in range(prompts)]
    opened = time.time()
    res = ray.get([ref.prefill.remote(r, q) for r, q in reqs])
    closed = time.time()
    running = [x for x in (hang, decoding) if x is not None]
    ended = ray.wait(running, num_returns=len(running), timeout=0)[0]
    if decoding is not None:  # measured: its tokens left to decode would only lengthen the calibration
        ray.get(decoder.abort.remote(dec_rid))
    # the window's prompts leave their KV held: read it (by the decoder, which is free once it is done)
    reader = decoder if decoder is not None else hung
    ray.get(([decoding] if decoding is not None else [])
            + [reader.decode.remote(r, q, 1, x.kv_transfer_params) for (r, q), x in zip(reqs, res)])
    if ended:
        console.print(f"  calibrate: a demand window left out: the {'pull' if hang in ended else 'decode'} "
                      f"ended inside its {closed - opened:.1f} s")
        return [], closed - opened
    states = [("compute", ref), ("hold", prefill[0]), ("pull", hung)] + \
             ([("decode", decoder)] if decoder is not None else [])
    return _window_rates(states, list(prefill) + list(decoders), opened, closed, one_host), closed - opened


def _window_rates(states: list[tuple[str, Any]], every: list[Any], opened: float, closed: float,
                  one_host: bool) -> list[list[float]]:
    """Rows (state index, ratio) of each interval between two host samples of the engines in
    ``states`` within [opened, closed], against the first's (the computing one) nearest it
    (core.host_model.rate_against, as a run's are rated in analysis/checks/host_demand.py); with
    ``one_host`` also the machine's busy CPU beyond every engine's, as ``background``."""
    samples = ray.get([e.host_samples.remote(opened) for e in every])
    within = [np.asarray([x for x in ss if x[0] <= closed], float) for ss in samples]
    if any(len(x) < 2 for x in within):
        console.print(f"  calibrate: a demand window left out: fewer than two host samples of an engine "
                      f"in its {closed - opened:.1f} s")
        return []
    state_of = {id(e): state for state, e in states}
    i_ref = every.index(states[0][1])
    t0, t1, cpu = sample_intervals(within[i_ref][:, 0], within[i_ref][:, 1])
    busy = sample_intervals(within[i_ref][:, 0], within[i_ref][:, 4])[2]  # hoststats.HostSample.busy_s
    others = []
    for i, (e, x) in enumerate(zip(every, within)):
        if i != i_ref:
            a, b, c = sample_intervals(x[:, 0], x[:, 1])
            others.append(((a + b) / 2, c, np.full(len(a), state_of.get(id(e)), dtype=object)))
    rated = rate_against((t0 + t1) / 2, cpu, busy, others, float(np.median(t1 - t0)) / 2)
    return [[DEMAND_STATES.index(state), ratio] for state, ratio in rated if one_host or state != "background"]


def demand_of(rows: list[list[float]], per: float) -> dict[str, float]:
    """HostCalibration.demand from demand_window's rows (repeat, state, ratio): the median ratio of
    each state, in cores (the computing engine demands ``per``); empty where none was measured."""
    if not rows:
        return {}
    a = np.asarray(rows, float)
    return {state: float(np.median(a[a[:, 1] == i, 2])) * per
            for i, state in enumerate(DEMAND_STATES) if i and (a[:, 1] == i).any()}


def _show(c: dict[str, float]) -> str:
    return ", ".join(f"{n}: x{c[f'{n}_slowdown']:.2f} (model x{c[f'{n}_model_slowdown']:.2f})"
                     for n in ("all_prefill", "all_prefill_hang", "demand_window") if f"{n}_slowdown" in c)


def _show_demand(d: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.2f}" for k, v in d.items()) or "not measured"
