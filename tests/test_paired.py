"""The paired report (analysis/compare/paired.py, analysis/compare/paired_stats.py) and the testbed's repeatability
(analysis/compare/repeatability.py, `testbed compare --repeat`) on hand-built run directories, with the
answers worked out by hand here."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from analysis.compare.console import compare
from analysis.compare.paired import outcome_class, paired_report
from analysis.compare.paired_stats import quantile_ci
from analysis.compare.repeatability import add_repeatability
from analysis.rule.verdict import ONE_SEED, shipped_prior
from cli.main import main
from core.records import RequestRecord, RunWriter
from test_analysis import link_fault
from test_fidelity import BASE_SPEC, quiet

pytestmark = pytest.mark.background  # needs no core of its own: under -n, beside the others (tests/conftest.py)

NAN = math.nan
FAULT = (10.0, 20.0)  # the fault window of every hand-built run, on pod 3
# The spans of two ok requests (routing, prefill_queue, prefill, decode_queue, kv_transfer, first_token,
# decode), on the testbed and in the simulator.
TB_SPANS = {0: (0.01, 0.1, 0.5, 0.05, 0.2, 0.04, 1.0), 1: (0.02, 0.2, 1.0, 0.1, 0.4, 0.08, 2.0)}
SIM_SPANS = {0: (0.01, 0.05, 0.25, 0.05, 0.1, 0.02, 0.5), 1: (0.02, 0.3, 0.5, 0.1, 0.2, 0.04, 1.0)}
ARRIVAL = {0: 5.0, 1: 12.0}  # request 0 lives before the fault window, request 1 inside it


def rec(i: int, t: float, spans=(0.0, 0.0, 0.1, 0.0, 0.01, 0.01, 0.1), outcome: str = "ok",
        stage: str | None = None, out: int = 11) -> RequestRecord:
    """Request ``i`` arriving at ``t``; an ok one passes its stages in ``spans`` (seconds, in order),
    a failed one records only its routing."""
    ts = np.cumsum([t, *spans]).tolist()
    if outcome != "ok":
        ts = [t, t] + [NAN] * 6
    return RequestRecord(request_id=i, arrival_s=t, prompt_tokens=100, output_tokens=out, prefill_worker=0,
                         decode_worker=1, prefill_pod=0, decode_pod=1, routed_s=ts[1], prefill_start_s=ts[2],
                         prefill_end_s=ts[3], kv_start_s=ts[4], kv_end_s=ts[5], first_token_s=ts[6], end_s=ts[7],
                         outcome=outcome, failed_stage=stage)


def ttft_recs(ttfts: list[float], start: float = 30.0) -> list[RequestRecord]:
    """Ok requests (after the fault window) whose TTFT is all prefill: ids 0, 1, ... one second apart."""
    return [rec(i, start + i, (0.0, 0.0, x, 0.0, 0.0, 0.0, 0.5)) for i, x in enumerate(ttfts)]


def write(d: Path, world: str, policy: str, seed: int, recs: list[RequestRecord], scenario: str = "link",
          spec: dict | None = None) -> Path:
    w = RunWriter(d, {"world": world, "scenario": scenario, "policy": policy, "seed": seed,
                      "spec": spec if spec is not None else BASE_SPEC}, flush_s=1e9)
    for r in [*recs, *link_fault(*FAULT, pod=3)]:
        w.write(r)
    w.close()
    return d


# --------------------------------------------------------------------------- outcomes


def test_outcome_classes():
    assert outcome_class("ok", None) == "ok"
    assert outcome_class("timeout", "kv_transfer") == "given_up:kv_transfer"
    assert outcome_class("timeout", None) == "given_up:unknown"
    assert [outcome_class(o, "decode") for o in ("error", "rejected", "corrupt")] == ["error", "rejected", "corrupt"]


def test_confusion_matrix_with_one_mismatch_and_a_request_of_one_side(tmp_path):
    # testbed: 0-2 ok, 3 given up in kv_transfer, 4 ok (the simulator's run lacks it);
    # sim: 0-1 ok, 2 and 3 given up in kv_transfer: request 2 is the one mismatch
    tb = [rec(0, 1.0), rec(1, 2.0), rec(2, 3.0), rec(3, 4.0, outcome="timeout", stage="kv_transfer"), rec(4, 5.0)]
    sim = [rec(0, 1.0), rec(1, 2.0), rec(2, 3.0, outcome="timeout", stage="kv_transfer"),
           rec(3, 4.0, outcome="timeout", stage="kv_transfer")]
    r = paired_report([write(tmp_path / "tb", "testbed", "LC", 0, tb)], [write(tmp_path / "sim", "sim", "LC", 0, sim)])
    a = r.agreement.set_index("policy").loc["LC"]
    assert (a["matched"], a["agree"], a["only_testbed"], a["only_other"]) == (4, 3, 1, 0)
    assert a["agreement"] == pytest.approx(3 / 4)
    cells = {(c.testbed, c.other): c.n for c in r.confusion.itertuples()}
    assert cells == {("ok", "ok"): 2, ("ok", "given_up:kv_transfer"): 1,
                     ("given_up:kv_transfer", "given_up:kv_transfer"): 1}
    assert r.agreement_of("LC") == (pytest.approx(0.75), 4)


# --------------------------------------------------------------------------- latency, request by request


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    root = tmp_path_factory.mktemp("two")
    tb = write(root / "tb", "testbed", "LC", 0, [rec(i, ARRIVAL[i], TB_SPANS[i]) for i in (0, 1)])
    sim = write(root / "sim", "sim", "LC", 0, [rec(i, ARRIVAL[i], SIM_SPANS[i]) for i in (0, 1)])
    return paired_report([tb], [sim])


def test_per_stage_errors_of_two_known_requests(two):
    e = two.errors.set_index(["window", "metric"])
    # prefill_queue: request 0 (0.05 - 0.1) / 0.1 = -0.5, request 1 (0.3 - 0.2) / 0.2 = +0.5
    pq = e.loc[("all", "prefill_queue")]
    assert pq["n"] == 2
    assert pq["signed_p50"] == pytest.approx(0.0)
    assert pq["signed_p90"] == pytest.approx(-0.5 + 0.9 * 1.0)  # linear between the two
    assert (pq["abs_p50"], pq["abs_p90"]) == (pytest.approx(0.5), pytest.approx(0.5))
    # prefill, kv_transfer and decode halve in both requests; routing and decode_queue agree
    for m in ("prefill", "kv_transfer", "first_token", "decode"):
        assert e.loc[("all", m), "signed_p50"] == pytest.approx(-0.5)
    for m in ("routing", "decode_queue"):
        assert e.loc[("all", m), "abs_p90"] == pytest.approx(0.0)
    # TTFT: request 0 0.9 s -> 0.48 s; request 1 1.8 s -> 1.16 s; TPOT is decode / 10 tokens
    ttft = [(0.48 - 0.9) / 0.9, (1.16 - 1.8) / 1.8]
    assert e.loc[("all", "ttft"), "signed_p50"] == pytest.approx(sum(ttft) / 2)
    assert e.loc[("all", "tpot"), "signed_p50"] == pytest.approx(-0.5)
    # E2E: 1.9 s -> 0.98 s; 3.8 s -> 2.16 s
    assert e.loc[("all", "e2e"), "signed_p50"] == pytest.approx(((0.98 - 1.9) / 1.9 + (2.16 - 3.8) / 3.8) / 2)
    # inside the window only request 1 (arrived at 12 s): one request, no interval
    inside = e.loc[("inside", "ttft")]
    assert inside["n"] == 1 and inside["signed_p50"] == pytest.approx(ttft[1])
    assert math.isnan(inside["signed_p50_lo"]) and math.isnan(inside["signed_p50_hi"])
    assert e.loc[("outside", "e2e"), "signed_p50"] == pytest.approx((0.98 - 1.9) / 1.9)


def test_which_stage_the_e2e_gap_comes_from(two):
    g = two.stages.set_index(["window", "stage"])
    # E2E gap: request 0 0.98 - 1.9 = -0.92 s, request 1 2.16 - 3.8 = -1.64 s
    assert g.loc[("all", "e2e"), "gap_mean_s"] == pytest.approx((-0.92 - 1.64) / 2)
    assert g.loc[("all", "prefill"), "gap_mean_s"] == pytest.approx((-0.25 - 0.5) / 2)
    assert g.loc[("all", "prefill"), "share"] == pytest.approx(0.375 / 1.28)
    assert g.loc[("all", "prefill"), ["testbed_mean_s", "other_mean_s"]].tolist() == pytest.approx([0.75, 0.375])
    assert g.loc[("inside", "prefill"), "gap_mean_s"] == pytest.approx(-0.5)  # request 1 alone
    assert g.loc[("outside", "prefill"), "gap_mean_s"] == pytest.approx(-0.25)  # request 0 alone
    assert g.loc[("inside", "decode"), "share"] == pytest.approx(1.0 / 1.64)
    for w in ("inside", "outside", "all"):  # the spans sum to E2E
        shares = g.loc[w, "share"].drop("e2e")
        assert shares.sum() == pytest.approx(1.0)


def test_bootstrap_interval_holds_the_point_estimate_and_is_reproducible():
    x = np.arange(1.0, 22.0)  # 1 .. 21: median 11
    p, lo, hi = quantile_ci(x, 50)
    assert p == 11.0 and lo < p < hi and 1.0 <= lo and hi <= 21.0
    assert quantile_ci(x, 50) == (p, lo, hi)  # a fixed seed
    one = quantile_ci(np.array([3.0]), 50)
    assert one[0] == 3.0 and math.isnan(one[1]) and math.isnan(one[2])
    assert all(math.isnan(v) for v in quantile_ci(np.array([]), 90))


def test_error_intervals_hold_their_estimates(tmp_path):
    rng = np.random.default_rng(1)
    base = rng.uniform(0.5, 2.0, 30)
    tb = write(tmp_path / "tb", "testbed", "LC", 0, ttft_recs(base.tolist()))
    sim = write(tmp_path / "sim", "sim", "LC", 0, ttft_recs((base * rng.uniform(0.5, 1.5, 30)).tolist()))
    e = paired_report([tb], [sim]).errors
    row = e[(e.window == "all") & (e.metric == "ttft")].iloc[0]
    for k in ("signed_p50", "abs_p50"):
        assert row[f"{k}_lo"] <= row[k] <= row[f"{k}_hi"]


# --------------------------------------------------------------------------- MAPE


def test_mape_of_a_known_p50(tmp_path):
    # LC seed 0: testbed TTFT 1, 2, 3 s (p50 2, mean 2), sim 1, 1.5, 2 (p50 1.5, mean 1.5): APE 0.25, 0.25
    # LC seed 1: testbed 2, 4, 6 (p50 4, mean 4), sim 2, 6, 9 (p50 6, mean 17/3): APE 0.5, 5/12
    # OTF-R seed 0: testbed 1, 2, 3, sim 1, 2.2, 3: p50 APE 0.1
    runs = {("LC", 0): ([1, 2, 3], [1, 1.5, 2]), ("LC", 1): ([2, 4, 6], [2, 6, 9]), ("OTF-R", 0): ([1, 2, 3], [1, 2.2, 3])}
    for (p, s), (t, o) in runs.items():
        write(tmp_path / "tb" / p / str(s), "testbed", p, s, ttft_recs(t))
        write(tmp_path / "sim" / p / str(s), "sim", p, s, ttft_recs(o))
    r = paired_report([tmp_path / "tb"], [tmp_path / "sim"])
    m = r.mape.set_index(["policy", "metric", "stat"])
    assert m.loc[("LC", "ttft", "p50"), "mape"] == pytest.approx((0.25 + 0.5) / 2)
    assert m.loc[("LC", "ttft", "mean"), "mape"] == pytest.approx((0.25 + (17 / 3 - 4) / 4) / 2)
    assert m.loc[("LC", "ttft", "p50"), ["n_seeds", "n_ok_testbed", "n_ok_other"]].tolist() == [2, 6, 6]
    assert m.loc[("OTF-R", "ttft", "p50"), "mape"] == pytest.approx(0.1)
    assert m.loc[("all", "ttft", "p50"), "mape"] == pytest.approx((0.375 + 0.1) / 2)
    assert math.isnan(m.loc[("LC", "ttft", "p99"), "mape"])  # 6 ok requests pooled, not 200
    a = r.ape.set_index(["policy", "seed", "metric", "stat"])
    assert a.loc[("LC", 1, "ttft", "p50"), ["testbed", "other", "ape"]].tolist() == pytest.approx([4.0, 6.0, 0.5])


def test_p99_only_where_200_ok_requests_are_pooled(tmp_path):
    # two seeds of 100 ok requests: 200 pooled, though each seed has 100; the simulator twice as slow
    ttft = [1.0 + k / 99 for k in range(100)]
    for s in (0, 1):
        write(tmp_path / "tb" / str(s), "testbed", "LC", s, ttft_recs(ttft))
        write(tmp_path / "sim" / str(s), "sim", "LC", s, ttft_recs([2 * x for x in ttft]))
    m = paired_report([tmp_path / "tb"], [tmp_path / "sim"]).mape.set_index(["policy", "metric", "stat"])
    assert m.loc[("LC", "ttft", "p99"), "testbed"] == pytest.approx(1.0 + 98.01 / 99)  # 0.99 x 99 = 98.01
    for stat in ("mean", "p50", "p90", "p99"):
        assert m.loc[("LC", "ttft", stat), "mape"] == pytest.approx(1.0)


# --------------------------------------------------------------------------- repeatability


def test_add_repeatability_puts_the_repeats_deviation_beside_each_check():
    cols = ["policy", "metric", "deviation"]
    sim = pd.DataFrame([["LC", "failure_rate", 0.05], ["LC", "ttft_p50_s", -0.5]], columns=cols)
    rep = pd.DataFrame([["LC", "failure_rate", -0.1], ["LC", "ttft_p50_s", 0.2]], columns=cols)
    assert add_repeatability(sim, rep)["repeatability"].tolist() == pytest.approx([-0.1, 0.2])
    assert add_repeatability(sim, None)["repeatability"].isna().all()


def _fails(n: int, failing: set[int]) -> list[RequestRecord]:
    return [rec(i, 30.0 + i, outcome="timeout", stage="kv_transfer") if i in failing else rec(i, 30.0 + i)
            for i in range(n)]


@pytest.fixture()
def worlds(tmp_path) -> tuple[Path, Path, Path]:
    """20 requests per run. LC: testbed fails 0-3, its repeat 0-5, the sim 0-4. OTF-R: the testbed and its
    repeat fail 0-3, the sim 0-1."""
    design = {"LC": ({0, 1, 2, 3}, {0, 1, 2, 3, 4, 5}, {0, 1, 2, 3, 4}),
              "OTF-R": ({0, 1, 2, 3}, {0, 1, 2, 3}, {0, 1})}
    for p, (tb, rep, sim) in design.items():
        write(tmp_path / "testbed" / p, "testbed", p, 0, _fails(20, tb))
        write(tmp_path / "repeat" / p, "testbed", p, 0, _fails(20, rep))
        write(tmp_path / "sim" / p, "sim", p, 0, _fails(20, sim))
    return tmp_path / "sim", tmp_path / "testbed", tmp_path / "repeat"


def test_one_seed_with_a_repeat_decides_nothing_and_the_repeat_is_judged_and_described(worlds, tmp_path):
    sim, tb, rep = worlds
    f = compare([sim], [tb], tmp_path / "out", console=quiet(), repeat_paths=[rep])
    t = f.table.set_index(["policy", "metric"])
    # the testbed's spread of the failure rate, a description: LC's repeat 2 requests off (0.1), OTF-R's
    # 0: pooled sqrt((0.1^2 + 0^2) / 4) = 0.05, from 2 pairs
    assert f.own_spreads["failure_rate"].pairs == 2 and f.own_spreads["failure_rate"].sigma == pytest.approx(0.05)
    assert t.loc[("LC", "failure_rate"), ["deviation", "repeatability"]].tolist() == pytest.approx([-0.05, -0.1])
    # one seed: the interval is the prior's alone, shown, and no check is decided
    lc = t.loc[("LC", "failure_rate")]
    prior = shipped_prior("failure_rate", "link", 20)
    half = stats.t.ppf(0.95, prior.df) * prior.sigma
    assert (lc["dev_low"], lc["dev_high"]) == pytest.approx((-0.05 - half, -0.05 + half))
    assert set(f.table["verdict"]) == {"undecided"} and ONE_SEED in set(f.table["why"]) <= {ONE_SEED, "no value"}
    # the repeat judged: LC -0.1 and OTF-R 0 over two pairs straddle +-0.03, so no check could pass
    assert f.repeats["failure_rate"][0] == "undecided" and lc["repeat_verdict"] == "undecided"
    # outcomes: LC's sim ends request 4 differently (1 of 20), its repeat 4 and 5 (2 of 20)
    agree = t.loc[("LC", "outcome_agreement")]
    assert (agree["sim"], agree["diff"], agree["repeatability"]) == pytest.approx((19 / 20, 1 / 20, 2 / 20))
    r = pd.read_csv(tmp_path / "out" / "fidelity_repeatability.csv").set_index(["policy", "metric"])
    assert r.loc[("LC", "outcome_agreement"), "repeat"] == pytest.approx(18 / 20)
    assert r.loc[("LC", "failure_rate"), "deviation"] == pytest.approx(-0.1)
    spread = pd.read_csv(tmp_path / "out" / "fidelity_spread.csv").set_index("metric")
    assert spread.loc["failure_rate", "repeat_verdict"] == "undecided"
    confusion = pd.read_csv(tmp_path / "out" / "fidelity_confusion.csv")
    assert set(confusion["versus"]) == {"sim", "repeat"}


def test_without_a_repeat_one_seed_is_undecided(worlds, tmp_path):
    sim, tb, _ = worlds
    f = compare([sim], [tb], tmp_path / "out", console=quiet())
    assert set(f.table["verdict"]) == {"undecided"} and f.repeat is None and set(f.table["repeat_verdict"]) == {"not run"}
    assert "core/defaults/priors.yaml for a link fault, 20 requests a run" == f.prior_source
    assert not (tmp_path / "out" / "fidelity_repeatability.csv").exists()
    for name in ("fidelity_paired.csv", "fidelity_confusion.csv", "fidelity_stages.csv", "fidelity_mape.csv"):
        assert (tmp_path / "out" / name).exists()


def test_the_testbed_against_itself_agrees_everywhere(worlds, tmp_path):
    sim, tb, _ = worlds
    f = compare([sim], [tb], tmp_path / "out", console=quiet(), repeat_paths=[tb])
    assert f.repeat.agreement["agreement"].tolist() == [1.0, 1.0]
    assert f.repeatability["deviation"].abs().max() == 0.0


def test_a_repeat_of_another_scenario_or_seed_is_refused(worlds, tmp_path):
    sim, tb, _ = worlds
    other = write(tmp_path / "other" / "LC", "testbed", "LC", 0, _fails(20, set()), scenario="other")
    with pytest.raises(ValueError, match="scenario 'other', the testbed runs scenario 'link'") as e:
        compare([sim], [tb], tmp_path / "o1", console=quiet(), repeat_paths=[other])
    assert "\n" not in str(e.value)
    seed = write(tmp_path / "seed7" / "LC", "testbed", "LC", 7, _fails(20, set()))
    with pytest.raises(ValueError, match="LC seed 7, which the testbed runs do not hold"):
        compare([sim], [tb], tmp_path / "o2", console=quiet(), repeat_paths=[seed])
    faster = {**BASE_SPEC, "workload": {**BASE_SPEC["workload"], "arrival": {"kind": "poisson", "rate_rps": 2.0}}}
    fast = write(tmp_path / "fast" / "LC", "testbed", "LC", 0, _fails(20, set()), spec=faster)
    with pytest.raises(ValueError, match=r"workload.arrival.rate_rps \(2.0 vs 0.5\)"):
        compare([sim], [tb], tmp_path / "o3", console=quiet(), repeat_paths=[fast])
    assert not (tmp_path / "o1").exists()  # refused before anything was written


def test_compare_cli_repeat(worlds, tmp_path, capsys):
    sim, tb, rep = worlds
    assert main(["compare", str(sim), str(tb), "--out", str(tmp_path / "out"), "--repeat", str(rep), "--full"]) == 0
    printed = capsys.readouterr().out
    assert "Repeatability" in printed and "undecided" in printed and "the testbed against its repeat" in printed
    assert (tmp_path / "out" / "fidelity_repeatability.csv").exists()


def test_the_engine_table_judges_each_quantity_by_the_rule_with_the_notices_spread_as_prior():
    from analysis.compare.engine_death import engine_table, notice_prior
    from analysis.run.names import Metric as M
    from core.calibration.frozen import fit

    def runs(world: str, downs: list[float], rates: list[float], share: float = 0.5) -> pd.DataFrame:
        return pd.DataFrame([{"world": world, "policy": "LC", "seed": i, M.ENGINE_DOWN_S: d, M.FAILURE_RATE: r,
                              M.ENGINE_CORE_SHARE: share} for i, (d, r) in enumerate(zip(downs, rates))])

    # half the deaths a core's: the fitted notices' spread, halved, with the fit's degrees of freedom
    samples = fit("core_death_notice_s").samples
    assert notice_prior(0.5).sigma == pytest.approx(np.std(samples, ddof=1) / 2)
    assert notice_prior(0.5).df == len(samples) - 1 and not notice_prior(math.nan).known
    tb = runs("testbed", [0.5, 0.5, 0.5], [0.05] * 3)
    both = pd.concat([runs("sim", [0.45, 0.46, 0.44], [0.05] * 3), tb])
    rep = runs("repeat", [0.499, 0.5, 0.501], [0.05] * 3)
    t = engine_table(both, rep, ["LC"]).set_index("metric")
    down = t.loc[M.ENGINE_DOWN_S]
    assert down["repeatability"] == pytest.approx(0.0) and down["prior_sigma"] == pytest.approx(notice_prior(0.5).sigma)
    p = notice_prior(0.5)
    devs = np.array([0.05, 0.04, 0.06])
    df = p.df + 2
    half = stats.t.ppf(0.95, df) * math.sqrt((p.df * p.sigma ** 2 + 2 * devs.var(ddof=1)) / df / 3)
    assert (down["dev_low"], down["dev_high"]) == pytest.approx((0.05 - half, 0.05 + half))
    assert down["margin"] == 1.0 and down["verdict"] == "pass"  # 50 ms off, against the 1 s that matters
    assert down["repeat_verdict"] == "pass"  # the testbed repeated its notices within the margin
    # the same rate in all three, every seed: the prior's width (core/defaults/priors.yaml), a pass
    assert t.loc[M.FAILURE_RATE, "verdict"] == "pass" and t.loc[M.FAILURE_RATE, "prior_sigma"] > 0
    # a simulator 2 s late: fail
    late = pd.concat([runs("sim", [-1.5] * 3, [0.05] * 3), tb])
    assert engine_table(late, rep, ["LC"]).set_index("metric").loc[M.ENGINE_DOWN_S, "verdict"] == "fail"
    # one request of 20 apart in the rate, every seed: wholly outside +-0.03
    off = pd.concat([runs("sim", [0.5] * 3, [0.10] * 3), tb])
    assert engine_table(off, rep, ["LC"]).set_index("metric").loc[M.FAILURE_RATE, "verdict"] == "fail"
    # a testbed that does not repeat itself: its pass is withheld, and said
    drift = runs("repeat", [0.5] * 3, [0.25] * 3)
    row = engine_table(both, drift, ["LC"]).set_index("metric").loc[M.FAILURE_RATE]
    assert (row["verdict"], row["repeat_verdict"]) == ("undecided", "fail") and "does not repeat" in row["why"]
    # one seed decides nothing
    one = engine_table(pd.concat([runs("sim", [0.45], [0.05]), runs("testbed", [0.5], [0.05])]), None, ["LC"])
    assert set(one["verdict"]) == {"undecided"}


def test_the_engine_table_widens_by_the_calibrations_shared_error_where_several_calibrations_ran():
    """The simulator's seeds under two calibrations whose mean notice differs by 1.2 s: that spread
    every seed shares (engine_common, as the twin's checks) joins the interval whole, by
    Welch-Satterthwaite, so 50 ms off no longer passes against the 1 s margin: undecided."""
    from analysis.compare.engine_death import engine_common, engine_table, notice_prior
    from analysis.run.names import Metric as M
    from analysis.rule.verdict import interval

    def runs(world: str, downs: list[float]) -> pd.DataFrame:
        return pd.DataFrame([{"world": world, "policy": "LC", "seed": i, M.ENGINE_DOWN_S: d, M.FAILURE_RATE: 0.05,
                              M.ENGINE_CORE_SHARE: 0.5} for i, d in enumerate(downs)])

    own, other = runs("sim", [0.45, 0.46, 0.44]), runs("sim", [1.65, 1.66, 1.64])
    both = pd.concat([own, runs("testbed", [0.5, 0.5, 0.5])])
    common = engine_common([own, other], ["LC"])
    assert common[M.ENGINE_DOWN_S].sigma == pytest.approx(1.2 / math.sqrt(2)) and common[M.ENGINE_DOWN_S].pairs == 1
    assert engine_common([own], ["LC"]) == {}  # one calibration: no spread to measure
    alone = engine_table(both, None, ["LC"]).set_index("metric").loc[M.ENGINE_DOWN_S]
    row = engine_table(both, None, ["LC"], common=common).set_index("metric").loc[M.ENGINE_DOWN_S]
    assert (alone["verdict"], row["verdict"]) == ("pass", "undecided")
    want = interval([0.05, 0.04, 0.06], notice_prior(0.5), common[M.ENGINE_DOWN_S])
    assert (row["dev_low"], row["dev_high"]) == pytest.approx((want.low, want.high))
    assert row["cal_sigma"] == pytest.approx(1.2 / math.sqrt(2))
    assert row["dev_high"] - row["dev_low"] > 10 * (alone["dev_high"] - alone["dev_low"])
