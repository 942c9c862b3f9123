"""A study's claims: resolved to the grid's points (study.grid.claim_sides), read per world and seed
from hand-built cells tables whose effects are worked out by hand (study.claims), written
as a table and one figure per claim."""

from __future__ import annotations

import copy
import io
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from rich.console import Console

from study.claims import (check_claim_metrics, claim_effects, claim_rules, claims_frame, claims_report,
                                  leave_one_pair_out, reaction_cost)
from analysis.rule.verdict import shipped_prior
from core.records import RunWriter
from core.spec.model import SpecError, load_spec, parse_spec
from study.grid import ClaimSides, claim_sides, expand_study

pytestmark = pytest.mark.background  # needs no core of its own: under -n, beside the others (tests/conftest.py)

SHIPPED = Path(__file__).resolve().parents[1] / "experiments" / "carryover.yaml"
JUDGED = {"direction": "decrease", "margin": 0.03}  # how a test's claim is judged


def _shipped() -> dict:
    """The shipped carry-over spec as a dict, its base (extends) resolved."""
    from core.spec.model import resolve_extends

    return resolve_extends(yaml.safe_load(SHIPPED.read_text()), str(SHIPPED), SHIPPED.parent)


def _sides(data: dict) -> list[ClaimSides]:
    spec = parse_spec(data, "t")
    return claim_sides(spec, expand_study(spec, "t"), "t")


def test_every_shipped_claim_reads_one_point_and_policy_of_its_grid():
    spec = load_spec(SHIPPED)
    cells = expand_study(spec, str(SHIPPED))
    sides = {s.name: s for s in claim_sides(spec, cells, str(SHIPPED))}
    assert len(sides) == len(spec.study.claims) >= 8
    check_claim_metrics(list(sides.values()))
    have = {(c.point, c.policy) for c in cells}
    for s in sides.values():
        assert (s.point, s.policy) in have and (s.vs is None or s.vs in have)
    # "vs" merges over the claim's own at: another policy at the same point, or the same policy elsewhere
    assert sides["price-cuts-failures"].vs == (sides["price-cuts-failures"].point, "FaultAwareLC")
    s = sides["in-flight-speeds-reaction"]
    assert s.point.endswith("in-flight-True") and s.vs == (s.point.replace("True", "False"), "OTF-R")


@pytest.mark.parametrize("claim, needle", [
    ({"name": "x", "metric": "failure_rate", "policy": "LC", "at": {"sweep": "nope"}, **JUDGED}, "selects no point"),
    ({"name": "x", "metric": "failure_rate", "policy": "LC", "at": {}, **JUDGED}, "selects 5 points"),
    ({"name": "x", "metric": "failure_rate", "policy": "FaultAwareLC", "at": {"sweep": "mild"}, **JUDGED},
     "with policy FaultAwareLC selects no point"),
    ({"name": "x", "metric": "failure_rate", "policy": "LC", "at": {"sweep": "severe"}, "vs": {"policy": "LC"},
      **JUDGED}, "its effect would be 0"),
])
def test_a_claim_that_does_not_select_one_point_is_one_line_naming_it(claim, needle):
    data = _shipped()
    data["study"]["claims"] = [claim]
    with pytest.raises(SpecError) as e:
        _sides(data)
    msg = str(e.value)
    assert needle in msg and "study.claims[0] (x)" in msg and "\n" not in msg


def test_claim_names_are_unique_and_an_unknown_metric_is_refused_before_any_run():
    data = _shipped()
    data["study"]["claims"].append(copy.deepcopy(data["study"]["claims"][0]))
    with pytest.raises(SpecError, match="claim names must be unique"):
        parse_spec(data, "t")
    data = _shipped()
    data["study"]["claims"] = [{"name": "x", "metric": "failure_ratio", "policy": "LC", "at": {"sweep": "severe"},
                                **JUDGED}]
    with pytest.raises(ValueError, match="claim x: unknown metric 'failure_ratio'"):
        check_claim_metrics(_sides(data))


SIDES = [ClaimSides("cut", "", "failure_rate", "p1", "B", ("p1", "A"), "decrease", 0.03, "ratio"),
         ClaimSides("cross", "", "failure_rate", "p2", "A", ("p1", "A"), "none", 0.03, "difference"),
         ClaimSides("plain", "", "reaction_s", "p1", "B", None, "increase", 5.0, "difference")]


