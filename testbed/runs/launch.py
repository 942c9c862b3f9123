"""`testbed run`: model, emulated cluster, driver in the head's namespace, teardown.

Runs in the user's (root) namespace. Whatever happens (an error, Ctrl-C,
SIGTERM) the cluster comes down: every Ray and vLLM process of the run, its
namespaces and its temp folder.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from rich.console import Console

from testbed.faults.shaping import netem_missing

from core.calibration.fit import calibration_load
from core.spec.model import ExperimentSpec
from core.spec.sizes import available_memory_bytes
from testbed.machine.cache_dirs import model_cache_dir
from testbed.machine.netns import missing_privileges
from testbed.router.flow import ABORT_GRACE_S
from testbed.runs.jobs import Job, RunJob, prepare_jobs, repeat_of, write_jobs
from vocab import FAULT_LINK, MODE_AUTO, MODE_LOCAL, MODE_NETNS

console = Console(stderr=True)


def prepare_model(spec: ExperimentSpec) -> tuple[Path, dict[str, int]]:
    """The model directory (the tiny model is built once and cached) and what the router needs of it."""
    from testbed.engines.tiny_model import build_tiny_model, kv_bytes_per_token, native_dtype

    if spec.testbed.model is None:  # in the dtype the engines' hardware computes natively
        path = build_tiny_model(model_cache_dir(), dtype=native_dtype(gpu=spec.testbed.gpus_per_engine > 0))
    else:
        path = Path(spec.testbed.model).expanduser()
        if not (path / "config.json").is_file():
            raise ValueError(f"testbed.model: {path} is not a model directory (no config.json)")
    cfg = json.loads((path / "config.json").read_text())
    return path, {"vocab": int(cfg["vocab_size"]), "kv_bytes_per_token": kv_bytes_per_token(path)}


def engine_limits(spec: ExperimentSpec) -> tuple[int, int, int, int | None]:
    """What of the engine block the real engines are started with (vLLM's batch limits, and the
    KV lease where the spec sets it; else the lease follows the jobs' longest first-token limit)."""
    e = spec.engine
    return e.prefill_slots, e.decode_max_batch, e.prefill_batch_tokens, e.kv_lease_s


# What one CPU engine with the tiny model takes besides its KV cache (PSS of 4 engines plus the
# cluster measured 8.0 GiB with 256 MiB of KV each: docs/performance.md "Measured figures"), and
# the Ray nodes.
ENGINE_BASE_BYTES = int(1.5 * 2**30)
CLUSTER_BYTES = 2**30
# Verified: 4 engines on 2 cores (docs/verified.md "Memory: four engines on two cores"). Past two
# engines a core, each engine loop, its NIXL progress thread and UCX workers get under half a core
# and host stalls dominate results.
ENGINES_PER_CORE = 2


def check_machine(spec: ExperimentSpec, cores: int | None = None, available_bytes: int | None = None) -> None:
    """Refuse a topology this machine cannot hold before starting anything: one vLLM engine per
    topology worker, each needing memory and a share of the CPU."""
    topo = spec.topology
    n = topo.pods * topo.workers_per_pod
    cores = cores if cores is not None else len(os.sched_getaffinity(0))
    have = available_bytes if available_bytes is not None else available_memory_bytes()
    need = n * (ENGINE_BASE_BYTES + spec.testbed.kv_cache_bytes) + CLUSTER_BYTES
    if n > ENGINES_PER_CORE * cores:
        raise ValueError(f"topology: {topo.pods} pods x {topo.workers_per_pod} workers = {n} vLLM engines, but this "
                         f"machine's {cores} cores hold at most {ENGINES_PER_CORE * cores} (two engines a core)")
    if need > have:
        raise ValueError(f"topology: {n} vLLM engines need about {need / 2**30:.1f} GiB "
                         f"({ENGINE_BASE_BYTES / 2**30:.1f} GiB each plus testbed.kv_cache_bytes, and the cluster), "
                         f"but {have / 2**30:.1f} GiB are available")


def check_faults(specs: Sequence[ExperimentSpec]) -> None:
    """Faults the testbed cannot apply are refused before anything starts."""
    if not any(s.faults for s in specs):
        return
    t = specs[0].testbed
    if t.mode == MODE_LOCAL or (t.mode == MODE_AUTO and missing_privileges() is not None):
        raise ValueError("faults need the netns mode (root, network namespaces): local mode has no links to shape")
    for s in specs:
        for i, f in enumerate(s.faults):
            if f.kind == FAULT_LINK and (f.delay_ms > 0 or f.loss > 0) and (why := netem_missing()):
                raise ValueError(f"{s.name}: faults[{i}]: {why}")
            if f.kind == FAULT_LINK and f.residual_bw == 0 and not f.kv_only:
                # Ray's control traffic to the pod would go down with it: the GCS declares the node
                # dead and its raylet exits, taking the pod's engines and the fault agent that
                # would clear the fault (a node's death, which no engine fault can stand for).
                raise ValueError(f"{s.name}: faults[{i}]: a link down on the testbed needs kv_only: true (the KV "
                                 "traffic dropped, Ray's control traffic kept; with it down too the pod's Ray node "
                                 "is declared dead)")


KEPT_ENGINES_DIR = "testbed-kept-engines"  # beside a command's work folder, which goes at its end


def emulated_cluster_at(address: str) -> Any:
    """The recorded emulated cluster whose head has this address (its head's namespace is the only
    place it can be reached from), or None."""
    from testbed.cluster.emulated import EmulatedCluster, default_state_dir

    state_dir = default_state_dir()
    for path in sorted(state_dir.glob("*.json")) if state_dir.exists() else []:
        try:
            c = EmulatedCluster.attach(state_dir, path.stem)
        except Exception:  # a state file being written or removed meanwhile
            continue
        if c.status().up and c.address == address:
            return c
    return None


def run_testbed(spec: ExperimentSpec, out: Path, policies: list[str], seeds: list[int],
                more: Sequence[Job] = (), calibrate_to: Path | None = None, address: str | None = None,
                serve: bool = False, repeat_to: Path | None = None, calibration: Path | None = None,
                load_to: Path | None = None, keep_engines: bool = False) -> int:
    """Run ``policies`` x ``seeds`` of ``spec`` (then the ``more`` jobs, on the same engines);
    with ``calibrate_to``, measure the engines and links first and write the calibration there;
    with ``calibration`` instead, a calibration of these engines measured before; either is
    recorded in each run's run.json (``calibration``: the engine speeds its host-stall marks use);
    with ``repeat_to``, run ``policies`` x ``seeds`` once more at the end, on the same engines and
    with the same workloads, into that folder (the testbed's repeatability).
    ``address``: on that Ray cluster (pods from its nodes' resources) instead of an emulated
    cluster brought up and down for the run. ``serve``: one policy and seed serve outside
    clients through the ingress instead of the workload, until Ctrl-C (a normal end). ``load_to``:
    first of all (after the calibration), the calibration load (core/calibration/fit.py
    ``calibration_load``) into that folder, which a calibration under the run's conditions is
    fitted on (analysis/checks/refit.py). ``keep_engines``: on the cluster at ``address``, reuse
    the engines an earlier such command kept where they are this spec's, and keep them up after
    (testbed/engines/kept.py)."""
    jobs = [(spec, policies, seeds), *more]
    # Each workload generated once, here, and refused before minutes go into starting engines
    # that cannot serve it; the driver runs these very workloads (testbed/runs/jobs.py).
    run_jobs = prepare_jobs(jobs, serve)
    if repeat_to is not None:
        if serve:
            raise ValueError("--serve: a served run has no workload to repeat")
        run_jobs.append(repeat_of(run_jobs[0], repeat_to))
    if load_to is not None:
        if serve:
            raise ValueError("--serve: a served run has no calibration load")
        load, = prepare_jobs([calibration_load(spec)])
        run_jobs.insert(0, replace(load, out_dir=Path(load_to).resolve()))
    return launch_jobs(run_jobs, out, calibrate_to=calibrate_to, address=address, serve=serve,
                       calibration=calibration, keep_engines=keep_engines)


def launch_jobs(run_jobs: Sequence[RunJob], out: Path, *, calibrate_to: Path | None = None,
                address: str | None = None, serve: bool = False, calibration: Path | None = None,
                keep_engines: bool = False) -> int:
    """Run prepared jobs (testbed/runs/jobs.py) on one set of engines, the first job's: on an emulated
    cluster brought up and down around them, or on the Ray cluster at ``address``. Each job's runs go to
    its ``out_dir``, else to ``out``; ``calibrate_to``/``calibration``/``keep_engines`` as :func:`run_testbed`."""
    from testbed.cluster.emulated import EmulatedCluster

    if keep_engines and address is None:
        raise ValueError("--keep-engines needs --address: without it the command's own cluster, and its engines, "
                         "go down at its end")
    spec = run_jobs[0].spec
    for job in run_jobs[1:]:
        other = job.spec
        if (other.testbed, other.topology, engine_limits(other)) != (spec.testbed, spec.topology, engine_limits(spec)):
            raise ValueError(f"{other.name}: jobs sharing engines need the same testbed block, topology, engine "
                             f"batch limits and kv_lease_s as {spec.name}")
    if address is not None:
        return _run_on_cluster(spec, out, run_jobs, calibrate_to, address, serve, calibration, keep_engines)
    check_machine(spec)  # the engines run here; on a given cluster, on its nodes
    check_faults([job.spec for job in run_jobs])
    if calibrate_to is not None and (spec.testbed.mode == MODE_LOCAL or
                                     (spec.testbed.mode == MODE_AUTO and missing_privileges() is not None)):
        raise ValueError("calibrate needs the netns mode (root, network namespaces): it shapes a pod's link")
    t0 = time.monotonic()
    model, model_meta = prepare_model(spec)
    topo = spec.topology
    cluster = EmulatedCluster(topo.pods, mode=spec.testbed.mode, subnet=spec.testbed.subnet)
    n_runs = sum(len(job.policies) * len(job.seeds) for job in run_jobs)
    console.print(f"[bold]{spec.name}[/] on the testbed: {topo.pods} pods x {topo.workers_per_pod} vLLM engines "
                  f"({topo.placement}), {cluster.mode} mode, {n_runs} runs in {len(run_jobs)} job(s) "
                  f"-> {out / spec.name}")
    old_term = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM tears down like Ctrl-C
    try:
        cluster.up()
        console.print(f"cluster up in {time.monotonic() - t0:.0f} s (run {cluster.run_id}, head {cluster.address})")
        argv = _driver_argv(run_jobs, out, model, model_meta, cluster.temp_root, cluster.mode, calibrate_to,
                            cluster.run_id, serve, calibration)
        with _host_ports(spec, cluster, serve):
            return _drive(lambda: cluster.popen_in_head(argv), spec if serve else None)
    finally:
        signal.signal(signal.SIGTERM, old_term)
        t1 = time.monotonic()
        cluster.down()  # the run's namespaces go, and with them every qdisc and ifb in them; its empty cgroups
        console.print(f"cluster down in {time.monotonic() - t1:.0f} s")


@contextmanager
def _host_ports(spec: ExperimentSpec, cluster: Any, serve: bool) -> Iterator[None]:
    """On an emulated cluster in namespaces the router's metrics exporter (and, serving, its ingress)
    listen in the head's namespace: the same addresses on the host forward there
    (testbed/cluster/forward.py), so a Prometheus or a client on the host reaches them as it would on
    a real cluster's head. A port taken on the host stops the command before the run, in one line."""
    if cluster is None or cluster.mode != MODE_NETNS:
        yield
        return
    from testbed.cluster.forward import NetnsForwarder

    t = spec.testbed
    ports = [("metrics", t.metrics_host, t.metrics_port)] if t.metrics_port else []
    ports += [("ingress", t.ingress_host, t.ingress_port)] if serve else []
    started: list[NetnsForwarder] = []
    try:
        for what, host, port in ports:
            inner = "127.0.0.1" if host in ("0.0.0.0", "") else host
            started.append(NetnsForwarder((host, port), cluster.fabric.head.netns, (inner, port), what).start())
            if what == "metrics":
                console.print(f"metrics: http://{host}:{port}/metrics while a run goes on "
                              "(Prometheus: testbed/router/prometheus/prometheus.yml, shipped in the package)")
        yield
    finally:
        for fwd in started:
            fwd.stop()


def _driver_argv(jobs: Sequence[RunJob], out: Path, model: Path, model_meta: dict[str, int], work: Path, mode: str,
                 calibrate_to: Path | None, cluster_run_id: str | None = None, serve: bool = False,
                 calibration: Path | None = None, kept_root: Path | None = None) -> list[str]:
    """The driver's command line; the jobs (specs and workloads) go to it in one file under ``work``.
    ``kept_root``: the engines are kept (--keep-engines), and log under that folder, which outlives
    ``work``."""
    argv = [sys.executable, "-m", "testbed.runs.driver", "--out", str(out.resolve()),
            "--model", str(model), "--model-meta", json.dumps(model_meta),
            "--engine-root", str(kept_root or work / "engines"), "--mode", mode] + (["--serve"] if serve else [])
    if kept_root is not None:
        argv.append("--keep-engines")
    if cluster_run_id:
        argv += ["--cluster-run-id", cluster_run_id]
    if calibrate_to is not None:
        argv += ["--calibrate", str(Path(calibrate_to).resolve())]
    elif calibration is not None:
        argv += ["--calibration", str(Path(calibration).resolve())]
    work.mkdir(parents=True, exist_ok=True)
    write_jobs(work / "jobs.pkl", jobs)
    return argv + ["--jobs", str(work / "jobs.pkl")]


def _drive(start: Callable[[], subprocess.Popen], serve: ExperimentSpec | None = None) -> int:
    """Start the driver and wait for it; Ctrl-C (and SIGTERM, which callers map to it) is passed
    on as SIGINT, so it closes its runs as interrupted, before the caller tears down. Serving,
    Ctrl-C is the normal end: the driver drains and closes the run as finished."""
    driver = None
    try:
        driver = start()
        rc = driver.wait()
    except KeyboardInterrupt:
        if driver is not None and driver.poll() is None:
            driver.send_signal(signal.SIGINT)
            try:
                # serving, the requests in flight end within their deadline and the abort's grace
                rc = driver.wait(timeout=120 + (serve.deadline_s + ABORT_GRACE_S if serve else 0))
            except subprocess.TimeoutExpired:
                driver.kill()
                rc = None
            if serve is not None and rc == 0:
                return 0
        raise
    if rc != 0:
        raise RuntimeError(f"testbed driver exited with status {rc} (see its messages above)")
    return 0


def _run_on_cluster(spec: ExperimentSpec, out: Path, jobs: Sequence[RunJob], calibrate_to: Path | None,
                    address: str, serve: bool = False, calibration: Path | None = None, keep_engines: bool = False) -> int:
    """The driver against a running Ray cluster: the same driver as on the emulated cluster, with
    pods found from the nodes' resources. An emulated cluster's head is reachable only from its
    namespace: the driver then runs there, with that cluster's token."""
    import tempfile

    # (netem for delay/loss is the nodes' kernels' business: their agents refuse it when missing)
    model, model_meta = prepare_model(spec)
    emulated = emulated_cluster_at(address)
    # On an emulated cluster, in its temp root: `testbed cluster down` removes it even when this
    # process was killed and its finally never ran.
    work = Path(tempfile.mkdtemp(prefix="testbed-run-", dir=emulated.temp_root if emulated else None))
    console.print(f"[bold]{spec.name}[/] on the Ray cluster at {address}"
                  + (f" (emulated run {emulated.run_id})" if emulated else "")
                  + f" -> {out / spec.name}")
    # Kept engines log where `testbed cluster down` (emulated) or the node's reboot (real) clears.
    kept_root = (Path(emulated.temp_root if emulated else tempfile.gettempdir()) / KEPT_ENGINES_DIR
                 if keep_engines else None)
    argv = _driver_argv(jobs, out, model, model_meta, work, "cluster", calibrate_to,
                        emulated.run_id if emulated else None, serve, calibration, kept_root)
    old_term = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops the runs like Ctrl-C
    try:
        if emulated is not None:
            with _host_ports(spec, emulated, serve):
                return _drive(lambda: emulated.popen_in_head(argv), spec if serve else None)
        return _drive(lambda: subprocess.Popen(argv, env={**os.environ, "RAY_ADDRESS": address}),
                      spec if serve else None)
    finally:
        signal.signal(signal.SIGTERM, old_term)
        shutil.rmtree(work, ignore_errors=True)
