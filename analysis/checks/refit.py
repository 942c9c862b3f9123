"""A calibration under the run's conditions: levels and the control path fitted on a load like the run's.

`testbed calibrate` measures each engine in a phase of its own (testbed/calibration/calibrate.py):
prefills, decode steps and pulls over a wide range of prompt lengths, batch sizes, KV tokens and
bytes, with nothing else running. A run then puts the same engines under other conditions: every
engine's loop running, the router and the driver working, each call's dispatch and return leg,
the decode batches the workload makes. The calibration check (analysis/checks/calibration.py)
found the run's quiet requests slower than those fits (decode step about 30%, docs/twin.md), and
the simulator had no time at all for the control path between the stages (the router's decision
and its calls to the engines, the decode scheduler taking a pulled request in).

This module keeps each model's **shape** from the isolated calibration (how a stage's time grows
with tokens, batch, KV and bytes: the slopes, measured over a range no run's quiet requests
cover) and fits its **level** (the fixed cost: ``prefill_overhead_s``, ``decode_step_base_s``,
``kv_transfer_latency_s``) and the control path's **legs** (``prefill_call_s``,
``decode_call_s``, ``decode_join_s``: core/spec/model.py EngineSpec) on the quiet requests of runs made
under the run's conditions: the calibration load (core/calibration/fit.py ``calibration_load``: the
scenario's own workload, its faults removed, through the real router and driver on the same
engines, right after the isolated phases), or any runs named (`testbed calibrate --fit-runs`).
Each value is the one at which the median relative residual, ``(predicted - measured) /
measured``, is zero: the very statistic the calibration check judges, on the same quiet requests
and the same reconstruction (:func:`analysis.checks.calibration.quiet_samples`); the first-token
leg is priced at the decode step fitted before it. A cost cannot be negative: where the run is
faster than the isolated slopes alone predict, the level is 0 and the residual left is reported.

Only levels are fitted because the load cannot tell the slopes apart: its quiet requests decode
in batches of 1-2 and its prompts span about a factor 2, so a slope fitted there would trade
against the level within the noise (the isolated fits' R2 is 0.8-0.99 over ranges of 10x). The
fits are written beside the isolated ones (``run_<stage>`` in the file's ``fits``), each with the
value before and after and the residual on the load; the runs fitted on are named in
``source["conditions"]``, so the twin's own runs (other seeds, other policies, faults) are the
check it was not fitted on.

The file says ``conditions: run``, and the simulator then does not share the host's cores among
the engines (core/calibration/fit.py ``apply_calibration``): the levels were measured on engines that
already shared them, and the host model would count that share twice.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table
from scipy.optimize import brentq

from analysis.checks.calibration import CHECKED, predict, quiet_samples
from analysis.run.data import load_run
from analysis.run.summary import discover_runs
from core.calibration.fit import Calibration, EngineCalibration, FitReport, NetworkCalibration

# What is fitted per stage or leg, in this order (the first token's leg is priced at the decode
# step fitted before it).
LEVELS = {"prefill": "prefill_overhead_s", "decode_step": "decode_step_base_s", "kv_pull": "kv_transfer_latency_s",
          "prefill_call": "prefill_call_s", "decode_call": "decode_call_s", "first_token": "decode_join_s"}
# A stage with fewer quiet samples keeps its isolated level: a median of fewer than 10 moves by
# more than the 15% the check flags on one sample's noise (the check's p90 |residual| is 30-50%).
MIN_SAMPLES = 10


def _engine_with(engine: EngineCalibration, stage: str, value: float) -> EngineCalibration:
    return engine.model_copy(update={LEVELS[stage]: value})


def _median_residual(predicted: np.ndarray, measured: np.ndarray) -> float:
    return float(np.median((predicted - measured) / measured))


def fit_level(residual_at: Callable[[float], float], low: float, high: float) -> float:
    """The level in [``low``, ``high``...] at which ``residual_at`` (the median relative residual,
    non-decreasing in the level) crosses 0: ``low`` where it is already >= 0 there; ``high`` is
    doubled, up to 40 times, until the residual is >= 0 (ValueError beyond: no cost explains it)."""
    if residual_at(low) >= 0:
        return low
    for _ in range(40):
        if residual_at(high) >= 0:
            return float(brentq(residual_at, low, high, xtol=1e-9, rtol=1e-9))
        high *= 2.0
    raise ValueError("calibration fit: no level brings the median residual to 0")


def stage_samples(run_dirs: Sequence[Path | str], step_tol_s: float) -> dict[str, list[pd.DataFrame]]:
    """Per stage, the quiet samples of every run in or below ``run_dirs`` (one frame per run)."""
    out: dict[str, list[pd.DataFrame]] = {s: [] for s in CHECKED}
    for d in discover_runs(run_dirs):
        for stage, smp in quiet_samples(load_run(d), step_tol_s).items():
            if len(smp):
                out[stage].append(smp)
    return out


def fit_run_conditions(run_dirs: Sequence[Path | str], isolated: Calibration) -> Calibration:
    """The calibration with each stage's level fitted on the quiet requests of the runs in or below
    ``run_dirs`` (module docstring); slopes, KV geometry, host and every other field stay
    ``isolated``'s, and the file says ``conditions: run`` once a level was fitted (none fitted:
    ``isolated``'s conditions). Raises ValueError when no run is found."""
    runs = discover_runs(run_dirs)  # a path without runs raises its own one-line error
    engine, network = isolated.engine, isolated.network
    samples = stage_samples(runs, engine.decode_step_base_s)
    fits: dict[str, FitReport] = {}
    levels: dict[str, dict[str, float]] = {}
    for stage in LEVELS:
        frames = samples[stage]
        n = sum(len(f) for f in frames)
        before = getattr(engine, LEVELS[stage])
        if n < MIN_SAMPLES:
            levels[stage] = {"isolated": before, "run": before, "n": n, "kept": 1.0}
            continue
        measured = np.concatenate([f["measured_s"].to_numpy(float) for f in frames])

        def predicted(level: float, stage: str = stage, frames: list[pd.DataFrame] = frames) -> np.ndarray:
            e = _engine_with(engine, stage, level)
            return np.concatenate([predict(stage, f, e, network) for f in frames])

        # Start the search at the measured median: no fixed cost exceeds what the stage took.
        level = fit_level(lambda c: _median_residual(predicted(c), measured), 0.0, float(np.median(measured)))
        engine = _engine_with(engine, stage, level)
        miss = predicted(level) - measured
        rel, a = miss / measured, np.abs(miss)
        fits[f"run_{stage}"] = FitReport(
            params={LEVELS[stage]: level, f"isolated_{LEVELS[stage]}": before,
                    "rel_residual_p50_before": _median_residual(predicted(before), measured),
                    "rel_residual_p50": float(np.median(rel)), "abs_rel_residual_p90": float(np.percentile(np.abs(rel), 90))},
            r2=math.nan, n=int(n), n_outliers=0, residual_p50_s=float(np.percentile(a, 50)),
            residual_p90_s=float(np.percentile(a, 90)))
        levels[stage] = {"isolated": before, "run": level, "n": n, "kept": 0.0}
    source = {**isolated.source, "conditions": {
        "kind": "run", "runs": [str(Path(r)) for r in runs],
        "levels": levels, "note": "analysis/checks/refit.py: slopes isolated, levels fitted on these runs"}}
    return isolated.model_copy(update={"engine": EngineCalibration.model_validate(engine.model_dump()),
                                       "network": NetworkCalibration.model_validate(network.model_dump()),
                                       "fits": {**isolated.fits, **fits}, "source": source,
                                       "conditions": "run" if fits else isolated.conditions})