def _cells(values: dict[tuple[str, str, int], tuple[float, float]]) -> pd.DataFrame:
    """A cells table: (point, policy, seed) -> (failure_rate, reaction_s)."""
    rows = [{"cell": f"{p}-{q}-{s}", "point": p, "sweep": p, "policy": q, "seed": s, "failure_rate": f,
             "reaction_s": r} for (p, q, s), (f, r) in values.items()]
    return pd.DataFrame(rows)


def test_a_claims_value_is_its_cell_minus_its_vs_cell_on_the_same_seed():
    sim = _cells({("p1", "A", 0): (0.30, 9.0), ("p1", "A", 1): (0.20, 9.0), ("p1", "A", 2): (0.25, 9.0),
                  ("p1", "B", 0): (0.10, 2.0), ("p1", "B", 1): (0.05, 3.0), ("p1", "B", 2): (0.10, math.nan),
                  ("p2", "A", 0): (0.40, 1.0), ("p2", "A", 1): (0.30, 1.0)})  # p2 lacks seed 2
    tb = _cells({("p1", "A", 0): (0.35, 9.0), ("p1", "B", 0): (0.05, 4.0), ("p1", "A", 1): (0.20, 9.0)})
    eff = claim_effects({"sim": sim, "testbed": tb}, SIDES).set_index(["claim", "world", "seed"])["value"]
    assert eff[("cut", "sim", 0)] == pytest.approx(-0.20) and eff[("cut", "sim", 1)] == pytest.approx(-0.15)
    assert eff[("cut", "sim", 2)] == pytest.approx(-0.15)
    assert eff[("cross", "sim", 0)] == pytest.approx(0.10) and ("cross", "sim", 2) not in eff.index
    # a NaN metric of a finished cell: the seed ran (a look counts it) and gives no value
    assert math.isnan(eff[("plain", "sim", 2)])
    assert eff[("plain", "sim", 1)] == 3.0
    # the testbed's seed 1 has only one side of "cut": not run, no row
    assert eff[("cut", "testbed", 0)] == pytest.approx(-0.30) and ("cut", "testbed", 1) not in eff.index
    assert len(eff) == 3 + 2 + 3 + 1 + 1


def test_the_claims_table_keeps_the_claims_order_and_says_what_each_reads():
    sim = _cells({(p, q, s): (0.1 * (q == "A") + 0.01 * s, 5.0 + s) for p in ("p1", "p2") for q in ("A", "B")
                  for s in range(3)})
    tb = sim.copy()
    rep = sim.loc[sim["seed"] == 0].assign(failure_rate=lambda d: d["failure_rate"] + 0.01)
    link = {"p1": ("link", 40.0), "p2": ("link", 40.0)}  # each point's kind of fault and run size
    table, effects = claims_frame({"sim": sim, "testbed": tb, "repeat": rep}, SIDES, link)
    assert list(table["claim"]) == ["cut", "cross", "plain"]
    r = table.set_index("claim")
    assert r.loc["cut", "vs"] == "A @ p1" and r.loc["plain", "vs"] == ""
    assert r.loc["cut", "sim_mean"] == pytest.approx(-0.1) and r.loc["cut", "tb_mean"] == pytest.approx(-0.1)
    # each claim's prior: its metric's under a degraded link (core/defaults/priors.yaml), times sqrt(2)
    # for an effect of two cells
    fr = shipped_prior("failure_rate", "link", 40.0)
    assert r.loc["cut", "kind"] == "link" and r.loc["cut", "prior_sigma"] == pytest.approx(fr.sigma * math.sqrt(2))
    # the repeat: 4 repeated cells, each 0.01 off, well inside ±0.03: the testbed repeats itself
    assert r.loc["cut", "repeat"] == "pass" and r.loc["cut", "repeat_n"] == 4
    assert r.loc["cut", "repeat_mean"] == pytest.approx(-0.01)
    assert r.loc["cut", "verdict"] == "carries over"  # equal worlds, well below 0, within ±0.03
    assert r.loc["cut", "ratio_sim"] == pytest.approx(np.mean([0.0, 0.01, 0.02]) / np.mean([0.1, 0.11, 0.12]))
    assert r.loc["cross", "sim_mean"] == pytest.approx(0.0) and r.loc["cross", "verdict"] == "carries over"
    # the repeat moved no reaction time, and equal worlds agree within the prior's width (one cell)
    assert r.loc["plain", "repeat"] == "pass" and r.loc["plain", "prior_sigma"] == pytest.approx(
        shipped_prior("reaction_s", "link").sigma)
    assert r.loc["plain", "verdict"] == "carries over"


