"""The ``testbed`` command line.

    testbed twin [SPEC] [--out DIR] [--policies A,B] [--seeds 0,1] [--calibration FILE]
    testbed run [SPEC] [--out DIR] [--policies A,B] [--seeds 0,1]
    testbed calibrate [SPEC] [--out FILE]
    testbed sim [SPEC] [--out DIR] [--policies A,B] [--seeds 0,1] [--calibration FILE]
    testbed cluster up|down|status
    testbed faults clear
    testbed leftovers
    testbed report PATH... [--out DIR]
    testbed compare SIM_PATH TESTBED_PATH [--out DIR] [--calibration FILE]
    testbed policies

Errors are one line on stderr and exit status 2; rows recorded before an
error or Ctrl-C stay in their run directories (marked ``interrupted``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from core.policies import POLICY_NAMES, check_policy_name

console = Console(stderr=True)


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _selection(args: argparse.Namespace, spec) -> tuple[list[str], list[int]]:
    """The spec's policies and seeds, or the subsets asked for on the command line."""
    policies = [check_policy_name(p) for p in _csv(args.policies)] if args.policies else [p.name for p in spec.policies]
    try:
        seeds = [int(s) for s in _csv(args.seeds)] if args.seeds else spec.seeds
    except ValueError:
        raise ValueError(f"--seeds: expected comma-separated integers, got {args.seeds!r}") from None
    return policies, seeds


def _check_sizes(spec: Any, world: str, runs: int, args: argparse.Namespace) -> None:
    """Refuse, before anything is built, what cannot fit this machine or the time allowed."""
    from core.sizes import check_fits

    check_fits(spec, world, runs, max_hours=args.max_hours)


def _cmd_run(args: argparse.Namespace) -> int:
    from .runtime.launch import run_testbed
    from core.spec import load_spec

    spec = load_spec(args.spec, default="testbed.yaml")
    policies, seeds = _selection(args, spec)
    if args.serve and (len(policies), len(seeds)) != (1, 1):
        raise ValueError(f"--serve: one router serves, so one policy and one seed (got {len(policies)} policies "
                         f"and {len(seeds)} seeds; choose with --policies and --seeds)")
    _check_sizes(spec, "testbed", len(policies) * len(seeds), args)
    run_testbed(spec, Path(args.out), policies, seeds, address=args.address, serve=args.serve)
    console.print(f"report: testbed report {Path(args.out) / spec.name}")
    return 0


# Set in a command re-run inside an emulated cluster's head namespace (see _in_cluster).
_IN_HEAD_ENV = "TESTBED_IN_CLUSTER_HEAD"


def _in_cluster(address: str, argv: list[str]) -> int | None:
    """Connect to the Ray cluster at ``address``. An emulated cluster's head is reachable only from
    its own namespace: there this command runs again (its exit status returned); else None, and Ray
    is connected here."""
    import ray

    from .runtime.launch import emulated_cluster_at

    if not os.environ.get(_IN_HEAD_ENV) and (c := emulated_cluster_at(address)) is not None:
        return c.run_in_head([sys.executable, "-m", "testbed.cli", *argv], env={_IN_HEAD_ENV: "1"}).returncode
    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    return None


def _cmd_cluster(args: argparse.Namespace) -> int:
    from .runtime import emulated

    if args.action == "check":
        from .clusterfile import main as clusterfile_main

        return clusterfile_main(["check", *(args.run_ids[:1] or ["cluster.yaml"])])
    if args.action == "status" and args.address:
        rc = _in_cluster(args.address, ["cluster", "status", "--address", args.address, "--interfaces", args.interfaces])
        if rc is not None:
            return rc
        from .runtime.nodes import cluster_status, render

        render(cluster_status(_csv(args.interfaces)), _out_console())  # the command's output: stdout
        return 0
    if args.action == "up":
        c = emulated.EmulatedCluster(args.pods, mode=args.mode, launcher=args.launcher)
        info = c.up()
        print(f"run {info.run_id} ({info.mode}): head {c.address}; "
              + ", ".join(f"{n.name}={n.address}" for n in info.nodes))
        env = " ".join(f"{k}={v}" for k, v in {"RAY_ADDRESS": c.address, **c.auth_env}.items())
        print(f"drivers: {env} ip netns exec {c.fabric.head.netns} python ..."
              if c.mode == "netns" else f"drivers: {env} python ...")
        print(f"stop: testbed cluster down {info.run_id}")
    elif args.action == "down":
        done = [emulated.EmulatedCluster.attach(None, r).down() or r for r in args.run_ids] if args.run_ids \
            else emulated.down_all()
        print(f"down: {', '.join(done) if done else 'nothing was up'}")
    else:
        state_dir = emulated.default_state_dir()
        runs = sorted(p.stem for p in state_dir.glob("*.json")) if state_dir.exists() else []
        if not runs:
            print("no emulated cluster recorded")
        for r in runs:
            st = emulated.EmulatedCluster.attach(None, r).status()
            print(f"run {r} ({st.mode}): {'up' if st.up else 'DOWN/partial'}, {len(st.pids)} processes, "
                  f"{len(st.namespaces)} namespaces, {st.pss_bytes / 2**30:.2f} GiB")
    return 0


