"""One cell of a study in both worlds on the shared cluster (tests/e2e_cluster.py `_study_cell`):
`testbed study --world both` runs it on real engines and again (repeatability), in the calibrated
simulator, and gives the claim's verdict; the same command then finds it finished. Slow."""

import json

import pandas as pd
import pytest

pytest.importorskip("vllm", reason="vLLM's CPU build is not installed (the README's install command installs it)")
pytest.importorskip("ray", reason="Ray is not installed (the README's install command installs it)")

from analysis.rule.verdict import ONE_SEED, RULE_VERSION  # noqa: E402
from core.records import read_meta, read_table  # noqa: E402
from e2e_cluster import STUDY_SPEC  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.e2e]  # the shared cluster (tests/e2e_cluster.py)

RUN_DIR = "cells/severe__severity-0.008/LC/seed-0"


def test_a_study_cell_runs_on_the_testbed_twice_and_in_the_simulator_and_gets_its_verdict(testbed_runs):
    out, _, _, _, cli = testbed_runs
    res = cli["study"]
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-2000:]
    root = out / "study" / STUDY_SPEC
    for world in ("testbed", "repeat", "sim"):
        run_dir = root / world / RUN_DIR
        meta = read_meta(run_dir)
        assert meta["status"] == "finished", world
        assert json.loads((run_dir / "cell.json").read_text())["point"] == "severe__severity-0.008"
        assert len(read_table(run_dir, "requests")) == 8, world
        if world != "sim":  # each testbed run started on engines verified quiet, with the given calibration
            assert meta["start"]["quiet"] is True, (world, meta["start"])
            assert meta["calibration"]["measured_here"] is False
    # the two testbed passes replayed the same requests
    a, b = (read_table(root / w / RUN_DIR, "requests").sort_values("request_id") for w in ("testbed", "repeat"))
    assert a["arrival_s"].tolist() == b["arrival_s"].tolist()
    claims = pd.read_csv(root / "claims" / "claims.csv")
    row = claims.set_index("claim").loc["lc-fails-under-the-fault"]
    # one seed: each world's value and the repeat's, and the rule's answer to one seed: undecided
    effects = pd.read_csv(root / "claims" / "claim_effects.csv").set_index("world")["value"]
    assert sorted(effects.index) == ["repeat", "sim", "testbed"]
    assert (row["sim_n"], row["tb_n"], row["repeat_n"]) == (1, 1, 1)
    tb = read_table(root / "testbed" / RUN_DIR, "requests")
    assert row["tb_mean"] == pytest.approx((tb["outcome"] != "ok").mean())
    assert row["paired_mean"] == pytest.approx(effects["testbed"] - effects["sim"])
    assert row["verdict"] == "undecided" and row["reason"].startswith(ONE_SEED) and row["rule"] == RULE_VERSION
    assert row["kind"] == "link" and row["prior_sigma"] > 0  # the cell's own kind of fault, from its run.json
    assert bool(row["claims_as_fixed"])
    assert (root / "claims" / "claim_lc-fails-under-the-fault.png").stat().st_size > 0


def test_the_same_study_command_again_finds_every_run_finished_and_starts_no_engine(testbed_runs):
    _, _, _, _, cli = testbed_runs
    res = cli["study_again"]
    assert res.returncode == 0, res.stderr[-3000:]
    text = " ".join((res.stdout + res.stderr).split())  # the console wraps long lines
    assert "testbed: 1 runs, 1 finished before; repeat of seed(s) 0: 1 runs, 1 finished before" in text
    assert "engines ready" not in text and "0 run(s) done" in text  # nor a simulator run
    assert "1 claim(s)" in text
