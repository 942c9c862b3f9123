"""Do the tests that read time or rates hold beside a CPU hog? (not a test: prints each run's result)

    python tools/under_load.py [--runs 5] [--hogs 2] [-- extra pytest arguments]

Runs the load-sensitive tests (:data:`MODULES`, without the slow end-to-end ones) ``--runs`` times in
one process each, as the suite runs them alone (``-n0``), with ``--hogs`` busy loops at normal priority
beside them (one per core by default: each test then gets about half a core where it asked for one).
Their timings are judged against a baseline measured in the same test or on kernel counters, so they
must pass beside the hogs as on a quiet machine (docs/performance.md "The test suite's time", "Under
load"). Prints, per run, its wall time and the failed tests; exit status 1 when any run failed.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# The tests that read time, rates or CPU shares: link shaping, the compute quota, host statistics,
# lost wake-ups, stages and limits, engine death, retries, the ingress, the clean child, nodes, the
# study, the command line, the kept engines, the fault agents' time to live, the troubleshooting
# page's stopped run, the fault agent's probe sampler.
MODULES = ("test_faults_shaping.py", "test_faults_compute.py", "test_hoststats.py", "test_shm_wakeups.py",
           "test_stages.py", "test_engine_death.py", "test_retry.py", "test_ingress.py", "test_clean_process.py",
           "test_runtime_nodes.py", "test_study.py", "test_cli.py", "test_kept_engines.py", "test_runtime_faults.py",
           "test_troubleshooting.py", "test_drain_rate.py")


def hog() -> subprocess.Popen:
    """A busy loop at normal priority (its own process group, killed with it)."""
    return subprocess.Popen(["bash", "-c", "while :; do :; done"], start_new_session=True)


def one_run(extra: list[str], log: Path | None) -> tuple[bool, float, list[str], str]:
    """The modules once: (passed, wall seconds, failed test ids, pytest's last line); pytest's
    output to ``log`` where given."""
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n0", "-m", "not slow",
            *(str(REPO / "tests" / m) for m in MODULES), *extra]
    t0 = time.monotonic()
    res = subprocess.run(argv, cwd=REPO, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if log is not None:
        log.write_text(res.stdout + res.stderr)
    lines = res.stdout.strip().splitlines()
    failed = [m.group(1) for line in lines if (m := re.match(r"(?:FAILED|ERROR) (\S+)", line))]
    return res.returncode == 0, wall, failed, lines[-1] if lines else res.stderr.strip()[-300:]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--hogs", type=int, default=os.cpu_count() or 1, help="busy loops beside the tests")
    ap.add_argument("--logs", type=Path, help="a folder for each run's pytest output (run-N.log)")
    args, extra = ap.parse_known_args()
    extra = [a for a in extra if a != "--"]
    if args.logs is not None:
        args.logs.mkdir(parents=True, exist_ok=True)
    hogs = [hog() for _ in range(args.hogs)]
    passed = 0
    try:
        for i in range(1, args.runs + 1):
            ok, wall, failed, last = one_run(extra, args.logs / f"run-{i}.log" if args.logs else None)
            passed += ok
            print(f"run {i} of {args.runs}: {'passed' if ok else 'FAILED'} in {wall:.0f} s ({last})", flush=True)
            for test in failed:
                print(f"  {test}", flush=True)
    finally:
        for h in hogs:
            os.killpg(h.pid, 9)
            h.wait()
    print(f"{passed} of {args.runs} runs passed beside {args.hogs} busy loop(s)")
    return 0 if passed == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
