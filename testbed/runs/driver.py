"""The testbed's driver: runs inside the head's network namespace, connected to Ray.

    python -m testbed.runs.driver --jobs JOBS.pkl --out DIR --model DIR --mode netns|local|cluster
        [--calibrate FILE] ...

The jobs are the launcher's (testbed/runs/jobs.py): each spec as the command line validated it,
its policies and seeds, and each seed's workload as the launcher generated it; none is parsed
or generated again here, and each router actor gets the spec object itself. Connected to Ray (``RAY_ADDRESS``), it finds the pods among the nodes' resources
(:func:`testbed.runs.pods.discover_pods`; a spec bigger than the cluster is refused, saying what was
found), starts every engine in parallel (testbed/engines/pool.py: one actor per topology worker,
prefill or decode as the topology places it), checks once that KV pulled across pods
decodes like a single engine (the probe, recorded in ``testbed.json``), makes
every engine pair's first NIXL transfer, calibrates if asked
(:mod:`testbed.calibration.calibrate`), then for each (policy, seed) creates a router
actor that replays the spec's workload against them and streams the run
directory, and finally shuts the engines down. `testbed run` brings the cluster
up around it and down after.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import ray
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from workloads.generate import Workload

from core.canary import Reference, canary_ids
from core.experiment import run_dir_for, testbed_capacity
from core.util.files import write_json_atomic
from core.spec.model import ExperimentSpec
from core.calibration.fit import Calibration, load_calibration, save_calibration
from core.util.logs import child_env, configure_from_env
from core.util.ray_start import ray_init
from testbed.router.actor import FaultTargets, RouterActor
from testbed.calibration.calibrate import calibrate
from testbed.engines.pairs import warm_pairs
from testbed.faults.agent_actor import FaultAgents
from testbed.faults.injector import PodTargets
from testbed.faults.probe_paths import ProbePath, ProbePathError
from testbed.engines.prompts import prompt_ids
from testbed.engines.tiny_model import model_dtype
from testbed.runs.jobs import RunJob, read_jobs
from testbed.engines import kept
from testbed.engines.pool import ENGINE_THREADS, Engines, EnginesNotStarted
from testbed.runs.pods import discover_pods
from vocab import CLUSTER_MODES, FAULT_COMPUTE, FAULT_LINK, MODE_CLUSTER, MODE_LOCAL

log = logging.getLogger(__name__)

HEAD_RESOURCE = "node:__internal_head__"  # Ray's own resource of the head node
console = Console(stderr=True)


def link_faulted_pods(specs: Sequence[ExperimentSpec]) -> set[int]:
    """Every pod a link fault of these runs shapes: each needs a probe path (testbed/faults/probe_paths.py)."""
    return {p for s in specs for f in s.faults if f.kind == FAULT_LINK for p in f.pods}


def gpu_clock_refusal(specs: Sequence[ExperimentSpec], gpu: bool, pod_euids: Sequence[int]) -> str | None:
    """Why these runs cannot start, in one line, where a compute fault on GPU engines would lock the
    GPU clock of a pod whose fault agent is not root: NVML's clock locks need root
    (testbed/faults/gpu.py), and a CPU quota would not slow a GPU, so there is nothing to fall back
    on. None where nothing stands in the way (CPU engines take a cgroup quota instead)."""
    if not gpu:
        return None
    for s in specs:
        for i, f in enumerate(s.faults):
            for p in (f.pods if f.kind == FAULT_COMPUTE else []):
                if pod_euids[p] != 0:
                    return (f"{s.name}: faults[{i}]: a compute fault on GPU engines locks pod {p}'s GPU clock through "
                            f"NVML, which needs root; pod {p}'s fault agent runs as uid {pod_euids[p]} (run Ray as "
                            "root on that node: cluster.yaml's auth.ssh_user)")
    return None


def fault_targets(agents: FaultAgents, engines: Engines, paths: dict[int, ProbePath]) -> FaultTargets:
    """Where the command's faults act; ``paths``: the probe of every pod a link fault of its runs
    shapes (``agents.probe_paths(link_faulted_pods(...))``, chosen before the engines start)."""
    backend = "gpu" if engines.gpu else "cpu"  # the engines' device, not what the host has
    # Each CPU engine computes on one torch thread (EngineConfig.omp_threads): a slow-down by f
    # gives the pod's engines their threads' worth of cores over f, never more than the host has.
    host = len(os.sched_getaffinity(0))
    per_pod = np.bincount(engines.topo.worker_pod, minlength=engines.topo.n_pods)
    cores = [float(host) if ENGINE_THREADS is None else min(float(n * ENGINE_THREADS), host) for n in per_pod]
    pods = [PodTargets(agent, ifname, pids, backend, c, gpus, mine, paths.get(k),
                       agents.agent_of(paths[k].peer) if k in paths else None)
            for k, (agent, ifname, pids, c, gpus, mine) in enumerate(zip(
                agents.pods, agents.pod_ifnames, engines.pod_pids(), cores, engines.pod_gpu_uuids(),
                engines.pod_engines()))]
    return FaultTargets(pods)


def run_calibration(cal: Calibration, path: str, measured_here: bool) -> dict[str, Any]:
    """What a run's run.json says of its engines' calibration: where it is, whether it was measured
    on these very engines just before, and the engine speeds (analysis/run/host_stall.py marks a request
    host-stalled against them, not against the spec's nominal engine)."""
    return {"path": str(path), "created": cal.created, "measured_here": measured_here,
            "engine": cal.engine.model_dump(mode="json")}


def start_router(spec: ExperimentSpec, policy: str, seed: int, out: Path, workload_summary: dict[str, Any],
                 engines: Engines, model_meta: dict[str, Any], targets: FaultTargets | None = None,
                 canaries: dict[int, Reference] | None = None,
                 kv_paths: dict[str, Any] | None = None) -> tuple[Any, list[dict[str, Any]]]:
    """One run's router actor on the head node, over engines verified quiet and with their prefix
    caches reset (Engines.quiesce: no run finds an earlier one's pulls moving or its prompts
    cached; ``kv_paths``, the check that every pair's KV path works, kv_paths_or_restart, is
    recorded beside); also the engines' counters at its start."""
    start = engines.quiesce(engines.lease_s)
    if kv_paths is not None:
        start["kv_paths"] = kv_paths
    before = engines.metrics()
    router = RouterActor.options(resources={HEAD_RESOURCE: 0.001}).remote(
        spec, policy, seed, str(out), workload_summary,
        {"model": {**model_meta, "kv_block_tokens": engines.block_tokens}, "start": start,
         **({"calibration": engines.calibration} if engines.calibration else {})},
        engines.prefill, engines.decode, engines.topo, testbed_capacity(spec, model_meta["kv_bytes_per_token"]),
        model_meta["vocab"], model_meta["kv_bytes_per_token"], engines.block_tokens,
        targets if spec.faults else None, engines.names,
        canaries)
    return router, before


def close_router(router: Any, status: str, engines: Engines, before: list[dict[str, Any]],
                 agents: FaultAgents | None) -> None:
    """Close the run directory with the engines' counters over the run, then end the actor and
    clear whatever faults the run left (it clears its own): the next run starts clean."""
    after = engines.metrics()
    names = engines.names
    # per-run engine counters: e.g. external prefix-cache hits on a decode engine prove KV was pulled
    deltas = {name: {k: a[k] - b[k] for k in a if isinstance(a[k], (int, float)) and isinstance(b.get(k), (int, float))}
              for name, a, b in zip(names, after, before)}
    try:
        ray.get(router.close.remote(status, engines=deltas, engines_after=dict(zip(names, engines.loads()))))
        fetch_run_dir(router)
    finally:
        ray.kill(router)
        if agents is not None:
            agents.clear_all()


def fetch_run_dir(router: Any) -> Path | None:
    """The closed run directory, from the router's node to this driver's where they differ (the
    records land where the command runs: testbed/router/run_archive.py). Returns where it was unpacked."""
    if ray.get(router.node_id.remote()) == ray.get_runtime_context().get_node_id():
        return None
    from testbed.router.run_archive import unpack_dir

    run_dir = Path(ray.get(router.run_dir.remote()))
    names = unpack_dir(ray.get(router.run_archive.remote()), run_dir.parent)
    console.print(f"  records fetched from the router's node: {len(names)} entries -> {run_dir}")
    return run_dir


def run_one(spec: ExperimentSpec, policy: str, seed: int, wl: Workload, out: Path, engines: Engines,
            model_meta: dict[str, Any], progress: Progress, targets: FaultTargets | None = None,
            agents: FaultAgents | None = None, kv_paths: dict[str, Any] | None = None) -> Path:
    """One (policy, seed) of ``spec`` replaying ``wl``, the seed's workload (generated and checked
    by the launcher: testbed/runs/jobs.py)."""
    run_dir = run_dir_for(out, spec, policy, seed)
    # the canaries' references first: start_router then resets the prefix caches they filled
    ids = canary_ids(len(wl), spec.testbed.canaries)
    prompts = {i: prompt_ids(i, int(wl.prompt_tokens[i]), model_meta["vocab"], salt=seed) for i in ids}
    checked = {i: min(int(wl.output_tokens[i]), spec.testbed.canary_tokens) for i in ids}
    refs = engines.references(prompts, checked) if ids else {}
    router, before = start_router(spec, policy, seed, out, wl.summary(), engines, model_meta, targets, refs,
                                  kv_paths)
    task = progress.add_task(f"{policy} seed {seed}", total=len(wl))
    done = router.run.remote(wl.arrival_s.tolist(), wl.prompt_tokens.tolist(), wl.output_tokens.tolist())
    status = "interrupted"
    try:
        while not ray.wait([done], timeout=0.5)[0]:
            p = ray.get(router.progress.remote())
            progress.update(task, completed=sum(p["outcomes"].values()))
        outcomes = ray.get(done)
        status = "finished"
    finally:
        close_router(router, status, engines, before, agents)
        progress.update(task, visible=False)
    progress.console.print(f"  {policy:<16} seed {seed}: {outcomes} -> {run_dir}")
    return run_dir


def serve_one(spec: ExperimentSpec, policy: str, seed: int, out: Path, engines: Engines, model_meta: dict[str, Any],
              model: str, build_model: bool, targets: FaultTargets | None = None,
              agents: FaultAgents | None = None) -> Path:
    """The serve mode: one router actor serves outside clients through its OpenAI-compatible
    ingress (ingress.py), the spec's faults on their schedule from now, until Ctrl-C; then it
    drains and the run directory is closed as finished, like a workload's."""
    run_dir = run_dir_for(out, spec, policy, seed)
    router, before = start_router(spec, policy, seed, out, {"source": "ingress"}, engines, model_meta, targets)
    t = spec.testbed
    done = router.serve.remote(model, t.ingress_host, t.ingress_port, build_model, model_dtype(model))
    status = "interrupted"
    try:
        try:
            host, port = ray.get(router.ingress_address.remote())
        except ray.exceptions.RayTaskError as e:  # e.g. the port is taken: its one line, no traceback
            raise SystemExit(f"testbed: error: {getattr(e, 'cause', e)}") from None
        # the marker line tests and scripts wait for (flushed: the driver's stderr may be a pipe)
        console.print(f"serving {policy} (seed {seed}) at http://{host}:{port}/v1 -> {run_dir}; Ctrl-C stops")
        sys.stderr.flush()
        try:
            while not ray.wait([done], timeout=1.0)[0]:
                pass
        except KeyboardInterrupt:
            console.print("stopping: new requests get 503, those in flight finish")
            ray.get(router.stop.remote())
        outcomes = ray.get(done)
        status = "finished"
    finally:
        close_router(router, status, engines, before, agents)
    console.print(f"  {policy:<16} seed {seed}: {outcomes} -> {run_dir}")
    return run_dir


def kv_path_counter(engines: Engines, agents: FaultAgents | None) -> tuple[str, Callable[[], int]] | None:
    """The interface and a reader of the transmit counter the probe's KV must move: the prefill pod's shaped interface
    (decode pulls, so the bytes leave the prefill pod). None where no interface is shaped (local mode)
    or the probe stays inside one pod."""
    topo = engines.topo
    src, dst = int(topo.worker_pod[topo.prefill_ids[0]]), int(topo.worker_pod[topo.decode_ids[-1]])
    if agents is None or src == dst:
        return None
    agent, ifname = agents.pods[src], agents.pod_ifnames[src]
    return ifname, lambda: ray.get(agent.tx_bytes.remote(ifname))


def kv_path_verdict(spec: ExperimentSpec, kv_bytes: int, tx_bytes: int, ifname: str) -> dict[str, Any]:
    """Did the probe's KV cross the interface the faults shape? With UCX over TCP it sends about
    1.05 x the KV bytes there (docs/verified.md "UCX over TCP, and what crosses the wire"); much less means another path (shared memory, RDMA,
    another NIC), where a link fault would not touch the KV. Warns then."""
    crossed = tx_bytes >= 0.9 * kv_bytes
    if not crossed:
        console.print(f"[bold red]warning[/]: the probe moved {kv_bytes / 2**20:.1f} MiB of KV but only "
                      f"{tx_bytes / 2**20:.2f} MiB left the prefill pod through {ifname}: the KV takes another "
                      f"path (transport {spec.testbed.transport}), and link faults on {ifname} will not slow it")
    else:
        console.print(f"KV path: {tx_bytes / 2**20:.1f} MiB through {ifname} for {kv_bytes / 2**20:.1f} MiB of KV")
    return {"interface": ifname, "kv_bytes": kv_bytes, "tx_bytes": tx_bytes, "crossed": crossed}


def kv_paths_or_restart(spec: ExperimentSpec, engines: Engines, vocab: int) -> dict[str, Any]:
    """Every live engine pair's KV path checked before a run (Engines.kv_paths); where one is broken
    (a link down leaves the pod's NIXL connections failed for good: docs/testbed.md "A link down")
    or an engine is down (an engine fault killed it: each run starts on the whole set, as in the
    simulator), every engine restarted and checked again. What run.json records as ``start.kv_paths``."""
    kv = engines.kv_paths(vocab)
    if not kv["ok"] or kv["down"]:
        what = (f"KV path(s) {', '.join(kv['broken'])} broken" if not kv["ok"]
                else f"engine pair(s) {', '.join(kv['down'])} with a dead engine")
        console.print(f"[yellow]{what} after the last run: restarting the engines[/]")
        kv["restart"] = engines.restart(spec.testbed.engine_start_timeout_s, vocab)
        kv["after_restart"] = again = engines.kv_paths(vocab)
        if not again["ok"]:
            raise RuntimeError(f"KV path(s) {', '.join(again['broken'])} still broken after restarting the engines")
        console.print(f"engines restarted in {kv['restart']['restart_s']:.0f} s; every KV path works")
    return kv


def _run_jobs(jobs: list[RunJob], out: Path, engines: Engines, model_meta: dict[str, Any],
              targets: FaultTargets | None, agents: FaultAgents | None, paths: dict[int, ProbePath]) -> None:
    with Progress(TextColumn("{task.description:<28}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console) as progress:
        for job in jobs:
            for policy in job.policies:
                for seed in job.seeds:
                    kv = kv_paths_or_restart(job.spec, engines, model_meta["vocab"])
                    if "restart" in kv and targets is not None:  # the new engines' processes (same agents, paths)
                        targets = fault_targets(agents, engines, paths)
                    run_one(job.spec, policy, seed, job.workloads[seed], job.out_dir or out, engines, model_meta,
                            progress, targets, agents, kv)


def _cluster_pss(run_id: str | None) -> int | None:
    if not run_id:
        return None
    from testbed.cluster.emulated import EmulatedCluster

    return EmulatedCluster.attach(None, run_id).status().pss_bytes


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="testbed.runs.driver")
    ap.add_argument("--jobs", required=True,
                    help="the launcher's jobs file (testbed/runs/jobs.py); every job shares the first one's engines")
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--model-meta", required=True, help="JSON: vocab, kv_bytes_per_token")
    ap.add_argument("--engine-root", required=True)
    ap.add_argument("--mode", required=True, choices=CLUSTER_MODES,
                    help="cluster: an existing Ray cluster (RAY_ADDRESS), its pods found from node resources")
    ap.add_argument("--cluster-run-id", help="for the memory figure in testbed.json")
    ap.add_argument("--calibrate", help="measure the engines and links first and write the calibration here")
    ap.add_argument("--calibration", help="a calibration of these engines measured before (recorded in each run)")
    ap.add_argument("--serve", action="store_true", help="serve the first job's policy and seed through the ingress "
                                                          "until SIGINT, instead of the workloads")
    ap.add_argument("--keep-engines", action="store_true",
                    help="reuse the engines an earlier --keep-engines command kept on this cluster where this spec "
                         "makes the same ones, and keep the engines up at the end (testbed/engines/kept.py)")
    return ap


def _cluster_refusal(spec0: Any, keep_engines: bool) -> str | None:
    """Why the cluster cannot take this command's engines (one line), before any starts; None if it can."""
    try:
        pods = discover_pods(spec0)
    except ValueError as e:
        return str(e)
    console.print(f"{len(pods)} pods: " + ", ".join(f"pod{i}@{p['ip']}" for i, p in pods.items()))
    if not keep_engines and (held := kept.list_kept()):
        # they hold the pods' resources: new engines would wait for them until their start timed out
        return (f"{len(held)} engines kept by an earlier --keep-engines command hold the pods: pass "
                "--keep-engines to use them, or stop them first (testbed cluster stop-engines --address ADDR)")
    return None


def _start(engines: Engines, spec0: Any, summary: dict[str, Any], model_meta: dict[str, Any],
           cluster_run_id: str | None) -> None:
    """The engines started, or reused and made as clean as new ones."""
    t0 = time.monotonic()
    started = engines.start(spec0.testbed.engine_start_timeout_s)
    summary["engines_ready_s"] = time.monotonic() - t0
    summary["engines"] = started
    summary["engines_reused"] = engines.reused
    summary["pss_bytes_ready"] = _cluster_pss(cluster_run_id)
    console.print(f"{len(started)} engines {'reused (kept by an earlier command)' if engines.reused else 'ready'} "
                  f"in {summary['engines_ready_s']:.0f} s: " + ", ".join(f"{s['name']}@{s['host_ip']}" for s in started))
    if engines.reused:  # clean as new ones: nothing held or cached from the last command's runs, every
        # pair's KV path working (a link down in the last command can have broken them) before the probe
        summary["reused_start"] = engines.quiesce(engines.lease_s)
        summary["reused_start"]["kv_paths"] = kv_paths_or_restart(spec0, engines, model_meta["vocab"])


def _prove(engines: Engines, spec0: Any, summary: dict[str, Any], model_meta: dict[str, Any],
           agents: FaultAgents | None) -> None:
    """Every pair's KV path proven: the PD probe, its bytes on the KV interface, and each pair's
    first NIXL handshake made now."""
    counter = kv_path_counter(engines, agents)
    before = counter[1]() if counter else 0
    summary["pd_probe"] = probe = engines.probe(model_meta["vocab"])
    console.print(f"KV transfer probe ({engines.names[0]} -> {engines.names[-1]}): {probe['verdict']}, "
                  f"{probe['external_prefix_cache_hits']} external prefix-cache hits")
    if counter:
        ifname, tx = counter
        summary["kv_path"] = kv_path_verdict(spec0, probe["prompt_tokens"] * model_meta["kv_bytes_per_token"],
                                              tx() - before, ifname)
    # Every pair's first NIXL transfer carries a handshake (1-2 s: docs/verified.md "The
    # handshake"): make it now, so no run pays it and the simulator need not model it.
    summary["handshake_s"] = handshake = warm_pairs(engines.prefill, engines.decode, model_meta["vocab"],
                                                    engines.block_tokens)
    console.print(f"{len(handshake)} engine pairs warmed up (first NIXL handshake "
                  f"{np.median(handshake) if handshake else float('nan'):.2f} s median)")


def _calibration(args: argparse.Namespace, engines: Engines, spec0: Any, agents: FaultAgents | None,
                 model_meta: dict[str, Any], summary: dict[str, Any]) -> None:
    """The engines' calibration: measured now (--calibrate) or the one given (--calibration), recorded in each run."""
    if args.calibrate:
        t1 = time.monotonic()
        cal = calibrate(spec0, engines.topo, engines.prefill, engines.decode, agents.pods,
                        {**model_meta, "model": args.model, "kv_block_tokens": engines.block_tokens},
                        summary["handshake_s"])
        save_calibration(cal, args.calibrate)
        summary["calibration"] = {"path": args.calibrate, "measure_s": time.monotonic() - t1}
        console.print(f"calibrated in {time.monotonic() - t1:.0f} s -> {args.calibrate}")
        engines.calibration = run_calibration(cal, args.calibrate, measured_here=True)
    elif args.calibration:
        engines.calibration = run_calibration(load_calibration(args.calibration), args.calibration,
                                              measured_here=False)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    configure_from_env()  # the level `testbed -v/-q` chose (core/util/logs.py)
    # SIGTERM from `testbed run` (or a CI timeout) unwinds like Ctrl-C: runs are closed as interrupted.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    # `testbed run` stops its driver with SIGINT: it must act on it even where it was started with
    # SIGINT ignored (what a shell does to a background job), as the serve mode's stop relies on it.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    jobs = read_jobs(Path(args.jobs))
    spec0 = jobs[0].spec
    model_meta = json.loads(args.model_meta)
    if any(job.spec.faults for job in jobs) and args.mode == MODE_LOCAL:
        raise SystemExit("testbed driver: faults need the netns mode (root): local mode has no links to shape")
    ray_init(log_to_driver=False, runtime_env={"env_vars": child_env()})  # the actors log at our level
    if (why := _cluster_refusal(spec0, args.keep_engines)) is not None:  # before anything started: one line
        print(f"testbed: error: {why}", file=sys.stderr)  # not rich: it would wrap the line
        ray.shutdown()
        return 2
    # On a cluster the nodes may not share the driver's disk: each engine builds the tiny model itself.
    build_model = args.mode == MODE_CLUSTER and spec0.testbed.model is None
    engines = Engines(spec0, args.model, Path(args.engine_root), args.mode, build_model=build_model,
                      first_token_limit_s=max(job.spec.first_token_limit_s for job in jobs), keep=args.keep_engines)
    agents: FaultAgents | None = None
    paths: dict[int, ProbePath] = {}
    summary: dict[str, Any] = {"mode": args.mode, "pods": spec0.topology.pods, "engines_per_pod": spec0.topology.workers_per_pod,
                               "placement": spec0.topology.placement, "model": args.model, **model_meta}
    try:
        if args.mode != MODE_LOCAL:  # every node's agent: the KV check below reads its counters
            agents = FaultAgents(spec0.topology.pods, spec0.testbed.fault_interfaces, HEAD_RESOURCE)
            console.print(f"fault agents on {len(agents.pods)} pods (interfaces {', '.join(spec0.testbed.fault_interfaces)})")
            # before any engine starts (minutes on a GPU node): the agents' uids decide it
            if why := gpu_clock_refusal([job.spec for job in jobs], engines.gpu, agents.pod_euids):
                print(f"testbed: error: {why}", file=sys.stderr)
                return 2
            if any(job.spec.faults for job in jobs) or args.calibrate:
                try:  # where each faulted pod's link is measured from: the agents' nodes and routes decide it
                    paths = agents.probe_paths(link_faulted_pods([job.spec for job in jobs]))
                except ProbePathError as e:  # one line: which pod, and why no node can measure it
                    print(f"testbed: error: {e}", file=sys.stderr)
                    return 2
        try:
            _start(engines, spec0, summary, model_meta, args.cluster_run_id)
        except EnginesNotStarted as e:  # one line, not a traceback; the engines' logs say why
            print(f"testbed: error: {e}", file=sys.stderr)
            return 2
        _prove(engines, spec0, summary, model_meta, agents)
        targets = None
        if agents is not None and (any(job.spec.faults for job in jobs) or args.calibrate):
            targets = fault_targets(agents, engines, paths)
        _calibration(args, engines, spec0, agents, model_meta, summary)
        if args.serve:
            job = jobs[0]
            serve_one(job.spec, job.policies[0], job.seeds[0], Path(args.out), engines, model_meta, args.model, build_model,
                      targets, agents)
        else:
            _run_jobs(jobs, Path(args.out), engines, model_meta, targets, agents, paths)
        summary["pss_bytes_end"] = _cluster_pss(args.cluster_run_id)
    finally:
        summary_path = Path(args.out) / spec0.name / "testbed.json"
        summary_path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(summary_path, summary, indent=2, default=str)
        try:
            if agents is not None:
                agents.shutdown()  # every fault cleared before anything else goes
        finally:
            engines.shutdown()
            ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
