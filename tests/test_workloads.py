"""Workloads: arrival statistics, determinism, lengths, presets, trace replay, errors."""

from __future__ import annotations

import json
import time

import numpy as np
import pandas as pd
import pytest
from pydantic import ValidationError

from workloads import (
    Request,
    Workload,
    WorkloadError,
    WorkloadSpec,
    generate,
    load_trace,
    preset,
    sample_lengths,
)
from workloads.spec import ChoiceLength, LogNormalLength, UniformLength

FIXED = {"kind": "fixed", "value": 10}


def spec(arrival: dict, **kw) -> WorkloadSpec:
    kw.setdefault("prompt", FIXED)
    kw.setdefault("output", FIXED)
    return WorkloadSpec.model_validate({"arrival": arrival, **kw})


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def dispersion(arrival_s: np.ndarray, duration_s: float, window_s: float) -> float:
    """Index of dispersion (variance / mean) of counts per window."""
    counts = np.bincount((arrival_s // window_s).astype(int), minlength=int(duration_s / window_s))
    return counts.var() / counts.mean()


# --------------------------------------------------------------------------- arrivals


def test_poisson_rate_and_exponential_gaps():
    w = generate(spec({"kind": "poisson", "rate_rps": 50.0}, duration_s=2000.0), rng(1))
    # ~100k arrivals: the count's sd is ~316, so 2% is over 6 sd.
    assert abs(len(w) / 2000.0 - 50.0) < 1.0
    gaps = np.diff(w.arrival_s)
    assert abs(gaps.mean() - 1 / 50) < 0.02 / 50
    assert abs(gaps.std() / gaps.mean() - 1.0) < 0.03
    assert w.arrival_s[0] >= 0 and w.arrival_s[-1] < 2000.0
    assert np.all(np.diff(w.arrival_s) >= 0)
    assert w.offered_rate_rps() == pytest.approx(len(w) / 2000.0)


@pytest.mark.parametrize("cv", [0.5, 2.0, 4.0])
def test_gamma_rate_and_cv(cv):
    w = generate(spec({"kind": "gamma", "rate_rps": 100.0, "cv": cv}, max_requests=100_000), rng(2))
    gaps = np.diff(np.concatenate([[0.0], w.arrival_s]))
    assert len(w) == 100_000
    assert gaps.mean() == pytest.approx(1 / 100.0, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.06)


def test_gamma_cv_above_one_is_burstier_than_poisson():
    dur, win = 1000.0, 1.0
    poisson = generate(spec({"kind": "poisson", "rate_rps": 100.0}, duration_s=dur), rng(3))
    bursty = generate(spec({"kind": "gamma", "rate_rps": 100.0, "cv": 3.0}, duration_s=dur), rng(3))
    d_poisson = dispersion(poisson.arrival_s, dur, win)
    d_bursty = dispersion(bursty.arrival_s, dur, win)
    assert 0.8 < d_poisson < 1.2
    # A renewal process's dispersion tends to cv^2 = 9 over long windows.
    assert d_bursty > 4.0
    assert abs(len(bursty) / dur - 100.0) < 10.0


def test_gamma_cv_one_matches_poisson_statistics():
    w = generate(spec({"kind": "gamma", "rate_rps": 20.0, "cv": 1.0}, duration_s=5000.0), rng(4))
    assert 0.85 < dispersion(w.arrival_s, 5000.0, 1.0) < 1.15


def test_max_requests_caps_a_window():
    w = generate(spec({"kind": "poisson", "rate_rps": 100.0}, duration_s=100.0, max_requests=500), rng(5))
    assert len(w) == 500
    assert w.arrival_s[-1] < 10.0  # 500 arrivals at 100/s take ~5 s


def test_large_window_generates_many_requests_vectorised():
    s = WorkloadSpec(profile="chat", arrival={"kind": "poisson", "rate_rps": 10_000.0}, duration_s=100.0)
    t0 = time.perf_counter()
    w = generate(s, rng(6))
    elapsed = time.perf_counter() - t0
    assert abs(len(w) - 1_000_000) < 6_000
    # Against numpy's own draw of as many samples in the same test (the machine's speed, and any
    # other work on it, cancel out): a few whole-array passes, not a Python step per request, which
    # would be several hundred times it (the figure itself: benchmarks, not tests).
    passes = []
    for seed in (7, 8, 9):
        t0 = time.perf_counter()
        rng(seed).exponential(size=len(w))
        passes.append(time.perf_counter() - t0)
    one_pass = sorted(passes)[1]
    assert elapsed < 60 * one_pass, (elapsed, passes)  # 14-21x here with a busy loop on each core


# --------------------------------------------------------------------------- determinism


def test_same_seed_identical_different_seed_differs():
    s = WorkloadSpec(profile="chat", arrival={"kind": "gamma", "rate_rps": 30.0, "cv": 2.0}, duration_s=200.0)
    a, b, c = generate(s, rng(7)), generate(s, rng(7)), generate(s, rng(8))
    for name in ("arrival_s", "prompt_tokens", "output_tokens"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert len(a) != len(c) or not np.array_equal(a.arrival_s, c.arrival_s)
    n = min(len(a), len(c))
    assert not np.array_equal(a.prompt_tokens[:n], c.prompt_tokens[:n])


def test_workload_iteration_and_immutability():
    w = generate(spec({"kind": "poisson", "rate_rps": 10.0}, duration_s=10.0), rng(9))
    reqs = list(w)
    assert [r.request_id for r in reqs] == list(range(len(w)))
    assert all(isinstance(r, Request) for r in reqs)
    assert reqs[-1] == w[-1] == w[len(w) - 1]
    assert isinstance(reqs[0].arrival_s, float) and isinstance(reqs[0].prompt_tokens, int)
    assert w.arrival_s.dtype == np.float64 and w.prompt_tokens.dtype == np.int64
    with pytest.raises(ValueError):
        w.arrival_s[0] = 1.0
    with pytest.raises(WorkloadError, match="sorted"):
        Workload(np.array([1.0, 0.5]), np.array([1, 1]), np.array([1, 1]), 2.0)


# --------------------------------------------------------------------------- lengths


@pytest.mark.parametrize(
    "length",
    [
        LogNormalLength(kind="lognormal", median=50, sigma=2.0, min=20, max=200),
        LogNormalLength(kind="lognormal", median=1, sigma=3.0),
        UniformLength(kind="uniform", low=1, high=1000, min=100, max=500),
        ChoiceLength(kind="choice", values=[1, 5, 900], probabilities=[0.2, 0.3, 0.5], max=800),
    ],
)
def test_lengths_respect_bounds_and_are_positive(length):
    x = sample_lengths(length, 100_000, rng(10))
    assert x.dtype == np.int64 and x.shape == (100_000,)
    lo = length.min or 1
    assert x.min() >= lo and x.min() >= 1
    if length.max is not None:
        assert x.max() <= length.max
    # the clipping bounds are actually reached, i.e. it is the bounds doing the work
    if length.min is not None:
        assert (x == length.min).any()


def test_uniform_is_inclusive_and_choice_follows_probabilities():
    u = sample_lengths(UniformLength(kind="uniform", low=3, high=5), 30_000, rng(11))
    assert set(np.unique(u)) == {3, 4, 5}
    c = sample_lengths(ChoiceLength(kind="choice", values=[7, 9], probabilities=[0.9, 0.1]), 100_000, rng(11))
    assert np.mean(c == 7) == pytest.approx(0.9, abs=0.01)


def test_lognormal_median_parameter_is_the_median():
    x = sample_lengths(LogNormalLength(kind="lognormal", median=300, sigma=0.8), 100_000, rng(12))
    assert np.median(x) == pytest.approx(300, rel=0.03)


def test_presets_match_their_motivating_statistics():
    chat = WorkloadSpec(profile="chat", arrival={"kind": "poisson", "rate_rps": 100.0}, max_requests=100_000)
    w = generate(chat, rng(13))
    # vLLM's ShareGPT benchmark: mean prompt ~215, mean output ~198 tokens,
    # prompts capped at 1024; "a few hundred" / "a couple of hundred" tokens.
    assert 150 < w.prompt_tokens.mean() < 300 and 150 < w.output_tokens.mean() < 300
    assert 64 < np.median(w.prompt_tokens) < 400 and 64 < np.median(w.output_tokens) < 400
    assert w.prompt_tokens.max() <= 1024
    long = WorkloadSpec(profile="long_context", arrival={"kind": "poisson", "rate_rps": 1.0}, max_requests=100_000)
    w = generate(long, rng(13))
    assert 8192 <= np.median(w.prompt_tokens) <= 65536
    assert w.prompt_tokens.min() >= 8192 and w.prompt_tokens.max() <= 65536
    assert np.median(w.output_tokens) < 512
    assert preset("chat").prompt == chat.prompt


def test_profile_fills_only_missing_lengths():
    s = WorkloadSpec(profile="long_context", arrival={"kind": "poisson", "rate_rps": 1.0},
                     output=FIXED, duration_s=1.0)
    assert s.prompt == preset("long_context").prompt
    assert s.output.kind == "fixed"
    with pytest.raises(WorkloadError, match="known: chat, long_context"):
        preset("chatty")


# --------------------------------------------------------------------------- traces


TRACE = pd.DataFrame(
    {
        # deliberately unsorted; the loader sorts
        "arrival_s": [0.0, 3.0, 1.0, 2.5, 4.0],
        "prompt_tokens": [100, 400, 200, 300, 500],
        "output_tokens": [10, 40, 20, 30, 50],
        "comment": ["a", "b", "c", "d", "e"],
    }
)


def write_trace(tmp_path, fmt: str, df: pd.DataFrame = TRACE) -> str:
    path = tmp_path / f"trace.{fmt}"
    if fmt == "csv":
        df.to_csv(path, index=False)
    elif fmt == "jsonl":
        df.to_json(path, orient="records", lines=True)
    else:
        df.to_parquet(path, index=False)
    return str(path)


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_trace_round_trip_with_time_scale(tmp_path, fmt):
    path = write_trace(tmp_path, fmt)
    s = WorkloadSpec(arrival={"kind": "trace", "path": path, "time_scale": 0.5})
    w = generate(s, rng(0))
    order = np.argsort(TRACE["arrival_s"].to_numpy(), kind="stable")
    np.testing.assert_allclose(w.arrival_s, TRACE["arrival_s"].to_numpy()[order] * 0.5)
    np.testing.assert_array_equal(w.prompt_tokens, TRACE["prompt_tokens"].to_numpy()[order])
    np.testing.assert_array_equal(w.output_tokens, TRACE["output_tokens"].to_numpy()[order])
    assert [r.prompt_tokens for r in w] == [100, 200, 300, 400, 500]


def test_trace_duration_max_requests_and_relative_path(tmp_path):
    write_trace(tmp_path, "csv")
    s = WorkloadSpec(arrival={"kind": "trace", "path": "trace.csv"}, duration_s=3.0)
    w = generate(s, rng(0), base_dir=tmp_path)
    np.testing.assert_array_equal(w.arrival_s, [0.0, 1.0, 2.5])  # [0, 3) excludes 3.0
    s = WorkloadSpec(arrival={"kind": "trace", "path": "trace.csv"}, max_requests=2)
    assert len(generate(s, rng(0), base_dir=tmp_path)) == 2


def test_trace_loop_repeats_back_to_back(tmp_path):
    path = write_trace(tmp_path, "jsonl")
    s = WorkloadSpec(arrival={"kind": "trace", "path": path, "loop": True}, duration_s=12.0)
    w = generate(s, rng(0))
    # period = last arrival (4) + mean gap (1) = 5 s; copies at 0, 5, 10
    np.testing.assert_allclose(w.arrival_s[:10], [0, 1, 2.5, 3, 4, 5, 6, 7.5, 8, 9])
    assert w.arrival_s[-1] == 11.0 and len(w) == 12  # third copy: 10, 11 (12.5 is out)
    np.testing.assert_array_equal(w.prompt_tokens[5:10], w.prompt_tokens[:5])
    with pytest.raises(ValidationError, match="looping trace needs"):
        WorkloadSpec(arrival={"kind": "trace", "path": path, "loop": True})


def _bad(df_change) -> pd.DataFrame:
    df = TRACE.copy()
    df_change(df)
    return df


@pytest.mark.parametrize(
    "fmt, frame, problem",
    [
        ("csv", TRACE.drop(columns="output_tokens"), r"missing column\(s\) output_tokens"),
        ("jsonl", TRACE.drop(columns="arrival_s"), r"missing column\(s\) arrival_s"),
        ("parquet", TRACE.drop(columns="prompt_tokens"), r"missing column\(s\) prompt_tokens"),
        ("csv", TRACE.assign(prompt_tokens=["100", "x7", "1", "1", "1"]), r"non-numeric value 'x7' in column prompt_tokens at data row 2"),
        ("jsonl", TRACE.assign(arrival_s=[0, 1, "soon", 2, 3]), r"non-numeric value 'soon' in column arrival_s at data row 3"),
        ("csv", TRACE.assign(output_tokens=[1, 2, None, 4, 5]), r"missing value in column output_tokens at data row 3"),
        ("csv", TRACE.assign(arrival_s=[0.0, 1.0, 2.0, -0.5, 3.0]), r"arrival_s must be >= 0, got -0.5 at data row 4"),
        ("parquet", TRACE.assign(prompt_tokens=[5, 0, 5, 5, 5]), r"prompt_tokens must be >= 1, got 0 at data row 2"),
        ("jsonl", TRACE.assign(output_tokens=[5, 5, 5, 5, -3]), r"output_tokens must be >= 1, got -3 at data row 5"),
        ("csv", TRACE.assign(output_tokens=[5, 2.5, 5, 5, 5]), r"output_tokens must be an integer, got 2.5 at data row 2"),
    ],
)
def test_malformed_trace_gives_one_line_error(tmp_path, fmt, frame, problem):
    path = write_trace(tmp_path, fmt, frame)
    with pytest.raises(WorkloadError, match=problem) as err:
        generate(WorkloadSpec(arrival={"kind": "trace", "path": path}), rng(0))
    msg = str(err.value)
    assert "\n" not in msg and path in msg


def test_missing_file_unknown_extension_and_unparsable_file(tmp_path):
    cases = [
        (tmp_path / "nope.csv", None, "file not found"),
        (tmp_path / "trace.txt", "arrival_s,prompt_tokens,output_tokens\n0,1,1\n", "unknown extension '.txt'"),
        (tmp_path / "broken.jsonl", '{"arrival_s": 0, "prompt_tokens": 1\n', "cannot read as jsonl"),
        (tmp_path / "empty.csv", "", "file is empty"),
        (tmp_path / "header.csv", "arrival_s,prompt_tokens,output_tokens\n", "no rows"),
    ]
    for path, text, problem in cases:
        if text is not None:
            path.write_text(text)
        with pytest.raises(WorkloadError, match=problem) as err:
            load_trace(path)
        assert "\n" not in str(err.value) and str(path) in str(err.value)
    assert issubclass(WorkloadError, ValueError)


def test_trace_equal_times_keep_file_order(tmp_path):
    df = pd.DataFrame({"arrival_s": [1.0, 0.0, 1.0], "prompt_tokens": [7, 8, 9], "output_tokens": [1, 1, 1]})
    tr = load_trace(write_trace(tmp_path, "csv", df))
    np.testing.assert_array_equal(tr.prompt_tokens, [8, 7, 9])


# --------------------------------------------------------------------------- spec validation


@pytest.mark.parametrize(
    "data, where",
    [
        ({"arrival": {"kind": "weibull", "rate_rps": 1.0}, "duration_s": 1, "profile": "chat"}, "weibull"),
        ({"arrival": {"kind": "poisson", "rate": 1.0}, "duration_s": 1, "profile": "chat"}, "rate"),
        ({"arrival": {"kind": "poisson", "rate_rps": 1.0}, "duration": 1, "profile": "chat"}, "duration"),
        ({"arrival": {"kind": "poisson", "rate_rps": 1.0}, "duration_s": 1, "prompt": {"kind": "fixed", "valeu": 3}, "output": FIXED}, "valeu"),
        ({"arrival": {"kind": "poisson", "rate_rps": 1.0}, "duration_s": 1, "prompt": {"kind": "zipf", "value": 3}, "output": FIXED}, "zipf"),
        ({"arrival": {"kind": "poisson", "rate_rps": 0}, "duration_s": 1, "profile": "chat"}, "rate_rps"),
        ({"arrival": {"kind": "gamma", "rate_rps": 1.0}, "duration_s": 1, "profile": "chat"}, "cv"),
        ({"arrival": {"kind": "poisson", "rate_rps": 1.0}, "duration_s": 1, "profile": "chit-chat"}, "profile"),
        ({"arrival": {"kind": "poisson", "rate_rps": 1.0}, "duration_s": 1}, "prompt and output length spec missing"),
        ({"arrival": {"kind": "poisson", "rate_rps": 1.0}, "profile": "chat"}, "need duration_s or max_requests"),
        ({"arrival": {"kind": "poisson", "rate_rps": 1.0}, "duration_s": 1, "profile": "chat", "prompt": {"kind": "uniform", "low": 9, "high": 3}}, "low"),
        ({"arrival": {"kind": "poisson", "rate_rps": 1.0}, "duration_s": 1, "profile": "chat", "prompt": {"kind": "fixed", "value": 3, "min": 9, "max": 3}}, "min"),
        ({"arrival": {"kind": "poisson", "rate_rps": 1.0}, "duration_s": 1, "profile": "chat", "prompt": {"kind": "choice", "values": [1, 2], "probabilities": [0.5, 0.6]}}, "sum to 1"),
    ],
)
def test_bad_spec_is_a_validation_error(data, where):
    with pytest.raises(ValidationError, match=where):
        WorkloadSpec.model_validate(data)


def test_spec_round_trips_through_json():
    s = WorkloadSpec(profile="chat", arrival={"kind": "gamma", "rate_rps": 5.0, "cv": 2.0}, duration_s=60.0)
    again = WorkloadSpec.model_validate(json.loads(s.model_dump_json()))
    assert again == s
    np.testing.assert_array_equal(generate(s, rng(1)).arrival_s, generate(again, rng(1)).arrival_s)