def test_a_difference_of_two_claims_subtracts_the_other_effect_seed_by_seed():
    base = SIDES[0]
    gain = ClaimSides("gain", "", "failure_rate", "p2", "B", ("p2", "A"), "decrease", 0.03, "difference", base)
    sim = _cells({(p, q, s): ((0.3 if p == "p2" else 0.1) * (q == "A") + 0.01 * s, 1.0)
                  for p in ("p1", "p2") for q in ("A", "B") for s in range(3)})
    eff = claim_effects({"sim": sim}, [base, gain]).set_index(["claim", "seed"])["value"]
    # (B - A at p2) - (B - A at p1) = -0.3 - (-0.1)
    assert eff.xs("gain", level="claim").tolist() == pytest.approx([-0.2, -0.2, -0.2])
    assert claim_rules([base, gain])["gain"].cells == 4


def test_each_repeated_pair_left_out_in_turn_shows_the_verdicts_that_hang_on_it():
    sim = _cells({(p, q, s): (0.1 * (q == "A") + 0.01 * s, 5.0 + s) for p in ("p1", "p2") for q in ("A", "B")
                  for s in range(3)})
    rep = sim.loc[sim["seed"] == 0].copy()
    rep.loc[(rep["point"] == "p2") & (rep["policy"] == "B"), "failure_rate"] += 0.3  # one pair far off
    link = {"p1": ("link", 40.0), "p2": ("link", 40.0)}
    frames = {"sim": sim, "testbed": sim.copy(), "repeat": rep}
    table, _ = claims_frame(frames, SIDES, link)
    r = table.set_index("claim")
    # the failure-rate claims cannot carry over: their testbed did not repeat itself
    assert r.loc["cut", "repeat"] != "pass" and r.loc["cut", "verdict"] == "undecided"
    loo = leave_one_pair_out(table, frames, SIDES, link).set_index(["point", "policy"])
    # leaving the far pair out lets the two failure-rate claims carry over; and the reaction claim's
    # repeat, four pairs that never moved, passes its 5 s margin only with all four (with three, its
    # prior's 2 df and 3 pairs give an interval of +-6.5 s): every pair moves it
    assert len(loo) == 4 and loo.loc[("p2", "B"), "claims"] == "cut, cross, plain"
    assert (loo.drop(("p2", "B"))["claims"] == "plain").all()


def test_a_claims_kind_of_fault_is_the_widest_of_its_points_and_its_prior_follows_the_run_size():
    cond = {"p1": ("link", 80.0), "p2": ("link_down", 40.0)}
    rules = claim_rules(SIDES, cond)
    assert rules["cut"].kind == "link" and rules["cross"].kind == "link_down"  # cross reads p1 and p2
    assert rules["cut"].prior.sigma == pytest.approx(shipped_prior("failure_rate", "link", 40).sigma / math.sqrt(2))
    assert rules["cross"].prior.sigma == pytest.approx(shipped_prior("failure_rate", "link_down", 40).sigma)
    assert claim_rules(SIDES)["cut"].kind == "none"  # nothing known of its points


def test_a_claim_without_values_is_undecided():
    table, _ = claims_frame({"sim": _cells({}), "testbed": _cells({})}, SIDES[:1])
    assert list(table["claim"]) == ["cut"] and table.loc[0, "verdict"] == "undecided"


def test_the_claims_the_runs_began_with_are_kept_and_a_later_change_is_said():
    from study.claims import fixed_note, fixed_record

    spec = load_spec(SHIPPED)
    first = fixed_record(None, spec.study.claims, "t0")
    assert first["rule"] and fixed_note(first) is None
    assert fixed_record(first, spec.study.claims, "t1") == first  # the same claims again: unchanged
    widened = [c.model_copy(update={"margin": c.margin * 2}) for c in spec.study.claims]
    later = fixed_record(first, widened, "t1")
    assert later["digest"] == first["digest"] and later["at"] == "t0" and later["changed_at"] == "t1"
    note = fixed_note(later)
    assert note and "changed at t1" in note and "not fixed before the runs" in note
    assert fixed_record(later, spec.study.claims, "t2") == first  # changed back: as fixed
    assert "judged now by" in fixed_note({**first, "rule": "an-older-rule"})


