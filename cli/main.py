"""The ``testbed`` command line.

    testbed twin [SPEC] [--out DIR] [--policies A,B] [--seeds 0,1] [--calibration FILE] [--isolated-calibration]
                 [--[no-]repeat] [--calibrations A,B,...] [--address ADDR] [--full]
    testbed run [SPEC] [--out DIR] [--policies A,B] [--seeds 0,1]
    testbed calibrate [SPEC] [--out FILE] [--isolated] [--times N] [--fit-runs DIR --calibration FILE] [--address ADDR]
    testbed study SPEC [--world sim|testbed|both] [--out DIR] [--sweeps A,B] [--repeat-seeds 0] [--rerun]
                       [--calibration FILE] [--plan]
    testbed sim [SPEC] [--out DIR] [--policies A,B] [--seeds 0,1] [--calibration FILE]
    testbed cluster up|down|status
    testbed faults clear
    testbed leftovers
    testbed doctor [SPEC] [--address ADDR]
    testbed report PATH... [--out DIR]
    testbed compare SIM_PATH TESTBED_PATH [--out DIR] [--calibration FILE] [--repeat TESTBED_PATH2]
                    [--calibration-sims SIM_PATH2...] [--full]
    testbed policies

Every command takes -v (what each step did; -vv debugging detail) and -q (errors only).
Errors are one line on stderr and exit status 2, a package of the testbed that is not installed
too (it names the extra that brings it); rows recorded before an error or Ctrl-C stay in their run
directories (marked ``interrupted``).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from typing import Any

from cli.cluster import cmd_cluster, cmd_faults, cmd_leftovers
from cli.common import console, experiment_parser
from cli.doctor import add_doctor_parser
from cli.report import cmd_compare, cmd_report
from cli.run import cmd_calibrate, cmd_run, cmd_twin
from cli.sim import cmd_sim
from cli.study import cmd_study
from core.util.logs import configure_logging, level_for
from core.policies import policy_names
from vocab import EMULATED_MODES, LAUNCHERS, MODE_AUTO, SIM, WORLDS

DIST = "pd-reliability-testbed"
# The testbed's packages, imported only by the commands that need them (`testbed sim` needs none):
# module -> (what it is, how to install it). pyproject.toml's extras declare them; NIXL's wheels
# come from install.sh alone (--no-deps: its meta package would pull CUDA 13 wheels on a CPU).
_TESTBED = f"pip install '{DIST}[testbed]' (./install.sh; on GPU nodes [gpu], ./install.sh --gpu)"
_NIXL = "./install.sh (NIXL with its cu12 wheel, pinned in constraints/cpu.txt; on GPU nodes ./install.sh --gpu)"
_GPU = f"pip install '{DIST}[gpu]' (./install.sh --gpu)"
EXTRA_MODULES: dict[str, tuple[str, str]] = {
    **{m: (m, _TESTBED) for m in ("pyroute2", "torch", "transformers", "tokenizers", "fastapi", "starlette",
                                  "uvicorn", "psutil")},
    "ray": ("Ray", _TESTBED), "vllm": ("vLLM", _TESTBED), "prometheus_client": ("prometheus-client", _TESTBED),
    "nixl": ("NIXL", _NIXL), "nixl_cu12": ("NIXL", _NIXL), "pynvml": ("nvidia-ml-py", _GPU),
}


def missing_extra(cmd: str, exc: ModuleNotFoundError) -> str | None:
    """The one line for a testbed package that is not installed, naming what installs it; None for
    any other module (a bug of ours, whose traceback is wanted)."""
    name = (exc.name or "").split(".")[0]
    if name not in EXTRA_MODULES:
        return None
    what, how = EXTRA_MODULES[name]
    return f"testbed {cmd}: the testbed needs {what} ({name} is not installed): {how}"


def cmd_policies(args: argparse.Namespace) -> int:
    print("\n".join(policy_names()))
    return 0


def _add_address(p: argparse.ArgumentParser, what: str) -> None:
    """--address of the commands that run the testbed's side: a Ray cluster, else $RAY_ADDRESS, else an
    emulated cluster brought up and down around the command."""
    p.add_argument("--address", default=os.environ.get("RAY_ADDRESS") or None,
                   help=f"a running Ray cluster (ray up cluster.yaml, or testbed cluster up): {what} (default: "
                        "$RAY_ADDRESS; without either, an emulated cluster is brought up and down)")
    _add_keep_engines(p)


def _add_keep_engines(p: argparse.ArgumentParser) -> None:
    p.add_argument("--keep-engines", action="store_true",
                   help="with --address: use the engines an earlier --keep-engines command left up on the cluster "
                        "where this spec makes the same ones (else stop them and start this spec's), and leave the "
                        "engines up at the end for the next one (testbed cluster stop-engines stops them; "
                        "docs/cluster.md \"Engines kept between commands\")")


def _add_full(p: argparse.ArgumentParser) -> None:
    """--full of the commands that end in the comparison (analysis/compare/compact.py)."""
    p.add_argument("--full", action="store_true",
                   help="print every table of the comparison (about 200 columns wide) instead of the verdict in "
                        "100 columns; the files written are the same either way")


def _testbed_commands(sub: Any) -> None:
    """`twin` and `run`: a spec on the real testbed (and, for twin, in the calibrated simulator too)."""
    tw = experiment_parser(sub, "twin", "one spec in both worlds: calibrate the testbed, run it, run the calibrated "
                            "simulator, compare", "the embedded testbed scenario", cmd_twin, out="runs/twin")
    tw.add_argument("--calibration", help="use this calibration instead of measuring one first")
    tw.add_argument("--isolated-calibration", action="store_true",
                    help="calibrate on the engines alone, without the calibration load that fits each stage's "
                         "level and the control path under the run's conditions (docs/twin.md)")
    tw.add_argument("--repeat", action=argparse.BooleanOptionalAction, default=None,
                    help="run every seed on the testbed a second time, on the same engines and workloads, and "
                         "judge each sim-to-testbed difference against the testbed's own run-to-run difference "
                         "(default: with several seeds; docs/twin.md \"Repeatability\")")
    _add_address(tw, "whose pods run the testbed's side; the records land where this command runs")
    tw.add_argument("--calibrations", metavar="A,B,...",
                    help="further calibrations of these engines (testbed calibrate --times N wrote them): the "
                         "simulator runs under each too, and its spread over them widens every check's interval "
                         "(docs/twin.md \"The simulator over several calibrations\")")
    _add_full(tw)
    ru = experiment_parser(sub, "run", "run an experiment spec on the real testbed (Ray + vLLM engines)",
                            "the embedded testbed scenario", cmd_run)
    _add_address(ru, "its pods are the nodes with a pod<i> resource")
    ru.add_argument("--serve", action="store_true",
                    help="instead of the spec's workload, serve outside clients through an OpenAI-compatible API "
                         "(testbed.ingress_host:ingress_port, default 127.0.0.1:8000) until Ctrl-C, the spec's "
                         "faults on their schedule; one policy and one seed")


def _calibrate_command(sub: Any) -> None:
    """`calibrate`: the testbed's engines and links measured and fitted."""
    ca = sub.add_parser("calibrate", help="measure the testbed's engines and links and fit the simulator's parameters")
    ca.add_argument("spec", nargs="?", help="experiment YAML whose topology and engines to measure "
                                            "(default: the embedded testbed scenario)")
    ca.add_argument("--out", help="the calibration file (default: runs/<scenario>/calibration.json)")
    ca.add_argument("--isolated", action="store_true",
                    help="the engines alone, without the calibration load (docs/twin.md \"A calibration under "
                         "the run's conditions\")")
    ca.add_argument("--fit-runs", metavar="DIR",
                    help="start no engines: fit the levels and the control path on the quiet requests of the "
                         "testbed runs in DIR, from the isolated calibration --calibration")
    ca.add_argument("--calibration", metavar="FILE", help="--fit-runs: the isolated calibration to start from")
    _add_address(ca, "whose engines to measure, each time")
    ca.add_argument("--times", type=int, default=1,
                    help="calibrate this many times, each on engines started anew, into FILE-1.json ... and "
                         "print each parameter's spread (FILE-spread.csv)")
    ca.set_defaults(fn=cmd_calibrate)


