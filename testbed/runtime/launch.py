"""`testbed run`: model, emulated cluster, driver in the head's namespace, teardown.

Runs in the user's (root) namespace. Whatever happens (an error, Ctrl-C,
SIGTERM) the cluster comes down: every Ray and vLLM process of the run, its
namespaces and its temp folder.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

from rich.console import Console

from testbed.runtime.injection.cpu import clear_project_cgroups
from faults.schedule import FaultSchedule
from testbed.runtime.injection.shaping import netem_missing

from core.spec import ExperimentSpec
from .netns import missing_privileges

console = Console(stderr=True)


def model_cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "testbed" / "models" / "tiny-llama"


def prepare_model(spec: ExperimentSpec) -> tuple[Path, dict[str, int]]:
    """The model directory (the tiny model is built once and cached) and what the router needs of it."""
    from .model import build_tiny_model, kv_bytes_per_token

    if spec.testbed.model is None:
        path = build_tiny_model(model_cache_dir())
    else:
        path = Path(spec.testbed.model).expanduser()
        if not (path / "config.json").is_file():
            raise ValueError(f"testbed.model: {path} is not a model directory (no config.json)")
    cfg = json.loads((path / "config.json").read_text())
    return path, {"vocab": int(cfg["vocab_size"]), "kv_bytes_per_token": kv_bytes_per_token(path)}


Job = tuple[ExperimentSpec, list[str], list[int]]


def check_faults(jobs: Sequence[Job]) -> None:
    """Faults the testbed cannot apply are refused before anything starts."""
    if not any(s.faults for s, _, _ in jobs):
        return
    t = jobs[0][0].testbed
    if t.mode == "local" or (t.mode == "auto" and missing_privileges() is not None):
        raise ValueError("faults need the netns mode (root, network namespaces): local mode has no links to shape")
    for s, _, _ in jobs:
        try:
            FaultSchedule(s.faults, s.testbed.pods)  # pods of the testbed, not of the simulated topology
        except ValueError as e:
            raise ValueError(f"{s.name}: {e} (testbed.pods is {s.testbed.pods})") from None
        for i, f in enumerate(s.faults):
            if f.kind == "link" and (f.delay_ms > 0 or f.loss > 0) and (why := netem_missing()):
                raise ValueError(f"{s.name}: faults[{i}]: {why}")


def run_testbed(spec: ExperimentSpec, out: Path, policies: list[str], seeds: list[int],
                more: Sequence[Job] = ()) -> int:
    """Run ``policies`` x ``seeds`` of ``spec`` (then the ``more`` jobs, on the same engines)."""
    from .emulated import EmulatedCluster

    jobs = [(spec, policies, seeds), *more]
    for other, _, _ in more:
        if other.testbed != spec.testbed:
            raise ValueError(f"{other.name}: jobs sharing engines need the same testbed block as {spec.name}")
    # Refuse a workload the engines cannot serve before spending minutes starting them.
    from workloads.generate import generate

    from core.experiment import seed_streams
    from .driver import check_workload

    for s, _, sds in jobs:
        for seed in sds:
            check_workload(generate(s.workload, seed_streams(seed)["workload"]), s)
    check_faults(jobs)
    t0 = time.monotonic()
    model, model_meta = prepare_model(spec)
    cluster = EmulatedCluster(spec.testbed.pods, mode=spec.testbed.mode, subnet=spec.testbed.subnet)
    console.print(f"[bold]{spec.name}[/] on the testbed: {spec.testbed.pods} pods x (1 prefill + 1 decode) vLLM engines, "
                  f"{cluster.mode} mode, {len(policies)} policies x {len(seeds)} seeds -> {out / spec.name}")
    driver = None
    old_term = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM tears down like Ctrl-C
    try:
        cluster.up()
        console.print(f"cluster up in {time.monotonic() - t0:.0f} s (run {cluster.run_id}, head {cluster.address})")
        argv = [sys.executable, "-m", "testbed.runtime.driver", "--out", str(out.resolve()),
                "--model", str(model), "--model-meta", json.dumps(model_meta),
                "--engine-root", str(cluster.temp_root / "engines"), "--mode", cluster.mode,
                "--cluster-run-id", cluster.run_id]
        for i, (s, pols, sds) in enumerate(jobs):
            spec_file = cluster.temp_root / f"spec-{i}.json"
            spec_file.write_text(json.dumps(s.model_dump(mode="json")))
            argv += ["--job", f"{spec_file}:{','.join(pols)}:{','.join(map(str, sds))}"]
        driver = cluster.popen_in_head(argv)
        rc = driver.wait()
        if rc != 0:
            raise RuntimeError(f"testbed driver exited with status {rc} (see its messages above)")
        return 0
    except KeyboardInterrupt:
        if driver is not None and driver.poll() is None:
            driver.send_signal(signal.SIGINT)  # it closes its runs as interrupted
            try:
                driver.wait(timeout=120)
            except subprocess.TimeoutExpired:
                driver.kill()
        raise
    finally:
        signal.signal(signal.SIGTERM, old_term)
        t1 = time.monotonic()
        cluster.down()  # the run's namespaces go, and with them every qdisc and ifb in them
        # cgroups outlive their processes: drop the project's that the run's agents left empty
        left = clear_project_cgroups(only_empty=True)
        console.print(f"cluster down in {time.monotonic() - t1:.0f} s" + (f"; removed {len(left)} empty fault cgroups" if left else ""))