def _cmd_leftovers(args: argparse.Namespace) -> int:
    from .runtime.leftovers import find_leftovers

    found = find_leftovers()
    for item in found:
        print(item.line())
    if not found:
        print("nothing of the project's is left on this machine")
    return 1 if found else 0


def _cmd_faults(args: argparse.Namespace) -> int:
    if args.address:
        rc = _in_cluster(args.address, ["faults", "clear", "--address", args.address])
        if rc is not None:
            return rc
        from .runtime.nodes import clear_cluster_faults

        failed = 0
        for r in clear_cluster_faults():
            if r.ok:
                print(f"{r.ip}: " + (f"cleared {', '.join(r.value)}" if r.value else "nothing to clear"))
            else:
                failed += 1
                print(f"{r.ip}: FAILED: {r.error}")
        return 1 if failed else 0
    from .runtime.fault_agents import clear_host_faults

    removed = clear_host_faults()
    print(f"cleared: {', '.join(removed)}" if removed else "no fault of the project was set on this machine")
    return 0


def _cmd_sim(args: argparse.Namespace) -> int:
    from core.calibration import load_calibration
    from core.spec import load_spec

    spec = load_spec(args.spec)
    policies, seeds = _selection(args, spec)
    _check_sizes(spec, "sim", len(policies) * len(seeds), args)
    cal = load_calibration(args.calibration) if args.calibration else None
    _simulate(spec, policies, seeds, Path(args.out), Path(args.spec).resolve().parent if args.spec else None, cal)
    console.print(f"report: testbed report {Path(args.out) / spec.name}")
    return 0


