"""Calibration: the testbed's engines and links measured, fitted into the simulator's parameters.

``testbed calibrate`` measures on the running testbed (``testbed/calibration/calibrate.py``);
this module holds what is world-independent: the samples, the robust fits, the
calibration file (pydantic at the file boundary, one-line errors) and how a
calibration turns a spec into the simulator's model of the same cluster.

The fitted models are the simulator's own (``simulator/cluster.py``):

* prefill batch: ``seconds = prefill_overhead_s + tokens / prefill_tokens_per_s``;
* decode step: ``seconds = decode_step_base_s + decode_step_per_seq_s * batch
  + decode_step_per_kv_token_s * kv_tokens``;
* a KV pull through a link shaped to ``rate`` bit/s:
  ``seconds = latency + 8 * bytes * kv_wire_overhead / rate``;
  through an unshaped link: ``seconds = kv_transfer_latency_s + bytes / unshaped_Bps``
  (the fixed cost is taken from the unshaped pulls, where bytes are cheap);
* the host: the cores the engines may run on and how many engines share them
  (:class:`HostCalibration`); where CPU engines outnumber the cores the simulator shares them
  (``engine.host_cores``: docs/simulator.md "The host model"), and a concurrent phase checks
  that model's slowdown against the one measured with several engines busy at once.

Every fit is a robust linear least squares on relative residuals: from a start
with a Cauchy loss, samples whose residual exceeds 3 robust scales (1.4826 x the
residuals' MAD) and 0.1 s are set aside and the line is refitted on the rest
with scipy's ``least_squares`` and the ``soft_l1`` loss, until the set is stable. So the host stalls of a 2-core machine (docs/verified.md "Host stalls on two cores":
pulls and steps that stall for seconds) do not drag the line; they are counted
as outliers and reported with the fit, as are R^2 (on the inliers), residual
percentiles and sample counts.

A calibration **under the run's conditions** keeps those fits' slopes and fits each stage's level
and the control path's legs on the quiet requests of runs (analysis/checks/refit.py): the
**calibration load**, the scenario's own workload with its faults removed (:func:`calibration_load`),
run through the real router on the same engines right after the isolated phases.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from scipy.optimize import least_squares

from core.util.errors import first_error
from core.util.files import write_json_atomic
from vocab import MeasuredDemand

from core.spec.model import ExperimentSpec
from core.topology import GBPS

# A sample counts as an outlier (a host stall, not the model) when its residual is this many
# robust scales (1.4826 x MAD) above the fit, and at least OUTLIER_FLOOR_S.
OUTLIER_SCALES = 3.0
OUTLIER_FLOOR_S = 0.1

# The calibration load's seeds: far from any seed a twin or a study names (0, 1, 2, ...), so the
# runs a calibration is fitted on are never the runs it is judged on.
LOAD_SEEDS = (1000, 1001)
LOAD_DIR = "calibration-load"  # beside a calibration under the run's conditions: the load's runs


def isolated_of(path: Path) -> Path:
    """Where the engines-alone calibration goes beside the calibration fitted under the run at ``path``."""
    return path.with_name(f"{path.stem}-isolated{path.suffix}")
# With no fault the policies route by load (the price adds utilisation, which load already orders):
# LC, the baseline, where the spec has it.
LOAD_POLICY = "LC"


def calibration_load(spec: ExperimentSpec) -> tuple[ExperimentSpec, list[str], list[int]]:
    """The calibration load of ``spec`` as a testbed job (spec, policies, seeds): its workload,
    engines, router and topology as they are, its faults removed (a fault window leaves no request
    quiet), run with :data:`LOAD_POLICY` (else the spec's first policy) on :data:`LOAD_SEEDS`."""
    names = [p.name for p in spec.policies]
    policy = LOAD_POLICY if LOAD_POLICY in names else names[0]
    return ExperimentSpec.model_validate({**spec.model_dump(), "faults": []}), [policy], list(LOAD_SEEDS)


class CalibrationError(ValueError):
    """A calibration file that cannot be used; the message is one line naming the file."""


# --------------------------------------------------------------------------- fits


@dataclass(frozen=True)
class LinearFit:
    coef: np.ndarray  # one per column of the design matrix
    r2: float  # on the inliers
    n: int
    n_outliers: int
    residual_p50_s: float  # |residual| percentiles over all samples
    residual_p90_s: float

    def report(self, names: Sequence[str]) -> dict[str, Any]:
        return {"params": {k: float(v) for k, v in zip(names, self.coef)}, "r2": self.r2, "n": self.n,
                "n_outliers": self.n_outliers, "residual_p50_s": self.residual_p50_s,
                "residual_p90_s": self.residual_p90_s}


def _mad_scale(r: np.ndarray) -> float:
    return max(1.4826 * float(np.median(np.abs(r - np.median(r)))), 1e-6)


def robust_linear_fit(X: np.ndarray, y: np.ndarray, nonneg: bool = True) -> LinearFit:
    """y ~ X @ coef, robustly (module docstring), in relative terms: the timings span two orders
    of magnitude and their noise grows with them, so residuals are taken over the prediction.
    Coefficients are non-negative by default: every term of the simulator's models is a cost."""
    X, y = np.asarray(X, float), np.asarray(y, float)
    if X.ndim != 2 or len(X) != len(y):
        raise ValueError("calibration fit: X must be (n, k) and y (n,)")
    n, k = X.shape
    if n < k + 1:
        raise ValueError(f"calibration fit: {n} samples cannot fit {k} parameters")
    lo, hi = (np.zeros(k) if nonneg else np.full(k, -np.inf)), np.full(k, np.inf)
    floor = max(1e-3, 0.01 * float(np.median(np.abs(y))))

    def fit(keep: np.ndarray, c0: np.ndarray, loss: str, f_scale: float) -> np.ndarray:
        w = 1.0 / np.maximum(X[keep] @ c0, floor)  # relative residuals, weights from the last estimate
        x0 = np.clip(c0, lo + 1e-12, None) if nonneg else c0
        return least_squares(lambda c: (X[keep] @ c - y[keep]) * w, x0, bounds=(lo, hi), loss=loss,
                             f_scale=f_scale).x

    # Start: ordinary least squares, then a Cauchy loss at a 5% relative scale, which all but
    # ignores stalls of seconds, for a line the stalls have not dragged.
    coef = np.linalg.lstsq(X, y, rcond=None)[0]
    coef = fit(np.ones(n, bool), coef, "cauchy", 0.05)
    outlier = np.zeros(n, bool)
    for _ in range(10):
        pred = np.maximum(X @ coef, floor)
        rel = (y - pred) / pred
        scale = _mad_scale(rel[~outlier])
        new = (np.abs(rel) > OUTLIER_SCALES * scale) & (np.abs(y - pred) > OUTLIER_FLOOR_S)
        if n - new.sum() < k + 1:
            break
        coef = fit(~new, coef, "soft_l1", scale)
        if (new == outlier).all():
            break
        outlier = new
    resid = y - X @ coef
    yi, ri = y[~outlier], resid[~outlier]
    ss_tot = float(((yi - yi.mean()) ** 2).sum())
    r2 = 1.0 - float((ri ** 2).sum()) / ss_tot if ss_tot > 0 else math.nan
    a = np.abs(resid)
    return LinearFit(coef, r2, n, int(outlier.sum()), float(np.percentile(a, 50)), float(np.percentile(a, 90)))


def fit_prefill(tokens: Sequence[float], seconds: Sequence[float]) -> LinearFit:
    """Prefill batch time against its prompt tokens: coef = (overhead_s, seconds per token)."""
    t = np.asarray(tokens, float)
    return robust_linear_fit(np.c_[np.ones_like(t), t], np.asarray(seconds, float))


def fit_decode(batch: Sequence[float], kv_tokens: Sequence[float], step_s: Sequence[float]) -> LinearFit:
    """Decode step time: coef = (base_s, per sequence, per KV token)."""
    b = np.asarray(batch, float)
    return robust_linear_fit(np.c_[np.ones_like(b), b, np.asarray(kv_tokens, float)], np.asarray(step_s, float))


def fit_pull(nbytes: Sequence[float], rate_bps: Sequence[float], seconds: Sequence[float]) -> LinearFit:
    """KV pulls through shaped links: coef = (latency_s, wire bytes per KV byte)."""
    x = 8.0 * np.asarray(nbytes, float) / np.asarray(rate_bps, float)
    return robust_linear_fit(np.c_[np.ones_like(x), x], np.asarray(seconds, float))


def fit_unshaped_pull(nbytes: Sequence[float], seconds: Sequence[float]) -> LinearFit:
    """KV pulls over unshaped links: coef = (latency_s, seconds per byte)."""
    b = np.asarray(nbytes, float)
    return robust_linear_fit(np.c_[np.ones_like(b), b], np.asarray(seconds, float))


def stall_stats(gaps_s: Sequence[float], typical_s: float) -> dict[str, float]:
    """Host noise from engine step gaps: a gap over 5x the typical step and at least 0.1 s is a
    stall (the engine did not step; nothing in the model explains it)."""
    g = np.asarray(gaps_s, float)
    limit = max(5.0 * typical_s, OUTLIER_FLOOR_S)
    st = g[g > limit]
    return {"n_steps": int(g.size), "n_stalls": int(st.size),
            "stall_rate_per_step": float(st.size / g.size) if g.size else math.nan,
            "stall_time_share": float((st - typical_s).sum() / g.sum()) if g.size and g.sum() > 0 else math.nan,
            "stall_p50_s": float(np.median(st)) if st.size else 0.0,
            "stall_max_s": float(st.max()) if st.size else 0.0, "stall_threshold_s": limit}


def pull_noise(shaped: Sequence[Sequence[float]], first: Sequence[Sequence[float]]) -> dict[str, float]:
    """What a shaped pull's stage adds to its wire, from rows (bytes, rate bit/s, NIXL seconds,
    stage seconds): the host's delay before and around the read (``pull_start_*``, stage minus
    NIXL), and the first pull after a rate change against bytes / rate (``rate_change_*``)."""
    out: dict[str, float] = {}
    s = np.asarray(shaped, float).reshape(-1, 4)
    if len(s):
        extra = np.maximum(s[:, 3] - s[:, 2], 0.0)
        out |= {"pull_start_p50_s": float(np.median(extra)), "pull_start_p90_s": float(np.percentile(extra, 90)),
                "pull_start_max_s": float(extra.max())}
    f = np.asarray(first, float).reshape(-1, 4)
    if len(f):
        ratio = f[:, 2] / (8.0 * f[:, 0] / f[:, 1])
        out |= {"rate_change_n": float(len(f)), "rate_change_wire_ratio_max": float(ratio.max()),
                "rate_change_wire_ratio_p50": float(np.median(ratio))}
    return out


# --------------------------------------------------------------------------- the file


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EngineCalibration(_Model):
    """The simulator's engine parameters (names as in ``EngineSpec``), measured."""

    prefill_tokens_per_s: float = Field(gt=0)
    prefill_overhead_s: float = Field(ge=0)
    decode_step_base_s: float = Field(gt=0)
    decode_step_per_seq_s: float = Field(ge=0)
    decode_step_per_kv_token_s: float = Field(ge=0)
    decode_kv_tokens: int = Field(ge=1)
    kv_block_tokens: int = Field(ge=1)
    kv_transfer_latency_s: float = Field(ge=0)
    # The control path (core/spec/model.py EngineSpec): fitted under the run's conditions only
    # (analysis/checks/refit.py); an isolated calibration leaves them 0.
    prefill_call_s: float = Field(0.0, ge=0)
    decode_call_s: float = Field(0.0, ge=0)
    decode_join_s: float = Field(0.0, ge=0)


class NetworkCalibration(_Model):
    """The simulator's link parameters (names as in ``TopologySpec``), measured."""

    kv_bytes_per_token: int = Field(ge=1)
    kv_wire_overhead: float = Field(ge=1.0)
    # A pod's link when nothing shapes it (the veth and UCX over TCP on the host's cores).
    unshaped_gbps: float = Field(gt=0)


class HostCalibration(_Model):
    """The host the engines run on, measured (``testbed/calibration/calibrate.py`` measure_host)."""

    # CPUs the engines' processes may run on (the union of their affinities) on the host that has
    # the most engines; machines told apart by their boot id (an emulated cluster's pods are one)
    cores: float = Field(gt=0)
    engines: int = Field(ge=1)  # engines on that host
    hosts: int = Field(ge=1)  # machines the engines run on
    gpus_per_engine: int = Field(ge=0)
    shared: bool  # core.host_model.host_shared: the simulator then shares the cores (engine.host_cores)
    # The concurrent phase: prefills timed with several engines busy at once against alone, and the
    # host model's slowdown for the same demand (calibrate's module docstring). Empty if not run.
    concurrent: dict[str, float] = Field(default_factory=dict)
    # Demand by state, in cores, measured in the concurrent phase's demand window (calibrate's
    # module docstring): ``hold``, ``pull``, ``decode`` (engine.host_hold_cores, host_pull_cores,
    # host_decode_cores) and ``background`` (engine.host_background_cores); a key not measured
    # leaves the spec's. Empty in a file from before it was measured.
    demand: dict[MeasuredDemand, float] = Field(default_factory=dict)
    # How long each engine's worker spins after a call (engine.host_spin_s), from the executor the
    # engines ran (core.host_model.worker_spin_s); None in a file from before it was recorded: the
    # spec's stands.
    spin_s: float | None = Field(None, ge=0, allow_inf_nan=False)

    @field_validator("demand")
    @classmethod
    def _demand_finite(cls, v: dict[str, float]) -> dict[str, float]:
        bad = {k: x for k, x in v.items() if not math.isfinite(x) or x < 0 or (k != "background" and x == 0)}
        if bad:
            raise ValueError(f"demand must be finite cores, > 0 (background >= 0): {bad}")
        return v


class FitReport(_Model):
    params: dict[str, float]
    r2: float | None
    n: int = Field(ge=0)
    n_outliers: int = Field(ge=0)
    residual_p50_s: float
    residual_p90_s: float


class Calibration(_Model):
    version: Literal[1] = 1
    created: str
    source: dict[str, Any]  # model, engine settings, host: what was measured
    engine: EngineCalibration
    network: NetworkCalibration
    fits: dict[str, FitReport]
    # Per engine pair: its first decode call (the NIXL handshake) beyond a second one of the same size.
    handshake_s: list[float] = Field(default_factory=list)
    noise: dict[str, float] = Field(default_factory=dict)
    samples: dict[str, list[list[float]]] = Field(default_factory=dict)
    # None: a file from before the host was measured; the spec's own engine.host_cores then stands.
    host: HostCalibration | None = None
    # "isolated": each engine measured alone (testbed/calibration/calibrate.py); "run": its levels
    # and legs fitted under the run's conditions (analysis/checks/refit.py), the host's share
    # of the cores in them.
    conditions: Literal["isolated", "run"] = "isolated"


def load_calibration(path: str | Path) -> Calibration:
    """Read and validate a calibration file; every problem is one line naming the file."""
    p = Path(path)
    if not p.is_file():
        raise CalibrationError(f"{p}: calibration file not found")
    try:
        data = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CalibrationError(f"{p}: not a calibration file (invalid JSON: {e})") from None
    if not isinstance(data, dict):
        raise CalibrationError(f"{p}: not a calibration file (a JSON object expected, got {type(data).__name__})")
    try:
        return Calibration.model_validate(data)
    except ValidationError as e:
        loc, msg, _, more = first_error(e)
        raise CalibrationError(f"{p}: invalid calibration at {loc}: {msg}{more}") from None


def save_calibration(cal: Calibration, path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(p, cal.model_dump(mode="json"), indent=1)
    return p


def apply_calibration(spec: ExperimentSpec, cal: Calibration) -> ExperimentSpec:
    """The spec as the simulator should run it to model the calibrated testbed: the engine's
    measured speeds and KV geometry; each worker's NIC and the pods' core links at the unshaped
    rate measured (one engine pair per link on the emulated cluster), with the headers on the wire;
    the host's cores where the engines share them (``engine.host_cores``; None where they do not:
    one accelerator per engine, or where a calibration under the run's conditions holds the host's
    share in its levels already), with the demand by state measured there
    (``engine.host_*_cores``). The topology's structure, the link baseline (what a fault's r is
    relative to), the workload, faults and everything else stay the spec's."""
    n = cal.network
    wire_gbps = n.unshaped_gbps * n.kv_wire_overhead  # the fit is of KV bytes; links carry headers too
    topo = spec.topology.model_copy(update={
        "nic_gbps": wire_gbps, "uplink_gbps": wire_gbps * spec.topology.workers_per_pod,
        "kv_bytes_per_token": n.kv_bytes_per_token, "kv_wire_overhead": n.kv_wire_overhead})
    update = cal.engine.model_dump()
    if cal.conditions == "run":
        # The levels were fitted on a run's own requests, whose engines already shared the host's
        # cores with each other, the router and the driver: the host model would share them a
        # second time (docs/twin.md "A calibration under the run's conditions": E2E p50 16-26%
        # slow with it, 8% fast to 3% slow without, in the twin at 5760e6a).
        update["host_cores"] = None
    elif cal.host is not None:
        update["host_cores"] = cal.host.cores if cal.host.shared else None
        if cal.host.shared:
            update |= {f"host_{k}_cores": v for k, v in cal.host.demand.items()}
            if cal.host.spin_s is not None:
                update["host_spin_s"] = cal.host.spin_s
    engine = spec.engine.model_copy(update=update)
    # validate the result as a whole (model_copy does not)
    return ExperimentSpec.model_validate({**spec.model_dump(), "topology": topo.model_dump(),
                                          "engine": engine.model_dump()})


def calibration_from_fits(*, created: str, source: dict[str, Any], prefill: LinearFit, decode: LinearFit,
                          pull: LinearFit, unshaped: LinearFit, kv_bytes_per_token: int, kv_block_tokens: int,
                          decode_kv_tokens: int, handshake_s: Sequence[float], noise: dict[str, float],
                          samples: dict[str, list[list[float]]], host: HostCalibration | None = None) -> Calibration:
    """Assemble the file from the four fits (see the module docstring for their models) and the host."""
    overhead, s_per_token = prefill.coef
    base, per_seq, per_kv = decode.coef
    # The fixed cost of a pull is best seen where bytes are cheap: the unshaped fit's intercept
    # (a shaped pull's seconds of bytes dwarf it); the shaped fit gives the bytes on the wire.
    _, wire = pull.coef
    latency, s_per_byte = unshaped.coef
    return Calibration(
        created=created, source=source,
        engine=EngineCalibration(
            prefill_tokens_per_s=1.0 / max(s_per_token, 1e-12), prefill_overhead_s=float(overhead),
            decode_step_base_s=max(float(base), 1e-6), decode_step_per_seq_s=float(per_seq),
            decode_step_per_kv_token_s=float(per_kv), decode_kv_tokens=int(decode_kv_tokens),
            kv_block_tokens=int(kv_block_tokens), kv_transfer_latency_s=float(latency)),
        network=NetworkCalibration(kv_bytes_per_token=int(kv_bytes_per_token), kv_wire_overhead=max(float(wire), 1.0),
                                   unshaped_gbps=1.0 / max(s_per_byte, 1e-15) / GBPS),
        fits={"prefill": FitReport(**prefill.report(["prefill_overhead_s", "prefill_s_per_token"])),
              "decode_step": FitReport(**decode.report(["decode_step_base_s", "decode_step_per_seq_s",
                                                        "decode_step_per_kv_token_s"])),
              "kv_pull_shaped": FitReport(**pull.report(["kv_transfer_latency_s", "kv_wire_overhead"])),
              "kv_pull_unshaped": FitReport(**unshaped.report(["kv_transfer_latency_s", "unshaped_s_per_byte"]))},
        handshake_s=[float(h) for h in handshake_s], noise=noise, samples=samples, host=host)
