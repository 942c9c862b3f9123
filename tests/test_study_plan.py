"""`testbed study SPEC --plan` (study/plan.py): each claim's seeds for 80% power from the spec
alone, worked out here from the shipped priors and the exact power, and the design's runs and time."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from study.looks import simulate
from study.plan import PLAN_REPS, plan_table, study_cost
from analysis.rule.verdict import seeds_for_power, shipped_prior, tost_power
from cli.main import main
from core.calibration.fit import LOAD_SEEDS
from core.spec.sizes import ENGINE_START_S, footprint
from core.spec.model import load_spec
from study.grid import claim_sides, distinct_runs, expand_study

pytestmark = pytest.mark.background  # needs no core of its own: under -n, beside the others (tests/conftest.py)

CARRYOVER = Path(__file__).resolve().parents[1] / "experiments" / "carryover.yaml"


@pytest.fixture(scope="module")
def shipped():
    spec = load_spec(CARRYOVER)
    cells = expand_study(spec, str(CARRYOVER))
    return spec, cells, claim_sides(spec, cells, str(CARRYOVER))


def test_each_claim_is_sized_by_the_exact_power_of_its_equivalence_test_at_its_prior(shipped):
    spec, cells, sides = shipped
    plan = plan_table(sides, {c.point: c.spec for c in cells}, 6).set_index("claim")
    assert list(plan.index) == [s.name for s in sides]
    # a failure-rate claim of two cells on the degraded link, 40 requests a run
    row = plan.loc["price-cuts-failures"]
    prior = shipped_prior("failure_rate", "link", 40).times(2)
    assert (row["kind"], row["cells"], row["requests"]) == ("link", 2, 40)
    assert row["planning_sd"] == pytest.approx(prior.sigma) and row["prior_df"] == prior.df
    assert row["seeds_needed"] == seeds_for_power(prior.sigma, -0.03, 0.03, 0.0, prior)
    assert row["power_at_spec_seeds"] == pytest.approx(tost_power(6, prior.sigma, -0.03, 0.03, 0.0, prior))
    # the link-down claim takes the link down's wider prior; the compute claims theirs
    assert plan.loc["price-cuts-failures-when-down", "kind"] == "link_down"
    assert plan.loc["price-cuts-failures-when-down", "seeds_needed"] > row["seeds_needed"]
    assert plan.loc["least-load-handles-compute", "kind"] == "compute"
    # a difference of two claims is four cells: twice the variance of two
    assert plan.loc["late-labels-widen-the-price-gain", "cells"] == 4
    assert plan.loc["late-labels-widen-the-price-gain", "planning_sd"] == pytest.approx(prior.sigma * math.sqrt(2))


def test_the_designs_cost_is_its_runs_times_a_runs_wall_time_and_the_engines_start(shipped):
    spec, cells, _ = shipped
    per_seed = len(distinct_runs(cells, cells)) // 6
    runs, wall = study_cost(per_seed, 1, 5, cells[0].spec)
    assert runs == per_seed * 6
    # the calibration load's runs come first, on the same engines
    assert wall == pytest.approx((runs + len(LOAD_SEEDS)) * footprint(cells[0].spec, "testbed").seconds
                                 + ENGINE_START_S)


def test_a_design_with_looks_is_planned_by_simulating_it(shipped, tmp_path, capsys, monkeypatch):
    """Looks at 3 and 6 seeds: each claim's power over the looks by simulation (study/looks.py),
    below the one-look power at 6 seeds where that is short of 1 (each test at half the level), its
    mean seeds between 3 and 6; the command prints the range of runs the design can cost."""
    import yaml

    spec, cells, sides = shipped
    plan = plan_table(sides, {c.point: c.spec for c in cells}, 6, looks=[3, 6]).set_index("claim")
    row = plan.loc["price-cuts-failures"]
    prior = shipped_prior("failure_rate", "link", 40).times(2)
    want = simulate([3, 6], prior.sigma, -0.03, 0.03, 0.0, prior, reps=PLAN_REPS)
    assert (row["power_with_looks"], row["mean_seeds"]) == pytest.approx((want["pass"], want["mean_seeds"]))
    assert row["power_with_looks"] < row["power_at_spec_seeds"] and 3 < row["mean_seeds"] < 6
    data = yaml.safe_load(CARRYOVER.read_text())
    data["study"]["looks"] = [3, 6]
    path = tmp_path / "looks.yaml"
    path.write_text(yaml.safe_dump(data))
    monkeypatch.chdir(tmp_path)
    assert main(["study", str(path), "--plan"]) == 0
    said = capsys.readouterr()
    out = " ".join((said.out + said.err).split())
    assert "power, looks 3, 6" in out and "mean seeds" in out
    per_seed = len(distinct_runs(cells, cells)) // 6
    assert f"(looks at 3, 6 of 6 seeds, 1 repeated): {per_seed * 4} to {per_seed * 7} testbed runs" in out


def test_the_plan_command_prints_the_plan_and_runs_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["study", str(CARRYOVER), "--plan"]) == 0
    said = capsys.readouterr()
    out = " ".join((said.out + said.err).split())
    assert "plan: seeds each claim needs for 80% power" in out and "price-cuts-failures-when-down" in out
    assert "as the spec stands (6 seeds, 1 repeated): 133 testbed runs" in out
    assert "at 80% power:" in out and not (tmp_path / "runs").exists()


def test_a_study_without_claims_cannot_be_planned_and_says_so_in_one_line(tmp_path, capsys):
    spec = tmp_path / "s.yaml"
    spec.write_text("extends: testbed.yaml\nname: s\nstudy:\n  seeds: [0]\n  sweeps:\n"
                    "    - name: a\n      axes: {severity: [0.01]}\n")
    assert main(["study", str(spec), "--plan"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--plan sizes a study's claims, and its study has none" in err[0]


EXPERIMENTS = CARRYOVER.parent


def _nodes(*gpus_per_node: int) -> list[dict]:
    """Ray's ray.nodes() of a cluster whose node k holds pod k with that many GPUs (cluster.yaml's
    start commands give a node its pod<i> resource)."""
    return [{"Alive": True, "NodeID": f"n{k}", "NodeManagerAddress": f"10.0.0.{k + 1}",
             "Resources": {f"pod{k}": 1.0, "CPU": 64.0, "GPU": float(g)}} for k, g in enumerate(gpus_per_node)]


@pytest.fixture
def cluster(monkeypatch):
    """The plan's cluster: Ray's node list as given (no Ray started, no emulated cluster)."""
    import ray

    import cli.cluster

    found: list[dict] = []
    monkeypatch.setattr(cli.cluster, "in_cluster", lambda address, argv: None)
    monkeypatch.setattr(ray, "nodes", lambda: found)
    return found


def test_the_gpu_study_is_planned_for_a_head_and_two_gpu_nodes_and_the_grid_refused_there(cluster, tmp_path, capsys,
                                                                                             monkeypatch):
    monkeypatch.chdir(tmp_path)
    cluster.extend(_nodes(8, 8, 8))
    assert main(["study", str(EXPERIMENTS / "gpu_study.yaml"), "--plan", "--address", "auto"]) == 0
    said = capsys.readouterr()
    out = " ".join((said.out + said.err).split())
    assert "severity-raises-failures" in out and "as the spec stands (6 seeds, 1 repeated): 42 testbed runs" in out
    # the simulator's 32 x 32 grid: one line naming what the cluster has
    assert main(["study", str(EXPERIMENTS / "study.yaml"), "--plan", "--address", "auto"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "its runs do not fit the cluster at auto" in err[0] and "32 pods" in err[0], err
    # and the GPU study on nodes short of GPUs: which pod, and how many it needs
    cluster[:] = _nodes(8, 8, 4)
    assert main(["study", str(EXPERIMENTS / "gpu_study.yaml"), "--plan", "--address", "auto"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pod2's node" in err[0] and "= 8, but has 4" in err[0], err
