"""Small seeded samples of the public trace formats, written as the originals are.

The tests read them, and users can try a format without downloading anything::

    python -m workloads.samples OUTDIR [--rows N] [--seed S]

writes ``sample_AzureLLMInferenceTrace_code.csv`` (the 2023 shape),
``sample_AzureLLMInferenceTrace_conv_1week.csv`` (the 2024 shape),
``sample_BurstGPT_1.csv`` (with a few failed requests) and
``sample_mooncake_trace.jsonl``, each in the exact layout of its source (see
`workloads.formats` for the sources). The numbers are synthetic: arrival gaps
from a Gamma process and lognormal lengths clipped to the ranges the real
files span; they are shaped like the traces, not taken from them.

Each writer returns a `Sample` with what `workloads.trace.load_trace` must
read back: arrival seconds from the earliest replayed request, prompt and
output tokens, in file order (the files are written in arrival order), and
the count of rows the reader drops.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Sample:
    path: Path
    format: str
    arrival_s: np.ndarray  # float64, what the reader returns
    prompt_tokens: np.ndarray  # int64
    output_tokens: np.ndarray  # int64
    header_lines: int  # 1 for CSV, 0 for JSON Lines: data row i is on line i + 1 + header_lines
    dropped: dict[str, int] = field(default_factory=dict)
    # Mooncake only: the hash_ids written for each row
    hash_ids: list[list[int]] | None = None


def _gaps(rng: np.random.Generator, n: int, mean_s: float, cv: float = 2.0) -> np.ndarray:
    """n inter-arrival gaps, Gamma with the given mean and coefficient of variation (bursty)."""
    k = 1.0 / (cv * cv)
    return rng.gamma(k, mean_s / k, size=n)


def _lognormal(rng: np.random.Generator, n: int, median: float, sigma: float, lo: int, hi: int) -> np.ndarray:
    x = np.rint(rng.lognormal(math.log(median), sigma, size=n))
    return np.clip(x, lo, hi).astype(np.int64)


# --------------------------------------------------------------------------- Azure


def write_azure(path: str | Path, rows: int = 120, seed: int = 0, year: int = 2023, kind: str = "code") -> Sample:
    """An Azure LLM inference trace: ``TIMESTAMP,ContextTokens,GeneratedTokens``.

    2023: naive timestamps with 7 fractional digits (``2023-11-16 18:17:03.9799600``;
    the real files carry microseconds and a trailing 0). 2024: UTC timestamps,
    ``2024-05-10 00:00:00.009930+00:00``, without the fraction when it is zero
    (``2024-05-10 00:00:03+00:00``), which the sample always includes.
    `kind` "code" or "conv" picks the length ranges of that trace.
    """
    if year not in (2023, 2024):
        raise ValueError(f"year must be 2023 or 2024, got {year}")
    rng = np.random.default_rng(seed)
    # Whole microseconds, ascending; 2023 code: ~2.6 requests/s; 2024 conv: tens per second.
    mean_gap = 0.4 if year == 2023 else 0.05
    us = np.cumsum(np.rint(_gaps(rng, rows, mean_gap) * 1e6).astype(np.int64))
    us -= us[0]
    if year == 2024:
        # Put some requests on whole seconds (where the real file drops the fraction):
        # half of those that are the first of their second, so none moves before the
        # previous request, and always the very first.
        whole = (us // 1_000_000) * 1_000_000
        prev = np.concatenate(([0], us[:-1]))
        pick = (rng.random(rows) < 0.5) & (whole >= prev)
        pick[0] = True
        us = np.where(pick, whole, us)
    if kind == "code":  # 2023 code: context 3..7437, generated 6..1899
        prompt = _lognormal(rng, rows, 1500, 1.0, 3, 7437)
        output = _lognormal(rng, rows, 13, 0.8, 6, 1899)
    elif kind == "conv":  # 2023 conv: context 2..14050, generated 7..1000
        prompt = _lognormal(rng, rows, 1000, 0.9, 2, 14050)
        output = _lognormal(rng, rows, 130, 0.9, 7, 1000)
    else:
        raise ValueError(f"kind must be 'code' or 'conv', got {kind!r}")
    if year == 2023:
        start = datetime(2023, 11, 16, 18, 15, 46, 680590)
        stamps = [(start + timedelta(microseconds=int(u))).strftime("%Y-%m-%d %H:%M:%S.%f") + "0" for u in us]
    else:
        start = datetime(2024, 5, 10, 0, 0, 0, tzinfo=timezone.utc)
        stamps = [str(start + timedelta(microseconds=int(u))) for u in us]  # isoformat(" ")
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    lines += [f"{t},{p},{o}" for t, p, o in zip(stamps, prompt.tolist(), output.tolist())]
    path = Path(path)
    # The published files end without a final newline.
    path.write_text("\n".join(lines))
    return Sample(path, "azure", (us - us[0]) / 1e6, prompt, output, header_lines=1)


# --------------------------------------------------------------------------- BurstGPT


def write_burstgpt(path: str | Path, rows: int = 150, seed: int = 0, failures: int = 6) -> Sample:
    """A BurstGPT trace: ``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type``.

    Integer-second timestamps from 0:00 of the first day (so the first is not 0),
    models ``ChatGPT`` / ``GPT-4``, log types ``Conversation log`` / ``API log``,
    and `failures` failed requests (``Response tokens`` 0), never the first row.
    """
    rng = np.random.default_rng(seed)
    t = 5 + np.floor(np.cumsum(_gaps(rng, rows, 2.0))).astype(np.int64)
    model = np.where(rng.random(rows) < 0.8, "ChatGPT", "GPT-4")
    log = np.where(rng.random(rows) < 0.7, "Conversation log", "API log")
    req = _lognormal(rng, rows, 600, 1.1, 1, 30000)
    resp = _lognormal(rng, rows, 200, 0.9, 1, 4000)
    failed = np.zeros(rows, dtype=bool)
    if failures:
        failed[rng.choice(np.arange(1, rows), size=min(failures, rows - 1), replace=False)] = True
    resp = np.where(failed, 0, resp)
    lines = ["Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"]
    lines += [
        f"{ti},{m},{q},{r},{q + r},{lg}"
        for ti, m, q, r, lg in zip(t.tolist(), model.tolist(), req.tolist(), resp.tolist(), log.tolist())
    ]
    path = Path(path)
    path.write_text("\n".join(lines) + "\n")
    keep = ~failed
    tk = t[keep].astype(np.float64)
    return Sample(
        path, "burstgpt", tk - tk.min(), req[keep], resp[keep], header_lines=1,
        dropped={"failed": int(failed.sum())} if failed.any() else {},
    )


# --------------------------------------------------------------------------- Mooncake


def write_mooncake(path: str | Path, rows: int = 100, seed: int = 0, block_tokens: int = 512) -> Sample:
    """A Mooncake trace: JSON Lines ``{"timestamp", "input_length", "output_length", "hash_ids"}``.

    Integer-millisecond timestamps from 0 (several requests may share one),
    long prompts (Mooncake's mean input is ~7.6k tokens), and one hash id per
    512-token block: every prompt starts with block 0 (a shared system prompt)
    and a third of them reuse an earlier prompt's blocks (a conversation's next turn).
    """
    rng = np.random.default_rng(seed)
    ms = np.floor(np.cumsum(_gaps(rng, rows, 0.5)) * 1000).astype(np.int64)
    ms -= ms[0]
    prompt = _lognormal(rng, rows, 7000, 0.9, 100, 120000)
    output = _lognormal(rng, rows, 300, 0.9, 1, 2000)
    next_id = 1
    hashes: list[list[int]] = []
    for i in range(rows):
        n_blocks = max(1, math.ceil(int(prompt[i]) / block_tokens))
        ids = [0]
        if hashes and rng.random() < 1 / 3:
            prev = hashes[int(rng.integers(len(hashes)))]
            ids = prev[: min(len(prev), n_blocks)]
        while len(ids) < n_blocks:
            ids.append(next_id)
            next_id += 1
        hashes.append(ids)
    path = Path(path)
    with open(path, "w") as fh:
        for t, p, o, h in zip(ms.tolist(), prompt.tolist(), output.tolist(), hashes):
            fh.write(json.dumps({"timestamp": t, "input_length": p, "output_length": o, "hash_ids": h}) + "\n")
    return Sample(path, "mooncake", ms / 1000.0, prompt, output, header_lines=0, hash_ids=hashes)


# --------------------------------------------------------------------------- all


def write_samples(outdir: str | Path, rows: int = 120, seed: int = 0) -> dict[str, Sample]:
    """Every format's sample in `outdir` (created), by a short name."""
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    return {
        "azure2023": write_azure(out / "sample_AzureLLMInferenceTrace_code.csv", rows, seed, 2023, "code"),
        "azure2024": write_azure(out / "sample_AzureLLMInferenceTrace_conv_1week.csv", rows, seed + 1, 2024, "conv"),
        "burstgpt": write_burstgpt(out / "sample_BurstGPT_1.csv", rows, seed + 2, failures=max(1, rows // 25)),
        "mooncake": write_mooncake(out / "sample_mooncake_trace.jsonl", rows, seed + 3),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m workloads.samples", description="Write small samples of the public trace formats."
    )
    ap.add_argument("outdir")
    ap.add_argument("--rows", type=int, default=120, help="requests per sample (default 120)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.rows < 2:
        ap.error("--rows must be at least 2")
    for name, s in write_samples(args.outdir, args.rows, args.seed).items():
        print(f"{name:10s} {s.format:9s} {s.path}")


if __name__ == "__main__":
    main()
