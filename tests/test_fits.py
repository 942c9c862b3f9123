"""Fitted parameters (core/defaults/fits.yaml, core/calibration/frozen.py) and the one source of the testbed's physics:
the shipped specs carry each fit's value and take the measured physics from core/defaults/testbed.yaml;
a new run's dead-core notice is judged against the fit's prediction interval."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
import yaml

from analysis.compare.engine_death import core_death_notices, notice_table
from analysis.rule.verdict import prediction_interval
from core.calibration.frozen import fit
from core.records import EngineRecord, FaultEvent, RequestRecord, RunWriter
from core.spec.model import load_spec, resolve_extends

pytestmark = pytest.mark.background  # needs no core of its own: under -n, beside the others (tests/conftest.py)

REPO = Path(__file__).resolve().parents[1]
# The testbed's measured physics: what a shipped testbed spec must not restate (its value lives in
# core/defaults/testbed.yaml, fitted or measured there).
PHYSICS = ("core_death_notice_s", "kv_pull_on_abort", "kv_heal_disconnect_s")
SHIPPED = sorted((REPO / "experiments").glob("*.yaml"))


def test_the_shipped_twin_spec_carries_each_fits_value():
    base = load_spec(None, default="testbed.yaml").engine
    notice = fit("core_death_notice_s")
    assert notice.value == statistics.median(notice.samples) == base.core_death_notice_s == 0.115
    assert len(notice.samples) == 21 and "8fd61dc" in notice.fitted_on
    heal = fit("kv_heal_disconnect_s")
    assert heal.value == pytest.approx(statistics.fmean(heal.samples)) and base.kv_heal_disconnect_s == \
        pytest.approx(round(heal.value, 2))
    with pytest.raises(KeyError, match="known: core_death_notice_s"):
        fit("nope")


def test_every_check_of_the_twin_has_a_positive_prior_under_every_kind_of_fault():
    from importlib import resources

    from analysis.compare.checks import _checks
    from analysis.rule.verdict import shipped_prior
    from core.spec.metrics import FidelityTolerances
    from analysis.rule.priors import KINDS

    checks = [m for m, _, _ in _checks(FidelityTolerances())]
    for kind in KINDS:
        for metric in checks:
            assert shipped_prior(metric, kind, 40).known, (metric, kind)  # never 0: no zero-width decision
    # the latency checks' priors are the testbed's recorded spread they cite (core/defaults/fits.yaml)
    recorded = yaml.safe_load(resources.files("core.defaults").joinpath("fits.yaml").read_text())["testbed_spread"]
    for metric in ("ttft_p50_s", "ttft_p90_s", "e2e_p50_s", "e2e_p90_s"):
        assert shipped_prior(metric).sigma == recorded["metrics"][metric]["sigma"]


def _extends_testbed(path: Path) -> bool:
    data = yaml.safe_load(path.read_text())
    return isinstance(data, dict) and data.get("extends") == "testbed.yaml"


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_a_shipped_spec_takes_the_testbeds_physics_from_one_place(path):
    """A spec that runs on the testbed extends the embedded twin spec and restates none of its measured
    physics; every other shipped spec is sized for GPU engines (a KV size per token other than the
    tiny CPU model's), a simulator study, and names none of them either."""
    text = path.read_text()
    restated = [k for k in PHYSICS if k in text]
    assert not restated, f"{path.name} restates {restated}: take them from core/defaults/testbed.yaml (extends)"
    spec = load_spec(path)
    if _extends_testbed(path):
        base = load_spec(None, default="testbed.yaml").engine
        assert all(getattr(spec.engine, k) == getattr(base, k) for k in PHYSICS)
    else:
        tiny = load_spec(None, default="testbed.yaml").topology.kv_bytes_per_token
        assert spec.topology.kv_bytes_per_token != tiny, f"{path.name} is sized for the testbed: extend testbed.yaml"


def test_every_testbed_spec_of_the_project_extends_the_twin_spec():
    testbed = {p.name for p in SHIPPED if _extends_testbed(p)}
    assert {"carryover.yaml", "engine_restart.yaml", "testbed_link_fault.yaml"} <= testbed


def test_extends_merges_mappings_replaces_lists_and_another_kind_and_refuses_a_circle(tmp_path):
    (tmp_path / "a.yaml").write_text(yaml.safe_dump({"extends": "./b.yaml", "name": "a"}))
    (tmp_path / "b.yaml").write_text(yaml.safe_dump({"extends": "./a.yaml"}))
    from core.spec.model import SpecError

    with pytest.raises(SpecError, match="makes a circle"):
        load_spec(tmp_path / "a.yaml")
    child = {"extends": "testbed.yaml", "name": "c", "engine": {"engine_start_s": 3.0},
             "workload": {"output": {"kind": "fixed", "value": 8}}, "policies": ["LC"]}
    merged = resolve_extends(child, "c", tmp_path)
    base = load_spec(None, default="testbed.yaml")
    spec = load_spec(_write(tmp_path / "c.yaml", child))
    assert spec.engine.engine_start_s == 3.0 and spec.engine.core_death_notice_s == base.engine.core_death_notice_s
    assert merged["workload"]["output"] == {"kind": "fixed", "value": 8}  # another kind: replaced whole
    assert merged["workload"]["prompt"] == yaml.safe_load((REPO / "core/defaults/testbed.yaml").read_text())[
        "workload"]["prompt"]
    assert [p.name for p in spec.policies] == ["LC"]
    with pytest.raises(SpecError, match="no embedded spec 'nope.yaml'"):
        load_spec(_write(tmp_path / "d.yaml", {"extends": "nope.yaml"}))


def _write(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def _death_run(d: Path, notice: float, call_on_it: bool = True) -> Path:
    """A testbed run: pod 2's decode core killed at 20 s, the router's down record ``notice`` later;
    request 0 decoding on pod 2 at the kill (ending error in decode, without an ``end_s`` as a failed
    request's record has none, docs/records.md) or not there; request 2 failed on pod 2 before it."""
    w = RunWriter(d, {"world": "testbed", "scenario": "death", "policy": "LC", "seed": 0, "spec": {}}, flush_s=1e9)
    if call_on_it:
        w.write(RequestRecord(0, 18.0, 500, 16, 0, 20, 0, 2, routed_s=18.0, outcome="error",
                              failed_stage="decode"))
    w.write(RequestRecord(2, 10.0, 500, 16, 0, 20, 0, 2, routed_s=10.0, end_s=12.0, outcome="error",
                          failed_stage="decode"))  # ended before the kill: no call on it then
    w.write(RequestRecord(1, 30.0, 500, 16, 10, 30, 1, 3, routed_s=30.0, first_token_s=30.5, end_s=31.0))
    w.write(FaultEvent(20.0, 0, "apply", "engine", 2, "pod2:pod2-decode/core", 0.0, 0.0))
    w.write(EngineRecord(20.0 + notice, 20, 2, "decode", "down", "EngineDeadError"))
    w.close()
    return d


def test_a_new_runs_notice_is_judged_against_the_fits_prediction_interval(tmp_path):
    low, high, coverage = prediction_interval(fit("core_death_notice_s").samples)
    assert (low, high) == (0.091, 0.186) and coverage == pytest.approx(20 / 22)
    inside = _death_run(tmp_path / "in", 0.120)
    late = _death_run(tmp_path / "late", 0.300)
    assert core_death_notices(load_run(inside)) == [pytest.approx(0.120)]
    assert core_death_notices(load_run(_death_run(tmp_path / "none", 0.5, call_on_it=False))) == []
    t = notice_table([inside, late])
    assert t["verdict"].tolist() == ["pass", "fail"] and t["notice_s"].tolist() == pytest.approx([0.12, 0.3])
    assert notice_table([tmp_path / "none"]) is None


def load_run(d: Path):
    from analysis.run.data import load_run as load

    return load(d)


def _heal_run(d: Path, failed_after: list[float], ok_after: list[float]) -> Path:
    """A testbed run: pod 0's link down from 10 s, healed at 30 s; pulls across it (prefill on pod 0)
    that started ``failed_after`` seconds after the heal failed in kv_transfer, ``ok_after`` ones
    ended ok; a pull between pods 1 and 2 after the heal failed (not across the healed link)."""
    w = RunWriter(d, {"world": "testbed", "scenario": "down", "policy": "LC", "seed": 0, "spec": {}}, flush_s=1e9)
    rid = 0
    for after, ok in [*((a, False) for a in failed_after), *((a, True) for a in ok_after)]:
        start = 30.0 + after
        w.write(RequestRecord(rid, start - 1, 500, 16, 0, 6, 0, 3, routed_s=start - 1, kv_start_s=start,
                              kv_end_s=start + 0.1 if ok else None, first_token_s=start + 0.2 if ok else None,
                              end_s=start + 1 if ok else None, outcome="ok" if ok else "error",
                              failed_stage=None if ok else "kv_transfer"))
        rid += 1
    w.write(RequestRecord(rid, 35.0, 500, 16, 2, 4, 1, 2, routed_s=35.0, kv_start_s=36.0, outcome="error",
                          failed_stage="kv_transfer"))
    for target in ("pod0:eth0/egress", "pod0:eth0/ingress"):  # as the testbed records it: a row per target
        w.write(FaultEvent(10.0, 0, "apply", "link", 0, target, 0.0, 0.0))
        w.write(FaultEvent(30.0, 0, "clear", "link", 0, target, 1.0, 1.0))
    w.close()
    return d


def test_the_heal_disconnect_fit_is_judged_on_link_down_runs_it_was_not_fitted_on(tmp_path):
    from analysis.compare.engine_death import heal_brackets, heal_table

    d = fit("kv_heal_disconnect_s").value  # 2.77 s
    agrees = _heal_run(tmp_path / "agrees", [0.5, 2.0], [3.0, 5.0])  # fails up to 2 s, works from 3 s
    early = _heal_run(tmp_path / "early", [0.5], [1.0, 4.0])  # a pull at 1 s worked: the model fails it
    (b,) = heal_brackets(load_run(agrees))
    assert b["heal_s"] == 30.0 and b["failed_starts_s"] == [0.5, 2.0] and b["ok_starts_s"] == [3.0, 5.0]
    t = heal_table([agrees, early]).set_index("run_dir")
    assert len(t) == 2  # one link down a run, though the fault shaped two targets
    assert t.loc[str(agrees), ["low_s", "high_s", "mispredicted", "verdict"]].tolist() == [2.0, 3.0, 0, "pass"]
    assert t.loc[str(early), ["mispredicted", "verdict"]].tolist() == [1, "fail"] and d > 1.0
    quiet = _heal_run(tmp_path / "quiet", [], [])
    assert heal_table([quiet])["verdict"].tolist() == ["undecided"]  # no pull after the heal
    assert heal_table([_death_run(tmp_path / "death", 0.1)]) is None  # no link down
