"""Turn a `WorkloadSpec` into a request stream (numpy arrays, vectorised).

`generate` draws, in this order, arrival times, then prompt lengths, then
output lengths from the given `numpy.random.Generator`, so one seed gives one
workload. Synthetic arrivals are an ordinary renewal process: the first
request arrives one inter-arrival time after 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from workloads.spec import (
    ChoiceLength,
    FixedLength,
    LogNormalLength,
    PoissonArrival,
    TraceArrival,
    UniformLength,
    WorkloadError,
    WorkloadSpec,
)
from workloads.trace import Trace, load_trace


@dataclass(frozen=True, slots=True)
class Request:
    request_id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class Workload:
    """A request stream: parallel arrays, sorted by arrival, ids 0..n-1.

    `duration_s` is the window the stream covers (the spec's duration_s, or
    the last arrival when none was given); the rate helpers divide by it.
    The arrays are made read-only so the dataclass is frozen in substance.
    `trace` describes a replayed trace (file, format, rows read, dropped,
    clipped); empty for synthetic arrivals.
    """

    arrival_s: np.ndarray  # float64, ascending
    prompt_tokens: np.ndarray  # int64 >= 1
    output_tokens: np.ndarray  # int64 >= 1
    duration_s: float
    trace: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        a = np.array(self.arrival_s, dtype=np.float64)
        p = np.array(self.prompt_tokens, dtype=np.int64)
        o = np.array(self.output_tokens, dtype=np.int64)
        if not (a.ndim == p.ndim == o.ndim == 1 and a.shape == p.shape == o.shape):
            raise WorkloadError(
                f"workload arrays must be 1-D and equally long, got {a.shape}, {p.shape}, {o.shape}"
            )
        if a.size and (np.any(np.diff(a) < 0) or a[0] < 0):
            raise WorkloadError("workload arrival_s must be >= 0 and sorted ascending")
        if p.size and (p.min() < 1 or o.min() < 1):
            raise WorkloadError("workload token counts must be >= 1")
        for name, arr in (("arrival_s", a), ("prompt_tokens", p), ("output_tokens", o)):
            arr.setflags(write=False)
            object.__setattr__(self, name, arr)
        object.__setattr__(self, "duration_s", float(self.duration_s))

    def __len__(self) -> int:
        return int(self.arrival_s.shape[0])

    def __getitem__(self, i: int) -> Request:
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"request index {i} out of range for {n} requests")
        i %= n
        return Request(
            i, float(self.arrival_s[i]), int(self.prompt_tokens[i]), int(self.output_tokens[i])
        )

    def requests(self) -> Iterator[Request]:
        """Requests in arrival order, with ids 0..n-1 and plain Python scalars."""
        # tolist() once: far faster than indexing numpy scalars per request.
        rows = zip(self.arrival_s.tolist(), self.prompt_tokens.tolist(), self.output_tokens.tolist())
        for i, (t, p, o) in enumerate(rows):
            yield Request(i, t, p, o)

    def __iter__(self) -> Iterator[Request]:
        return self.requests()

    def offered_rate_rps(self) -> float:
        return len(self) / self.duration_s if self.duration_s > 0 else math.nan

    def offered_prompt_tokens_per_s(self) -> float:
        return float(self.prompt_tokens.sum()) / self.duration_s if self.duration_s > 0 else math.nan

    def offered_output_tokens_per_s(self) -> float:
        return float(self.output_tokens.sum()) / self.duration_s if self.duration_s > 0 else math.nan

    def summary(self) -> dict[str, float]:
        """Plain numbers for run.json and logs."""
        n = len(self)
        med = (lambda x: float(np.median(x))) if n else (lambda x: math.nan)
        return {
            "n_requests": n,
            "duration_s": self.duration_s,
            "offered_rate_rps": self.offered_rate_rps(),
            "offered_prompt_tokens_per_s": self.offered_prompt_tokens_per_s(),
            "offered_output_tokens_per_s": self.offered_output_tokens_per_s(),
            "median_prompt_tokens": med(self.prompt_tokens),
            "median_output_tokens": med(self.output_tokens),
            **({"trace": dict(self.trace)} if self.trace else {}),
        }


# --------------------------------------------------------------------------- lengths


def sample_lengths(spec, n: int, rng: np.random.Generator) -> np.ndarray:
    """n token counts (int64, >= 1, within spec.min/max) from a length spec."""
    if isinstance(spec, FixedLength):
        x = np.full(n, spec.value, dtype=np.int64)
    elif isinstance(spec, UniformLength):
        x = rng.integers(spec.low, spec.high, size=n, endpoint=True, dtype=np.int64)
    elif isinstance(spec, LogNormalLength):
        x = np.rint(rng.lognormal(math.log(spec.median), spec.sigma, size=n))
        # Clip in float first: a huge sigma can exceed the int64 range.
        x = np.clip(x, 1, 2**62).astype(np.int64)
    elif isinstance(spec, ChoiceLength):
        x = rng.choice(np.asarray(spec.values, dtype=np.int64), size=n, p=spec.probabilities)
    else:  # the spec union is closed; this guards against a new kind left unhandled
        raise WorkloadError(f"unsupported length spec {type(spec).__name__}")
    lo = max(1, spec.min or 1)
    hi = spec.max if spec.max is not None else None
    return np.clip(x, lo, hi).astype(np.int64, copy=False)


# --------------------------------------------------------------------------- arrivals


def _gaps(arrival, n: int, rng: np.random.Generator) -> np.ndarray:
    if isinstance(arrival, PoissonArrival):
        return rng.exponential(1.0 / arrival.rate_rps, size=n)
    # Gamma with shape k = 1/cv^2 and scale 1/(rate k): mean 1/rate, std/mean cv.
    k = 1.0 / (arrival.cv * arrival.cv)
    return rng.gamma(k, 1.0 / (arrival.rate_rps * k), size=n)


def _synthetic_arrivals(spec: WorkloadSpec, rng: np.random.Generator) -> np.ndarray:
    arrival = spec.arrival
    cap = spec.max_requests
    if spec.duration_s is None:
        return np.cumsum(_gaps(arrival, cap, rng))
    # Draw in chunks sized to cover the window with high probability; the
    # count of a renewal process has variance ~ cv^2 * mean, so pad by 6 sd.
    cv = getattr(arrival, "cv", 1.0)
    mean = arrival.rate_rps * spec.duration_s
    chunk = int(mean + 6.0 * cv * math.sqrt(mean) + 16)
    if cap is not None:
        chunk = min(chunk, cap)
    parts: list[np.ndarray] = []
    t, count = 0.0, 0
    while t < spec.duration_s and (cap is None or count < cap):
        part = t + np.cumsum(_gaps(arrival, chunk, rng))
        parts.append(part)
        t, count = float(part[-1]), count + chunk
    times = np.concatenate(parts) if len(parts) > 1 else parts[0]
    times = times[: np.searchsorted(times, spec.duration_s, side="left")]
    return times[:cap] if cap is not None else times


def _window(tr: Trace, arrival: TraceArrival, path: Path):
    """Row indices of the trace inside [start_s, end_s) of its own clock."""
    a = tr.arrival_s
    lo = int(np.searchsorted(a, arrival.start_s, side="left")) if arrival.start_s > 0 else 0
    hi = int(np.searchsorted(a, arrival.end_s, side="left")) if arrival.end_s is not None else len(a)
    if hi <= lo:
        end = f"{arrival.end_s:g}" if arrival.end_s is not None else "end"
        raise WorkloadError(
            f"trace {path}: no requests in the window [{arrival.start_s:g}, {end}) s; "
            f"its {len(a)} requests lie in [{a[0]:g}, {a[-1]:g}] s"
        )
    return np.arange(lo, hi)


def _too_long(tr: Trace, idx: np.ndarray, limit: int, path: Path) -> WorkloadError:
    """The refusal of the first row (in replay order) needing more than `limit` tokens."""
    j = int(idx[0])
    p, o = int(tr.prompt_tokens[j]), int(tr.output_tokens[j])
    pc, oc = tr.columns[1], tr.columns[2]
    return WorkloadError(
        f"trace {path}, {tr.where(j)}: {pc} + {oc} = {p} + {o} = {p + o} tokens, more than "
        f"max_context_tokens {limit} (too_long: refuse; clip or drop replays the trace)"
    )


def _trace_workload(spec: WorkloadSpec, base_dir: str | Path | None) -> Workload:
    arrival: TraceArrival = spec.arrival
    path = Path(arrival.path)
    if base_dir is not None and not path.is_absolute():
        path = Path(base_dir) / path
    tr = load_trace(path, arrival.format)
    info: dict[str, Any] = {"path": str(path), "format": tr.format, "rows": len(tr)}
    info.update({f"dropped_{k}": v for k, v in tr.dropped.items()})

    # Window on the trace's clock; `idx` maps each request back to its trace row.
    idx = np.arange(len(tr))
    if arrival.start_s > 0 or arrival.end_s is not None:
        idx = _window(tr, arrival, path)
        info["in_window"] = len(idx)
    a = tr.arrival_s[idx] - arrival.start_s if arrival.start_s > 0 else tr.arrival_s[idx]
    p, o = tr.prompt_tokens[idx], tr.output_tokens[idx]

    limit = arrival.max_context_tokens
    if limit is not None and arrival.too_long != "refuse":
        over = p + o > limit
        n_over = int(over.sum())
        if arrival.too_long == "drop" and n_over:
            if n_over == len(idx):
                raise WorkloadError(
                    f"trace {path}: all {n_over} requests need more than max_context_tokens {limit} "
                    "tokens (too_long: drop)"
                )
            keep = ~over
            a, p, o, idx = a[keep], p[keep], o[keep], idx[keep]
            info["dropped_too_long"] = n_over
        elif arrival.too_long == "clip" and n_over:
            # Cut the prompt first; the output only where it alone fills the context.
            o = np.minimum(o, limit - 1)
            p = np.minimum(p, limit - o)
            info["clipped_too_long"] = n_over

    a = a / arrival.speedup if arrival.speedup is not None else a * arrival.time_scale
    n = len(a)
    if arrival.loop:
        # One copy lasts from 0 to the last arrival plus one mean gap, so the
        # seam between copies looks like the trace's own spacing.
        span = float(a[-1] - a[0])
        period = float(a[-1]) + (span / (n - 1) if n > 1 else 0.0)
        if period <= 0:
            raise WorkloadError(f"trace {path}: cannot loop a trace whose arrivals all lie at 0 s")
        copies = []
        if spec.duration_s is not None:
            copies.append(math.ceil(spec.duration_s / period) + 1)
        if spec.max_requests is not None:
            copies.append(math.ceil(spec.max_requests / n))
        k = min(copies)
        a = (a[None, :] + period * np.arange(k)[:, None]).ravel()
        p, o, idx = np.tile(p, k), np.tile(o, k), np.tile(idx, k)
    m = len(a)
    if spec.duration_s is not None:
        m = int(np.searchsorted(a, spec.duration_s, side="left"))
    if spec.max_requests is not None:
        m = min(m, spec.max_requests)
    a, p, o, idx = a[:m], p[:m], o[:m], idx[:m]
    if limit is not None and arrival.too_long == "refuse":
        # Only what is replayed is checked: a long row past the cut is no reason to refuse.
        over = p + o > limit
        if over.any():
            raise _too_long(tr, idx[over], limit, path)
    duration = spec.duration_s if spec.duration_s is not None else (float(a[-1]) if m else 0.0)
    return Workload(a, p, o, duration, info)


def generate(
    spec: WorkloadSpec, rng: np.random.Generator, *, base_dir: str | Path | None = None
) -> Workload:
    """The request stream a spec describes.

    Synthetic: arrivals in [0, duration_s) (at most max_requests), then
    lengths. Trace: the file's rows (sorted), the window [start_s, end_s)
    shifted to 0, the context rule, arrival times times time_scale (or over
    speedup), looped if asked, cut to [0, duration_s) and max_requests; `rng`
    is unused.
    A relative trace path is resolved against `base_dir` when given (e.g. the
    experiment file's folder), else against the working directory.
    """
    if isinstance(spec.arrival, TraceArrival):
        return _trace_workload(spec, base_dir)
    arrival_s = _synthetic_arrivals(spec, rng)
    n = arrival_s.shape[0]
    prompt = sample_lengths(spec.prompt, n, rng)
    output = sample_lengths(spec.output, n, rng)
    duration = spec.duration_s if spec.duration_s is not None else (float(arrival_s[-1]) if n else 0.0)
    return Workload(arrival_s, prompt, output, duration)
