"""The engines a driver holds: one Ray actor per topology worker, prefill or decode as the topology
places it, started in parallel; the checks between runs (every pair's KV path, quiet engines), their
restart where a fault broke them, the single-engine references of the canaries, the probe of the
PD path, and their shutdown (testbed/runs/driver.py runs the jobs on them)."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import ray

from core.canary import EQUAL, NEAR_TIE, Reference, reference, verdict
from core.experiment import build_topology
from core.spec.model import ExperimentSpec
from testbed.engines.pairs import check_pairs, warm_pairs
from testbed.engines.actor import EngineActor
from testbed.engines.engine import EngineConfig
from testbed.engines.tiny_model import model_dtype
from testbed.engines.prompts import prompt_ids
from testbed.engines import kept
from testbed.machine.kv_ports import SIDE_CHANNEL_BASE_PORT
from vocab import CORRUPT, ROLE_DECODE, ROLE_PREFILL

log = logging.getLogger(__name__)

ENGINE_THREADS = EngineConfig.omp_threads  # torch threads an engine computes on
# How long a pair's check pull may take (Engines.kv_paths): a healthy one of two blocks takes
# milliseconds, a pair's first one carries the NIXL handshake, 1-2 s, and a host stall on 2 cores
# a few seconds more (docs/verified.md "The handshake"); a broken path fails at once or never.
KV_PATH_TIMEOUT_S = 10.0


# Where a failed start is explained: an engine's output (vLLM's log, its traceback) goes to Ray's worker
# logs on its node, not to the driver (docs/troubleshooting.md "Engines that do not start").
ENGINE_LOGS = ("each engine's output is in Ray's worker logs on its node (worker-*.out and .err in Ray's logs "
               "folder; `ray logs cluster` lists them): docs/troubleshooting.md")


class EnginesNotStarted(RuntimeError):
    """The engines did not start: one line saying why and where their logs are."""


def kv_block_of(started: list[dict[str, Any]]) -> int:
    """The KV block (tokens) of engines as they reported it when started: one size for all, since a
    pull moves whole blocks from one engine's cache into another's."""
    sizes = {int(d["block_tokens"]) for d in started}
    if len(sizes) != 1:
        raise EnginesNotStarted("the engines report KV blocks of different sizes ("
                                + ", ".join(f"{d['name']}: {d['block_tokens']}" for d in started)
                                + " tokens): every engine of a run must store KV in blocks of one size")
    return sizes.pop()


class Engines:
    """The engine actors of the run, one per worker of the spec's topology, started together
    and shut down together. ``prefill``/``decode`` follow the topology's worker order, so the
    router's candidate index picks the engine directly."""

    def __init__(self, spec: ExperimentSpec, model: str, engine_root: Path, mode: str,
                 build_model: bool = False, first_token_limit_s: float | None = None, keep: bool = False) -> None:
        """``first_token_limit_s``: the longest first-token limit of the jobs these engines serve
        (default ``spec``'s), which their KV lease must outlive. ``keep``: reuse the engines an
        earlier command kept on this cluster if they are the ones this spec makes (else stop them),
        and keep these up after :meth:`shutdown` (testbed/engines/kept.py); ``engine_root``
        is then a folder that outlives the command."""
        self.topo = build_topology(spec)
        self._args = (spec, model, engine_root, mode, build_model, first_token_limit_s)
        # their calibration as each run's run.json records it (run_calibration); None: not calibrated
        self.calibration: dict[str, Any] | None = None
        self.gpu = spec.testbed.gpus_per_engine > 0  # else vLLM's CPU build (EngineConfig.gpu)
        self.generation = 0  # restarts so far (restart)
        self.keep = keep
        self.reused = False  # found kept by an earlier command, not started by this one
        self._block: int | None = None  # the engines' KV block, as they report it once started (start)
        self._create()

    def _create(self) -> None:
        spec, model, engine_root, mode, build_model, first_token_limit_s = self._args
        t, e, topo = spec.testbed, spec.engine, self.topo
        self.prefill: list[Any] = []
        self.decode: list[Any] = []
        self.names: list[str] = []  # in `all` order: prefill engines, then decode engines
        self.lease_s = 0
        made: list[tuple[str, dict[str, Any], Any, dict[str, Any]]] = []  # (role, config, interface, placement)
        # A restarted engine logs apart from the one it replaces, under a name of its own. Beside the
        # first set's folder, not below it: vLLM's IPC sockets live in it, and a socket's path has
        # at most 107 characters (measured on the shared e2e cluster: 98 with the first set's folder).
        gen = f"-{self.generation}" if self.generation else ""
        root = Path(f"{engine_root}{gen}")
        # The interface KV crosses: on a real cluster the one the link faults shape.
        # (the first allowlisted one the engine's node has: EngineActor resolves it there).
        net_device = {"netns": "eth0", "local": "lo"}.get(mode, list(t.fault_interfaces))
        # the pod's fault agent takes a sliver of the pod's resource; its engines share the rest
        share = 0.9 / topo.workers_per_pod
        # every engine in the dtype of the driver's copy, also where a node builds its own (EngineActor)
        dtype = model_dtype(model)
        for role, ids in ((ROLE_PREFILL, topo.prefill_ids), (ROLE_DECODE, topo.decode_ids)):
            pods = topo.worker_pod[ids]
            for k, w in enumerate(ids.tolist()):
                pod = int(topo.worker_pod[w])
                name = f"pod{pod}-{role}" + (f"{k}" if (pods == pod).sum() > 1 else "")
                self.names.append(name)
                # vLLM's batch limits are the engine block's: the simulator models the same engine
                max_seqs = e.prefill_slots if role == ROLE_PREFILL else e.decode_max_batch
                cfg = dict(model=Path(model), dtype=dtype, run_dir=root, name=name,
                           side_channel_port=SIDE_CHANNEL_BASE_PORT + w, role=role,
                           # the KV must outlive its pull, which ends before the first token
                           request_deadline_s=first_token_limit_s or spec.first_token_limit_s,
                           lease_s=e.kv_lease_s,
                           max_model_len=t.max_model_len,
                           kv_cache_bytes=t.kv_cache_bytes, max_num_seqs=max_seqs,
                           max_num_batched_tokens=max(e.prefill_batch_tokens, max_seqs),
                           transport=t.transport, gpu=self.gpu, shm_recheck_ms=t.shm_recheck_ms,
                           kv_dscp=t.kv_dscp if t.transport == "rdma" and t.rdma_link_faults == "dcb_maxrate" else None,
                           nixl_rehandshake=t.nixl_rehandshake,
                           executor=t.executor, enforce_eager=t.enforce_eager)
                # the longest KV can stay held after its run (quiesce): the lease, every engine's
                self.lease_s = max(self.lease_s, EngineConfig(**cfg).kv_lease_s)
                # Ray sets CUDA_VISIBLE_DEVICES for an actor only when it asks for GPUs.
                made.append((role, cfg, net_device, {"resources": {f"pod{pod}": share}, "num_gpus": t.gpus_per_engine}))
        if self.keep and self._reuse(made, build_model):
            return
        for role, cfg, net_device, placed in made:
            if self.keep:  # outlives this driver, found again by its name (testbed/engines/kept.py)
                opts = {"name": kept.actor_name(self._key, self.generation, cfg["name"]),
                        "namespace": kept.KEPT_NAMESPACE, "lifetime": "detached"}
            else:
                opts = {"name": f"engine-{cfg['name']}{gen}"}
            handle = EngineActor.options(**placed, **opts).remote(cfg, net_device, build_model=build_model)
            (self.prefill if role == ROLE_PREFILL else self.decode).append(handle)

    def _reuse(self, made: list[tuple[str, dict[str, Any], Any, dict[str, Any]]], build_model: bool) -> bool:
        """Take the kept engines this configuration makes, if a whole set is up; else stop whatever
        is kept (it holds the pods these need) and leave the key for new ones."""
        # the folder an engine logs to is the first command's; the lease counts, not the limit it came from
        self._key = kept.engine_key([
            {"role": role, "interface": dev, "placement": placed, "build_model": build_model,
             "config": {**{k: v for k, v in cfg.items() if k not in ("run_dir", "request_deadline_s", "lease_s")},
                        "kv_lease_s": EngineConfig(**cfg).kv_lease_s}}
            for role, cfg, dev, placed in made])
        found = kept.find_kept(self._key, self.names) if not self.generation and not self.reused else None
        if found is not None:
            self.generation, handles = found
            n_pre = sum(role == ROLE_PREFILL for role, *_ in made)
            self.prefill, self.decode = handles[:n_pre], handles[n_pre:]
            self.reused = True
            return True
        if stopped := kept.stop_kept():
            log.warning("stopped %d kept engines of another configuration (or an incomplete set): %s",
                        len(stopped), ", ".join(stopped))
        return False

    @property
    def block_tokens(self) -> int:
        """The engines' KV block (tokens), as they reported it when started (:meth:`start`)."""
        if self._block is None:
            raise RuntimeError("the engines' KV block is known once they have started")
        return self._block

    @property
    def all(self) -> list[Any]:
        return self.prefill + self.decode

    def start(self, timeout_s: float) -> list[dict[str, Any]]:
        """Start every engine; reused kept ones only say who they are (a set with one gone is
        replaced by a new one)."""
        if self.reused:
            try:
                return self._started([{**d, "reused": True}
                                      for d in ray.get([a.describe.remote() for a in self.all], timeout=60)])
            except (ray.exceptions.RayError, TimeoutError, KeyError) as e:  # KeyError: kept by an older version
                log.warning("kept engines did not answer (%s): starting new ones", type(e).__name__)
                self._stop()
                self.reused = False
                self.generation += 1
                self._create()
        try:
            return self._started(ray.get([a.start.remote() for a in self.all], timeout=timeout_s))
        except ray.exceptions.GetTimeoutError:
            raise EnginesNotStarted(f"the engines did not start within {timeout_s:.0f} s "
                                    f"(testbed.engine_start_timeout_s); {ENGINE_LOGS}") from None
        except ray.exceptions.RayError as e:
            why = str(getattr(e, "cause", None) or e).strip().splitlines()
            raise EnginesNotStarted(f"an engine did not start: {why[-1] if why else type(e).__name__}; "
                                    f"{ENGINE_LOGS}") from e

    def _started(self, started: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """What :meth:`start` returns, with the engines' KV block taken from it."""
        self._block = kv_block_of(started)
        return started

    @staticmethod
    def _each(refs: list[Any], timeout_s: float | None = None) -> list[Any]:
        """Each call's answer, or an empty dict where the engine (its actor or its core) died:
        a run goes on without it, and the next runs too (the router stops choosing it).
        ``timeout_s`` bounds them all together, as one ``ray.get`` of the list would."""
        out = []
        until = None if timeout_s is None else time.monotonic() + timeout_s
        for ref in refs:
            try:
                out.append(ray.get(ref, timeout=None if until is None else max(0.0, until - time.monotonic())))
            except (ray.exceptions.RayError, RuntimeError) as e:
                log.warning("an engine did not answer: %s", str(e).splitlines()[0] if str(e) else type(e).__name__)
                out.append({})
        return out

    def metrics(self) -> list[dict[str, Any]]:
        return self._each([a.metrics.remote() for a in self.all])

    def kv_paths(self, vocab: int, timeout_s: float = KV_PATH_TIMEOUT_S) -> dict[str, Any]:
        """Whether every live (prefill, decode) pair moves KV now (pairs.check_pairs); what
        run.json records as ``start.kv_paths``: ok, the pairs that did not, the check's seconds."""
        t0 = time.monotonic()
        res = check_pairs(self.prefill, self.decode, vocab, self.block_tokens, timeout_s)
        n_pre = len(self.prefill)
        pairs = [(self.names[i], self.names[n_pre + j]) for i in range(n_pre) for j in range(len(self.decode))]
        broken = [f"{p}->{d}" for (p, d), r in zip(pairs, res) if r is False]
        return {"ok": not broken, "broken": broken, "down": [f"{p}->{d}" for (p, d), r in zip(pairs, res) if r is None],
                "check_s": round(time.monotonic() - t0, 3)}

    def restart(self, timeout_s: float, vocab: int) -> dict[str, Any]:
        """Shut every engine down and start a new set (same configuration, logs apart), with their
        pairs' first transfer made: the way back from KV paths a fault broke for good (vLLM 0.32's
        NIXL does not reconnect after a link down: docs/testbed.md "A link down"). Returns what
        run.json records: the restart's seconds and the engines' generation."""
        t0 = time.monotonic()
        self._stop()
        self.reused = False
        self.generation += 1
        self._create()
        self.start(timeout_s)
        warm_pairs(self.prefill, self.decode, vocab, self.block_tokens)
        return {"restart_s": round(time.monotonic() - t0, 1), "generation": self.generation}

    def reset(self) -> list[bool | None]:
        """Reset every engine's prefix cache; per engine, whether it could (vLLM refuses while
        any block is in use: block_pool.reset_prefix_cache), None where it did not answer (dead)."""
        return [r if isinstance(r, bool) else None for r in self._each([a.reset_prefix_cache.remote() for a in self.all])]

    def quiesce(self, within_s: float, poll_s: float = 0.5) -> dict[str, Any]:
        """Wait until no engine holds a block, then reset the prefix caches: the check that a
        run starts on engines the last one left clean. vLLM resets an engine's prefix cache
        only when no block is in use but its null block, so a successful reset proves that no
        request runs there, no KV is held for a pull (a prefill's lease), no pull is still
        writing into a decoder's blocks, and nothing an earlier run computed is cached.
        ``within_s``: the KV lease (the longest a dropped request's KV stays held), after which
        the engines are busy with something no lease explains. Returns what run.json records
        as ``start``: quiet or not, the wait, and the engines still busy when it gave up."""
        t0 = time.monotonic()
        tries = 0
        while True:
            ok = self.reset()
            tries += 1
            waited = time.monotonic() - t0
            # a dead engine holds nothing a run could meet (the router never chooses it again)
            if all(r is not False for r in ok) or waited >= within_s:
                break
            time.sleep(poll_s)
        busy = [n for n, r in zip(self.names, ok) if r is False]
        down = [n for n, r in zip(self.names, ok) if r is None]
        out: dict[str, Any] = {"quiet": not busy, "waited_s": round(waited, 3), "resets": tries, "busy": busy,
                               "down": down}
        if busy:
            out["loads"] = dict(zip(self.names, self.loads()))
            log.warning("engines %s still hold KV %.0f s after the last run (past their lease): this run "
                        "does not start clean (run.json start.quiet = false)", ", ".join(busy), waited)
        return out

    def loads(self) -> list[dict[str, Any]]:
        return self._each([a.load.remote() for a in self.all])

    def references(self, prompts: dict[int, list[int]], max_tokens: dict[int, int]) -> dict[int, Reference]:
        """Each canary's single-engine greedy reference (core/canary.py): its prompt decoded alone
        on a decode engine, no KV pulled, with the top-2 logprobs per step; the canaries spread
        over the decode engines and decoded together. One whose engine failed or that came back
        short stays unchecked. Call before the prefix caches are reset: the run must not find
        these prompts cached (start_router resets them)."""
        ids = sorted(prompts)
        calls = [self.decode[k % len(self.decode)].decode.remote(f"canary-ref-{i}", prompts[i], max_tokens[i], None, 2)
                 for k, i in enumerate(ids)]
        refs: dict[int, Reference] = {}
        for i, res in zip(ids, self._each(calls)):
            if res and res.finish_reason != "abort" and len(res.token_ids) == max_tokens[i]:
                refs[i] = reference(res.token_ids, res.top_logprobs, res.top_tokens)
        return refs

    def probe(self, vocab: int, n_tokens: int = 300, max_tokens: int = 16) -> dict[str, Any]:
        """Prove the PD path moves correct KV across pods: prefill on the first pod, decode
        on the last pod's decode engine with the pulled KV, against that engine decoding
        the same prompt alone (greedy). A divergence is accepted only at a near-tie of the
        reference (core/canary.py, as for the run's canaries), never elsewhere."""
        ids = prompt_ids(10**9, n_tokens, vocab, salt=12345)
        p, d = self.prefill[0], self.decode[-1]
        before = ray.get(d.metrics.remote())["vllm:external_prefix_cache_hits_total"]
        pre = ray.get(p.prefill.remote("probe-pd", ids))
        pd = ray.get(d.decode.remote("probe-pd", ids, max_tokens, pre.kv_transfer_params))
        hits = ray.get(d.metrics.remote())["vllm:external_prefix_cache_hits_total"] - before
        self.reset()  # the reference must compute the prompt itself
        ref = ray.get(d.decode.remote("probe-ref", ids, max_tokens, None, 2))
        v = verdict(reference(ref.token_ids, ref.top_logprobs, ref.top_tokens), pd.token_ids)
        said = {EQUAL: "equal", NEAR_TIE: f"near-tie divergence at token {v.position}",
                CORRUPT: f"MISMATCH at token {v.position}"}[v.verdict]
        return {"ok": v.verdict != CORRUPT and hits >= n_tokens and len(pd.token_ids) == max_tokens,
                "verdict": said, "external_prefix_cache_hits": hits, "prompt_tokens": n_tokens,
                "pd_tokens": list(pd.token_ids), "reference_tokens": list(ref.token_ids)}

    def pod_gpu_uuids(self) -> list[list[str]]:
        """Per pod, the NVML UUIDs of its engines' GPUs (each engine resolves its own); empty on CPUs."""
        if not self.gpu:
            return [[] for _ in range(self.topo.n_pods)]
        uuids = ray.get([a.gpu_uuid.remote() for a in self.all])
        pods = np.r_[self.topo.worker_pod[self.topo.prefill_ids], self.topo.worker_pod[self.topo.decode_ids]]
        return [sorted({u for i in np.flatnonzero(pods == p) if (u := uuids[i])}) for p in range(self.topo.n_pods)]

    def pod_engines(self) -> list[list[tuple[str, str, Any]]]:
        """Per pod, its engines as (role, name, actor handle): what an engine fault kills."""
        topo, out = self.topo, [[] for _ in range(self.topo.n_pods)]
        n_pre = len(self.prefill)
        for i, handle in enumerate(self.all):
            role, ids, k = (ROLE_PREFILL, topo.prefill_ids, i) if i < n_pre else (ROLE_DECODE, topo.decode_ids, i - n_pre)
            out[int(topo.worker_pod[ids[k]])].append((role, self.names[i], handle))
        return out

    def pod_pids(self) -> list[list[int]]:
        """Per pod, the worker processes of its engines (what a compute fault slows)."""
        pids = ray.get([a.compute_pids.remote() for a in self.all])
        pods = np.r_[self.topo.worker_pod[self.topo.prefill_ids], self.topo.worker_pod[self.topo.decode_ids]]
        return [[pid for i in np.flatnonzero(pods == p) for pid in pids[i]] for p in range(self.topo.n_pods)]

    def shutdown(self) -> None:
        """The command's end: the engines stop, unless kept for the next command."""
        if self.keep:
            log.info("engines kept up for the next --keep-engines command: %s", ", ".join(self.names))
            return
        self._stop()

    def _stop(self) -> None:
        try:
            self._each([a.shutdown.remote() for a in self.all], timeout_s=120)
        finally:
            for a in self.all:
                ray.kill(a)
