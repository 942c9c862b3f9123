"""Sizes are checked before anything is built: a spec that cannot fit is refused with the reason."""

import subprocess
import sys
import time

import pytest

from core.spec.sizes import SizeError, check_fits, check_study_fits, expected_requests, footprint
from builders import parse, shipped_spec_dict

GiB = 2**30


def _spec(**over):
    return parse(shipped_spec_dict(**over))  # 32 x 32, 246 req/s for 240 s


def test_the_shipped_scenario_fits_and_its_estimate_is_what_was_measured():
    spec = _spec()
    fp = check_fits(spec, "sim", 9, memory_bytes=16 * GiB)
    assert fp.workers == 1024 and fp.requests == pytest.approx(246 * 240)
    # bench_sim.py measures 0.20-0.22 GiB peak at 1024 workers; 3-4 s of CPU for ~59,000 requests
    assert 0.15 * GiB < fp.memory_bytes < 0.3 * GiB
    assert 1.0 < fp.seconds < 10.0


def test_a_billion_pods_is_refused_at_once_with_the_reason():
    spec = _spec(topology={"pods": 10**9})
    t0 = time.perf_counter()
    with pytest.raises(SizeError) as e:
        check_fits(spec, "sim", memory_bytes=16 * GiB)
    assert time.perf_counter() - t0 < 1.0
    msg = str(e.value)
    assert "\n" not in msg and "1,000,000,000 pods x 32 workers" in msg and "16.0 GiB available" in msg
    assert "TiB of memory" in msg


def test_a_run_past_the_time_allowed_is_refused_and_more_hours_let_it_pass():
    # 10^10 requests: days of CPU even with memory to spare
    spec = _spec(workload={"duration_s": 10**5, "arrival": {"kind": "poisson", "rate_rps": 10**5}})
    with pytest.raises(SizeError, match=r"too long to run in the simulator .* 1 run\(s\) need about [\d,.]+ h of CPU "
                                         r"time, over the 24 h allowed \(--max-hours"):
        check_fits(spec, "sim", memory_bytes=1e15)
    check_fits(spec, "sim", memory_bytes=1e15, max_hours=1e6)
    # the testbed's runs take wall time: the workload's span and the last deadline
    assert footprint(spec, "testbed").seconds == pytest.approx(10**5 + spec.deadline_s)
    with pytest.raises(SizeError, match="wall time"):
        check_fits(spec, "testbed", runs=2, memory_bytes=1e15)


def test_a_risk_window_of_too_many_buckets_is_refused():
    spec = _spec(router={"history_window_s": 1e6, "history_bucket_s": 1e-3})
    with pytest.raises(SizeError, match="of memory"):
        check_fits(spec, "sim", memory_bytes=16 * GiB)


def test_requests_come_from_rate_and_duration_or_the_cap_and_a_trace_is_its_cap():
    assert expected_requests(_spec(workload={"max_requests": 1000})) == 1000
    trace = {"arrival": {"kind": "trace", "path": "t.csv"}, "duration_s": None, "max_requests": None}
    assert expected_requests(_spec(workload=trace)) is None  # bounded by the file, read later
    assert expected_requests(_spec(workload={**trace, "max_requests": 50})) == 50


def test_a_study_counts_its_cells_at_once_and_in_total():
    specs = [_spec()] * 100  # about 3.5 CPU-s each
    check_study_fits(specs, parallel=2, memory_bytes=16 * GiB)
    with pytest.raises(SizeError, match=r"too large to run 2 cells at once.*--workers fewer"):
        check_study_fits(specs, parallel=2, memory_bytes=0.35 * GiB)
    with pytest.raises(SizeError, match=r"its 100 runs need about .* on 2 workers, over the 0.01 h allowed"):
        check_study_fits(specs, parallel=2, memory_bytes=16 * GiB, max_hours=0.01)


def test_the_cli_refuses_a_billion_pods_before_writing_anything(tmp_path):
    spec = tmp_path / "big.yaml"
    spec.write_text("name: big\ntopology: {pods: 1000000000, workers_per_pod: 32}\nworkload:\n"
                    "  arrival: {kind: poisson, rate_rps: 10}\n  profile: chat\n  duration_s: 10\npolicies: [LC]\n")
    for cmd in ("sim", "run", "twin"):
        t0 = time.perf_counter()
        res = subprocess.run([sys.executable, "-m", "cli", cmd, str(spec), "--out", str(tmp_path / "runs")],
                             capture_output=True, text=True, timeout=60)
        assert time.perf_counter() - t0 < 30  # the import of the CLI, not the topology
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 2 and len(lines) == 1, res.stderr
        assert "too large to run" in lines[0] and "1,000,000,000 pods" in lines[0], lines
    assert not (tmp_path / "runs").exists()