def _cluster_commands(sub: Any) -> None:
    """`cluster`, `faults` and `leftovers`: the cluster and what the project leaves on a machine."""
    c = sub.add_parser("cluster", help="bring an emulated cluster up or down, show a cluster, check a cluster file")
    c.add_argument("action", choices=["up", "down", "status", "check", "stop-engines"])
    c.add_argument("run_ids", nargs="*", help="down: these runs (default: every recorded run); check: the cluster "
                                              "file (default: cluster.yaml)")
    c.add_argument("--pods", type=int, default=2)
    c.add_argument("--mode", choices=EMULATED_MODES, default=MODE_AUTO)
    c.add_argument("--launcher", choices=LAUNCHERS,
                   help="up: through ray up on a generated cluster file (netns default) or each node started "
                        "directly")
    c.add_argument("--address", default=os.environ.get("RAY_ADDRESS") or None,
                   help="status: nodes, pods, GPUs and interfaces of this Ray cluster; stop-engines: the engines "
                        "--keep-engines commands left up on it (default: $RAY_ADDRESS)")
    c.add_argument("--interfaces", default="eth0",
                   help="status: the fault interfaces' allowlist to check on each pod (default: eth0)")
    c.set_defaults(fn=cmd_cluster)
    f = sub.add_parser("faults", help="remove every fault (shaping, ifb, cgroup, GPU clocks) the project set on "
                                      "this machine, or on every node of a Ray cluster")
    f.add_argument("action", choices=["clear"])
    f.add_argument("--address", default=os.environ.get("RAY_ADDRESS") or None,
                   help="every node of this Ray cluster, a task per node (default: $RAY_ADDRESS; without "
                        "either, this machine)")
    f.set_defaults(fn=cmd_faults)
    lo = sub.add_parser("leftovers", help="list anything the project left on this machine (namespaces, qdiscs, "
                                          "cgroups, processes, files); exit status 1 if there is any")
    lo.set_defaults(fn=cmd_leftovers)