def test_the_report_writes_the_table_the_effects_reaction_and_cost_and_a_figure_per_claim(tmp_path):
    sim = _cells({(p, q, s): (0.2 if q == "A" else 0.05 * s, 3.0 + s) for p in ("p1", "p2") for q in ("A", "B")
                  for s in range(3)})
    tb = sim.assign(failure_rate=sim["failure_rate"] + 0.02)
    table = claims_report({"sim": sim, "testbed": tb}, SIDES, [], tmp_path, Console(width=200, file=open("/dev/null", "w")))
    assert len(table) == 3
    assert pd.read_csv(tmp_path / "claims.csv")["claim"].tolist() == ["cut", "cross", "plain"]
    assert len(pd.read_csv(tmp_path / "claim_effects.csv")) == 2 * (3 + 3 + 3)
    for name in ("cut", "cross", "plain"):
        assert (tmp_path / f"claim_{name}.png").stat().st_size > 1000
    rc = pd.read_csv(tmp_path / "reaction_cost.csv")
    a = rc.set_index(["world", "point", "policy"])
    assert a.loc[("testbed", "p1", "B"), "failure_rate"] == pytest.approx(np.mean([0.02, 0.07, 0.12]))
    assert a.loc[("sim", "p2", "A"), "reaction_s"] == pytest.approx(4.0) and a.loc[("sim", "p2", "A"), "n_seeds"] == 3
    with pytest.raises(ValueError, match="unknown world"):
        claims_report({"simulator": sim}, SIDES, [], tmp_path)


def test_the_report_says_when_the_judged_runs_are_not_all_from_one_clean_commit(tmp_path):
    """The claims' runs by the world they stand for (the testbed's repeat apart), each run once where
    cells share it; nothing said when every run is from one clean commit."""
    sim = _cells({(p, q, s): (0.2 if q == "A" else 0.05 * s, 3.0 + s) for p in ("p1", "p2") for q in ("A", "B")
                  for s in range(3)})
    runs = tmp_path / "runs"
    sim = sim.assign(commit="a" * 10, run_dir=[str(runs / f"sim-{q}-{s}") for q, s in zip(sim["policy"], sim["seed"])])
    tb = sim.assign(failure_rate=sim["failure_rate"] + 0.02, run_dir=str(runs) + "/tb-" + sim["cell"])
    rep = tb.assign(commit="unknown", run_dir=str(runs) + "/rep-" + tb["cell"])
    for d in {*sim["run_dir"], *tb["run_dir"], *rep["run_dir"]}:  # a run.json each (the report reads the points')
        RunWriter(Path(d), {"world": "sim", "policy": "A", "seed": 0, "spec": {}}).close()

    def said(frames) -> list[str]:
        buf = io.StringIO()
        claims_report(frames, SIDES, [], tmp_path, Console(width=400, file=buf))
        return [line for line in buf.getvalue().splitlines() if "clean commit" in line]

    assert said({"sim": sim, "testbed": tb}) == []
    mixed = tb.assign(commit=["b" * 10 + "+dirty" if i < 4 else "a" * 10 for i in range(len(tb))])
    [note] = said({"sim": sim, "testbed": mixed, "repeat": rep})  # the sim's 12 cells share 6 runs
    assert f"{'a' * 10}: 6 sim, 8 testbed; {'b' * 10}+dirty: 4 testbed; unknown: 12 repeat" in note


def test_reaction_and_cost_of_an_empty_world_is_an_empty_table():
    assert reaction_cost({"sim": _cells({})}, []).empty


@pytest.mark.parametrize("claim, needle", [
    ({"name": "x", "metric": "failure_rate", "policy": "LC", "at": {"sweep": "nope"}, **JUDGED}, "selects no point"),
    ({"name": "x", "metric": "fail_rate", "policy": "LC", "at": {"sweep": "severe"}, **JUDGED},
     "claim x: unknown metric"),
    ({"name": "x", "metric": "failure_rate", "policy": "LC", "at": {"sweep": "severe"}}, "direction: Field required"),
    (None, "--repeat-seeds: 7 is not a seed of the study's cells (0, 1, 2, 3, 4, 5)"),
])
def test_the_command_refuses_a_bad_claim_in_one_line_before_any_engine_starts(tmp_path, capsys, claim, needle):
    from cli.main import main

    data = _shipped()
    if claim is not None:
        data["study"]["claims"] = [claim]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    extra = ["--repeat-seeds", "0,7"] if claim is None else []
    assert main(["study", str(path), "--world", "both", "--out", str(tmp_path / "runs"), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("testbed: error:") and needle in err and "\n" not in err
    assert not (tmp_path / "runs").exists()  # nothing written, nothing started