def _simulate(spec: Any, policies: list[str], seeds: list[int], out: Path, base_dir: Path | None, cal: Any) -> None:
    """Every (policy, seed) in the simulator; with a calibration, as the calibrated testbed."""
    from core.calibration import apply_calibration
    from simulator.run import run_sim

    if cal is not None:
        spec = apply_calibration(spec, cal)
    trace = None
    if spec.workload.arrival.kind == "trace":
        # read once, before anything is printed or written: a bad file is one line, and every
        # run replays the same requests (a trace takes no randomness)
        from core.experiment import seed_streams
        from workloads.generate import generate

        trace = generate(spec.workload, seed_streams(seeds[0])["workload"], base_dir=base_dir)
    runs = [(p, s) for p in policies for s in seeds]
    console.print(f"[bold]{spec.name}[/]: {spec.topology.pods} pods x {spec.topology.workers_per_pod} workers"
                  f"{' (calibrated)' if cal is not None else ''}, "
                  f"{len(policies)} policies x {len(seeds)} seeds -> {out / spec.name}")
    with Progress(TextColumn("{task.description:<28}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console) as prog:
        overall = prog.add_task("all runs", total=len(runs))
        for policy, seed in runs:
            task = prog.add_task(f"{policy} seed {seed}", total=1.0)
            run_dir = run_sim(spec, policy, seed, out, workload=trace, base_dir=base_dir,
                              progress=lambda f, task=task: prog.update(task, completed=f))
            prog.update(task, completed=1.0, visible=False)
            prog.advance(overall)
            prog.console.print(f"  {policy:<16} seed {seed}: {run_dir}")


def _cmd_study(args: argparse.Namespace) -> int:
    from core.spec import load_spec
    from testbed.study import run_study

    spec = load_spec(args.spec)
    if args.workers is not None and args.workers < 1:
        raise ValueError(f"--workers must be at least 1, got {args.workers}")
    try:
        res = run_study(spec, Path(args.out), address=args.address, workers=args.workers, rerun=args.rerun,
                        sweeps=_csv(args.sweeps) if args.sweeps else None, base_dir=Path(args.spec).resolve().parent,
                        source=args.spec, console=console, max_hours=args.max_hours)
    except KeyboardInterrupt:
        done = sum(1 for _ in (Path(args.out) / spec.name).rglob("cell.json"))
        console.print(f"interrupted: the {done} finished run(s) are kept; the same command runs the rest")
        return 130
    console.print(f"{res.ran} run(s) done in {res.wall_s:.0f} s ({res.cpu_s:.0f} CPU-s), {res.skipped} were "
                  f"already finished, {len(res.failed)} failed; {res.cells} cells in {res.runs} runs")
    if res.failed:
        console.print("[red]failed cells[/] (rerun the same command to retry them):\n  " + "\n  ".join(res.failed))
        return 1
    console.print(f"report: testbed report {res.study_dir}")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from analysis.report import report
    from analysis.study import is_study
    from analysis.study_report import study_report

    paths = [Path(p) for p in args.paths]
    out = Path(args.out) if args.out else None
    studies = [p for p in paths if is_study(p)]
    if studies:
        if len(paths) > 1:  # a study's figures compare its own cells; mixing in other runs has no meaning
            raise ValueError(f"report: {studies[0]} is a study directory (study.json); report it on its own")
        study_report(paths[0], out, _out_console())
        return 0
    report(paths, out, _out_console())
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    from analysis.fidelity import compare
    from core.calibration import load_calibration

    cal = load_calibration(args.calibration).model_dump() if args.calibration else None  # before any run is read
    compare([Path(args.sim_path)], [Path(args.testbed_path)], Path(args.out) if args.out else None, cal, _out_console())
    return 0


def _out_console() -> Console:
    # a wide table stays readable when written to a file or a CI log
    return Console() if sys.stdout.isatty() else Console(width=200)


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from .runtime.launch import run_testbed
    from core.spec import load_spec

    spec = load_spec(args.spec, default="testbed.yaml")
    out = Path(args.out) if args.out else Path("runs") / spec.name / "calibration.json"
    run_testbed(spec, out.parent, [], [], calibrate_to=out)
    console.print(f"calibration: {out}  (use: testbed sim SPEC --calibration {out})")
    return 0


def _cmd_twin(args: argparse.Namespace) -> int:
    """One spec in both worlds: the testbed (calibrated on its own engines first, unless a
    calibration is given), then the simulator with that calibration, then the comparison."""
    from analysis.fidelity import compare
    from analysis.report import report
    from core.calibration import load_calibration
    from core.spec import load_spec
    from .runtime.launch import run_testbed

    spec = load_spec(args.spec, default="testbed.yaml")
    policies, seeds = _selection(args, spec)
    out = Path(args.out)
    cal_path = Path(args.calibration) if args.calibration else out / "calibration.json"
    if args.calibration:
        load_calibration(cal_path)  # a bad file is refused before minutes of engine start-up
    for world in ("testbed", "sim"):
        _check_sizes(spec, world, len(policies) * len(seeds), args)
    run_testbed(spec, out / "testbed", policies, seeds, calibrate_to=None if args.calibration else cal_path)
    cal = load_calibration(cal_path)
    _simulate(spec, policies, seeds, out / "sim", Path(args.spec).resolve().parent if args.spec else None, cal)
    out_console = _out_console()
    report([out / "testbed" / spec.name, out / "sim" / spec.name], out / "report", out_console)
    compare([out / "sim" / spec.name], [out / "testbed" / spec.name], out / "fidelity", cal.model_dump(), out_console)
    return 0


def _cmd_policies(args: argparse.Namespace) -> int:
    print("\n".join(POLICY_NAMES))
    return 0


def _experiment_parser(sub: Any, name: str, help: str, default: str, fn: Any, out: str = "runs") -> Any:
    """`run`, `sim` and `twin` take the same arguments: a spec and subsets of its policies and seeds."""
    p = sub.add_parser(name, help=help)
    p.add_argument("spec", nargs="?", help=f"experiment YAML (default: {default})")
    p.add_argument("--out", default=out, help=f"parent folder of the run directories (default: {out})")
    p.add_argument("--policies", help="comma-separated subset of the spec's policies")
    p.add_argument("--seeds", help="comma-separated seeds (default: the spec's)")
    p.add_argument("--max-hours", type=float, default=24.0,
                   help="refuse a spec whose runs are estimated to take longer (default 24; core/sizes.py)")
    p.set_defaults(fn=fn)
    return p


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="testbed", description="Reliability-aware routing for PD-disaggregated LLM serving")
    sub = ap.add_subparsers(dest="cmd", required=True)
    tw = _experiment_parser(sub, "twin", "one spec in both worlds: calibrate the testbed, run it, run the calibrated "
                            "simulator, compare", "the embedded testbed scenario", _cmd_twin, out="runs/twin")
    tw.add_argument("--calibration", help="use this calibration instead of measuring one first")
    ru = _experiment_parser(sub, "run", "run an experiment spec on the real testbed (Ray + vLLM engines)",
                            "the embedded testbed scenario", _cmd_run)
    ru.add_argument("--address", default=os.environ.get("RAY_ADDRESS") or None,
                    help="a running Ray cluster (ray up cluster.yaml, or testbed cluster up): its pods are the "
                         "nodes with a pod<i> resource (default: $RAY_ADDRESS; without either, an emulated "
                         "cluster is brought up for the run and down after)")
    ru.add_argument("--serve", action="store_true",
                    help="instead of the spec's workload, serve outside clients through an OpenAI-compatible API "
                         "(testbed.ingress_host:ingress_port, default 127.0.0.1:8000) until Ctrl-C, the spec's "
                         "faults on their schedule; one policy and one seed")
    ca = sub.add_parser("calibrate", help="measure the testbed's engines and links and fit the simulator's parameters")
    ca.add_argument("spec", nargs="?", help="experiment YAML whose topology and engines to measure "
                                            "(default: the embedded testbed scenario)")
    ca.add_argument("--out", help="the calibration file (default: runs/<scenario>/calibration.json)")
    ca.set_defaults(fn=_cmd_calibrate)
    c = sub.add_parser("cluster", help="bring an emulated cluster up or down, show a cluster, check a cluster file")
    c.add_argument("action", choices=["up", "down", "status", "check"])
    c.add_argument("run_ids", nargs="*", help="down: these runs (default: every recorded run); check: the cluster "
                                              "file (default: cluster.yaml)")
    c.add_argument("--pods", type=int, default=2)
    c.add_argument("--mode", choices=["auto", "netns", "local"], default="auto")
    c.add_argument("--launcher", choices=["ray_up", "direct"],
                   help="up: through ray up on a generated cluster file (netns default) or each node started "
                        "directly")
    c.add_argument("--address", default=os.environ.get("RAY_ADDRESS") or None,
                   help="status: nodes, pods, GPUs and interfaces of this Ray cluster (default: $RAY_ADDRESS)")
    c.add_argument("--interfaces", default="eth0",
                   help="status: the fault interfaces' allowlist to check on each pod (default: eth0)")
    c.set_defaults(fn=_cmd_cluster)
    f = sub.add_parser("faults", help="remove every fault (shaping, ifb, cgroup, GPU clocks) the project set on "
                                      "this machine, or on every node of a Ray cluster")
    f.add_argument("action", choices=["clear"])
    f.add_argument("--address", default=os.environ.get("RAY_ADDRESS") or None,
                   help="every node of this Ray cluster, a task per node (default: $RAY_ADDRESS; without "
                        "either, this machine)")
    f.set_defaults(fn=_cmd_faults)
    lo = sub.add_parser("leftovers", help="list anything the project left on this machine (namespaces, qdiscs, "
                                          "cgroups, processes, files); exit status 1 if there is any")
    lo.set_defaults(fn=_cmd_leftovers)
    sm = _experiment_parser(sub, "sim", "run an experiment spec in the simulator", "the embedded default scenario",
                            _cmd_sim)
    sm.add_argument("--calibration", help="a file `testbed calibrate` wrote: simulate the calibrated testbed")
    st = sub.add_parser("study", help="run a spec's study grid in the simulator, as Ray tasks, resumably")
    st.add_argument("spec", help="experiment YAML with a study: block (e.g. experiments/study.yaml)")
    st.add_argument("--out", default="runs", help="parent folder of the study directory (default: runs)")
    st.add_argument("--address", help="a Ray cluster's address (default: a local Ray on this machine)")
    st.add_argument("--workers", type=int, help="local Ray: cells at once (default: every CPU)")
    st.add_argument("--rerun", action="store_true", help="run finished cells again")
    st.add_argument("--sweeps", help="comma-separated subset of the study's sweeps (default: all)")
    st.add_argument("--max-hours", type=float, default=24.0,
                    help="refuse a study whose runs are estimated to take longer here (default 24; core/sizes.py)")
    st.set_defaults(fn=_cmd_study)
    r = sub.add_parser("report", help="metrics table and plots of run directories, or a study's figures")
    r.add_argument("paths", nargs="+", help="run directories, or folders holding them, or one study directory")
    r.add_argument("--out", help="where to write CSVs and plots (default: a report folder next to the first path; "
                                   "for a study directory, STUDY/report)")
    r.set_defaults(fn=_cmd_report)
    cp = sub.add_parser("compare", help="does a simulated result carry over? sim vs testbed runs of one scenario")
    cp.add_argument("sim_path", metavar="SIM_PATH", help="a sim run directory, or a folder holding sim runs")
    cp.add_argument("testbed_path", metavar="TESTBED_PATH",
                    help="a testbed run directory, or a folder holding testbed runs")
    cp.add_argument("--out", metavar="DIR",
                    help="where to write CSVs and plots (default: a fidelity folder next to TESTBED_PATH)")
    cp.add_argument("--calibration", metavar="FILE",
                    help="the JSON `testbed calibrate` wrote; its noise entries are shown")
    cp.set_defaults(fn=_cmd_compare)
    p = sub.add_parser("policies", help="list the known policies")
    p.set_defaults(fn=_cmd_policies)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except KeyboardInterrupt:
        console.print("interrupted: rows recorded so far are kept; run directories are marked interrupted")
        return 130
    except (ValueError, FileNotFoundError, OSError, RuntimeError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        print(f"testbed: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