def _study_command(sub: Any) -> None:
    """`study`: a spec's grid in one or both worlds, with a verdict per claim."""
    st = sub.add_parser("study", help="run a spec's study grid in the simulator (as Ray tasks), on the testbed, or "
                                      "in both with a verdict per claim; resumably")
    st.add_argument("spec", help="experiment YAML with a study: block (e.g. experiments/study.yaml; in both worlds: "
                                 "experiments/carryover.yaml)")
    st.add_argument("--world", choices=[*WORLDS, "both"], default=SIM,
                    help="sim: the grid in the simulator; testbed: on the real testbed, one set of engines; both: "
                         "the testbed, then the simulator calibrated on it, then the claims' verdicts "
                         "(docs/carryover.md \"Carrying a claim to the testbed\"; default sim)")
    st.add_argument("--out", default="runs", help="parent folder of the study directory (default: runs)")
    st.add_argument("--address", help="sim: a Ray cluster to run the cells on; testbed/both: the Ray cluster whose "
                                      "pods run the engines (default: a local Ray; an emulated cluster)")
    st.add_argument("--calibration", help="testbed/both: a calibration of these engines measured before, instead "
                                          "of measuring one first (STUDY/calibration.json); sim: the simulator's "
                                          "side of a carry-over study again under this calibration, its claims "
                                          "judged again on the testbed runs in STUDY/testbed (no engine starts)")
    _add_keep_engines(st)
    st.add_argument("--repeat-seeds", help="testbed/both: seeds whose runs the testbed runs twice, for its "
                                           "repeatability (default: the first seed; '' for none)")
    st.add_argument("--workers", type=int, help="local Ray: cells at once (default: every CPU)")
    st.add_argument("--rerun", action="store_true", help="run finished cells again")
    st.add_argument("--sweeps", help="comma-separated subset of the study's sweeps (default: all)")
    st.add_argument("--plan", action="store_true",
                    help="run nothing: print the seeds each claim needs for 80%% power, and the runs and wall time "
                         "of the spec's design and of the one the claims need (docs/carryover.md \"Sizing a study\"); "
                         "with --address, refused in one line where that cluster lacks the pods or GPUs its runs need")
    st.add_argument("--max-hours", type=float, default=24.0,
                    help="refuse a study whose runs are estimated to take longer here (default 24; core/spec/sizes.py)")
    st.set_defaults(fn=cmd_study)