def fit_under_run(isolated: Path, load_dir: Path, out: Path, console: Console) -> Path:
    """The calibration under the run's conditions: ``isolated``'s fits with each stage's level and the
    control path's legs fitted on the runs in ``load_dir`` (:func:`fit_run_conditions`), written to
    ``out`` and shown on ``console``."""
    from core.calibration.fit import load_calibration, save_calibration

    cal = fit_run_conditions([load_dir], load_calibration(isolated))
    save_calibration(cal, out)
    print_levels(cal, console)
    return out


def print_levels(cal: Calibration, console: Console) -> None:
    """What the fit changed: per stage and leg, the isolated value, the one fitted under the run,
    the quiet samples and the median residual on them before and after."""
    t = Table(title="Calibration under the run's conditions (levels and legs fitted on the calibration load)")
    for h in ("stage", "parameter", "isolated", "under the run", "quiet samples", "residual p50 before → after",
              "|residual| p90"):
        t.add_column(h)
    for stage, name in LEVELS.items():
        f = cal.fits.get(f"run_{stage}")
        if f is None:
            t.add_row(stage, name, "–", "kept (too few samples)", "–", "–", "–")
            continue
        p = f.params
        t.add_row(stage, name, f"{1e3 * p[f'isolated_{name}']:.2f} ms", f"{1e3 * p[name]:.2f} ms", str(f.n),
                  f"{100 * p['rel_residual_p50_before']:+.0f}% → {100 * p['rel_residual_p50']:+.0f}%",
                  f"{100 * p['abs_rel_residual_p90']:.0f}%")
    console.print(t)


# What the spread of several calibrations is taken over: every engine speed and leg the simulator
# is given (the calibration's float engine fields; block sizes are not measured), and the link rate.
SPREAD_PARAMS = (*(f"engine.{k}" for k, f in EngineCalibration.model_fields.items() if f.annotation is float),
                 "network.unshaped_gbps", "network.kv_wire_overhead")


def calibration_spread(cals: Sequence[Calibration]) -> pd.DataFrame:
    """Per parameter (:data:`SPREAD_PARAMS`) over several calibrations: each one's value
    (``cal_1`` ...), the mean, the sample standard deviation, the coefficient of variation (sd over
    mean) and the ratio of the largest to the smallest."""
    if len(cals) < 2:
        raise ValueError("calibration spread: at least 2 calibrations")
    rows = []
    for name in SPREAD_PARAMS:
        block, key = name.split(".")
        v = np.array([getattr(getattr(c, block), key) for c in cals], float)
        mean, sd = float(v.mean()), float(v.std(ddof=1))
        rows.append({"parameter": name, **{f"cal_{i + 1}": x for i, x in enumerate(v)}, "mean": mean, "sd": sd,
                     "cv": sd / mean if mean > 0 else math.nan,
                     "max_over_min": float(v.max() / v.min()) if v.min() > 0 else math.nan})
    return pd.DataFrame(rows)


def print_spread(table: pd.DataFrame, console: Console) -> None:
    t = Table(title=f"Calibration spread over {sum(c.startswith('cal_') for c in table.columns)} calibrations "
                    "on freshly started engines")
    for h in ("parameter", "mean", "sd", "cv", "max / min"):
        t.add_column(h)
    for _, r in table.iterrows():
        t.add_row(r["parameter"], f"{r['mean']:.4g}", f"{r['sd']:.3g}",
                  "–" if pd.isna(r["cv"]) else f"{100 * r['cv']:.0f}%",
                  "–" if pd.isna(r["max_over_min"]) else f"{r['max_over_min']:.2f}")
    console.print(t)