def _analysis_commands(sub: Any) -> None:
    """`report`, `compare` and `policies`: reading runs and what the router knows."""
    r = sub.add_parser("report", help="metrics table and plots of run directories, or a study's figures")
    r.add_argument("paths", nargs="+", help="run directories, or folders holding them, or one study directory")
    r.add_argument("--out", help="where to write CSVs and plots (default: a report folder next to the first path; "
                                   "for a study directory, STUDY/report)")
    r.set_defaults(fn=cmd_report)
    cp = sub.add_parser("compare", help="does a simulated result carry over? sim vs testbed runs of one scenario")
    cp.add_argument("sim_path", metavar="SIM_PATH", help="a sim run directory, or a folder holding sim runs")
    cp.add_argument("testbed_path", metavar="TESTBED_PATH",
                    help="a testbed run directory, or a folder holding testbed runs")
    cp.add_argument("--out", metavar="DIR",
                    help="where to write CSVs and plots (default: a fidelity folder next to TESTBED_PATH)")
    cp.add_argument("--calibration", metavar="FILE",
                    help="the JSON `testbed calibrate` wrote; its noise entries are shown")
    cp.add_argument("--repeat", metavar="TESTBED_PATH2",
                    help="a second set of testbed runs of the same scenario, policies and seeds: each verdict then "
                         "says whether the sim's difference is within the testbed's own run-to-run difference "
                         "(docs/twin.md \"Repeatability\")")
    cp.add_argument("--calibration-sims", metavar="SIM_PATH2", nargs="+", default=(),
                    help="the same policies and seeds simulated under other calibrations, one folder each: the "
                         "simulator's spread over them widens every check's interval")
    _add_full(cp)
    cp.set_defaults(fn=cmd_compare)
    p = sub.add_parser("policies", help="list the known policies")
    p.set_defaults(fn=cmd_policies)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="testbed", description="Reliability-aware routing for PD-disaggregated LLM serving")
    sub = ap.add_subparsers(dest="cmd", required=True)
    _testbed_commands(sub)
    _calibrate_command(sub)
    _cluster_commands(sub)
    add_doctor_parser(sub)
    sm = experiment_parser(sub, "sim", "run an experiment spec in the simulator", "the embedded default scenario",
                            cmd_sim)
    sm.add_argument("--calibration", help="a file `testbed calibrate` wrote: simulate the calibrated testbed")
    _study_command(sub)
    _analysis_commands(sub)
    for p in (ap, *sub.choices.values()):  # before the command or after it: testbed -v sim, testbed sim -v
        default = 0 if p is ap else argparse.SUPPRESS
        p.add_argument("-v", "--verbose", action="count", default=default,
                       help="say more: -v what each step did, -vv debugging detail")
        p.add_argument("-q", "--quiet", action="count", default=default, help="errors only")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(level_for(args.verbose, args.quiet))
    console.quiet = args.quiet > 0  # -q: no progress or status on stderr, only errors (printed apart)
    # SIGTERM (a scheduler's stop, a CI timeout, kill) ends a command as Ctrl-C does: its runs closed
    # as interrupted, their rows kept, rather than left "running"
    main_thread = threading.current_thread() is threading.main_thread()  # only it may set a handler
    old_term = signal.signal(signal.SIGTERM, signal.default_int_handler) if main_thread else None
    try:
        return args.fn(args)
    except KeyboardInterrupt:
        console.print("interrupted: rows recorded so far are kept; run directories are marked interrupted")
        return 130
    except ModuleNotFoundError as e:
        line = missing_extra(args.cmd, e)
        if line is None:
            raise
        print(line, file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError, OSError, RuntimeError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        print(f"testbed: error: {msg}", file=sys.stderr)
        return 2
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, old_term)
