"""Workload specs: what an experiment file says about its request stream.

Pydantic lives here only, at the file boundary; `workloads.generate` turns a
validated `WorkloadSpec` into plain numpy arrays. Every model forbids unknown
fields, so a misspelt key is a validation error rather than a silent default.

Arrival processes (`arrival.kind`):

* ``poisson``: exponential inter-arrival times at ``rate_rps``;
* ``gamma``: Gamma inter-arrival times with mean ``1 / rate_rps`` and
  coefficient of variation ``cv`` (a renewal process; cv=1 is Poisson,
  cv>1 is burstier, cv<1 more regular);
* ``trace``: replay of a file: this project's own CSV / JSONL / Parquet with
  columns ``arrival_s, prompt_tokens, output_tokens`` (see `workloads.trace`),
  or a public trace read as published: the Azure LLM inference traces
  (2023, 2024), BurstGPT's CSV, Mooncake's JSONL (see `workloads.formats`).
  The format is detected from the columns unless ``format`` names it; a time
  window (``start_s``, ``end_s``), a rate scaling (``speedup`` or
  ``time_scale``) and a context rule (``max_context_tokens``, ``too_long``)
  select what is replayed; the workload's ``duration_s`` / ``max_requests``
  cap it as for any arrival process.

Length distributions (`prompt`, `output`; `kind`): ``fixed``, ``uniform``
(integers, both ends inclusive), ``lognormal`` (by ``median`` and the
``sigma`` of the underlying normal, i.e. ``exp(N(ln median, sigma^2))``) and
``choice``. Each takes optional ``min`` / ``max`` clipping; a sample is
rounded to the nearest integer and is never below 1.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal, NamedTuple, Union

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, model_validator


class WorkloadError(ValueError):
    """A workload that cannot be built (bad trace file, impossible spec); one-line message."""


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --------------------------------------------------------------------------- arrivals


class PoissonArrival(_Spec):
    kind: Literal["poisson"]
    rate_rps: PositiveFloat


class GammaArrival(_Spec):
    kind: Literal["gamma"]
    rate_rps: PositiveFloat
    cv: PositiveFloat  # std / mean of the inter-arrival time


# "auto" first; then the formats of workloads.formats, in its detection order.
TRACE_FORMATS = ("auto", "native", "azure", "burstgpt", "mooncake")
TraceFormat = Literal["auto", "native", "azure", "burstgpt", "mooncake"]


class TraceArrival(_Spec):
    """Replay of a trace file.

    In order: the file's rows (public formats rebased so the earliest request
    is at 0 s; native files keep their ``arrival_s``), then the window
    [start_s, end_s) of the trace's own clock, shifted so start_s is run time 0,
    then the context rule, then arrival times times ``time_scale`` (or divided
    by ``speedup``), then ``loop`` and the workload's duration_s / max_requests.

    Context rule: a request needs prompt + output tokens of context (vLLM
    refuses a request whose prompt plus max_tokens exceeds max_model_len, and
    the testbed checks the same). With ``max_context_tokens`` set, a longer
    request is, by ``too_long``:

    * ``refuse`` (default): an error naming the file, the line and the values
      (only requests that are actually replayed are checked);
    * ``drop``: left out (counted in the workload summary);
    * ``clip``: the prompt is cut to fit (max_context_tokens - output), and the
      output too when it alone fills the context (to max_context_tokens - 1).
    """

    kind: Literal["trace"]
    path: Annotated[str, Field(min_length=1)]
    format: TraceFormat = "auto"
    # Multiplies every arrival time: 0.5 replays twice as fast.
    time_scale: PositiveFloat = 1.0
    # Divides every arrival time: 2 replays twice as fast (twice the rate); give this or time_scale.
    speedup: PositiveFloat | None = None
    # The window replayed, in seconds of the trace's own clock (see the class docstring).
    start_s: Annotated[float, Field(ge=0.0, allow_inf_nan=False)] = 0.0
    end_s: PositiveFloat | None = None
    # Repeat the trace back to back until duration_s / max_requests is reached.
    loop: bool = False
    # The model's context length in tokens (prompt + output); None: no rule.
    max_context_tokens: Annotated[int, Field(ge=2)] | None = None
    too_long: Literal["refuse", "clip", "drop"] = "refuse"

    @model_validator(mode="after")
    def _check_options(self):
        if self.end_s is not None and self.end_s <= self.start_s:
            raise ValueError(f"end_s ({self.end_s:g}) must be greater than start_s ({self.start_s:g})")
        if self.speedup is not None and self.time_scale != 1.0:
            raise ValueError("give speedup or time_scale, not both (speedup k is time_scale 1/k)")
        if "too_long" in self.model_fields_set and self.max_context_tokens is None:
            raise ValueError("too_long needs max_context_tokens (the model's context length in tokens)")
        return self


ArrivalSpec = Annotated[
    Union[PoissonArrival, GammaArrival, TraceArrival], Field(discriminator="kind")
]


# --------------------------------------------------------------------------- lengths


class _Length(_Spec):
    min: PositiveInt | None = None
    max: PositiveInt | None = None

    @model_validator(mode="after")
    def _check_bounds(self):
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min ({self.min}) must not exceed max ({self.max})")
        return self


class FixedLength(_Length):
    kind: Literal["fixed"]
    value: PositiveInt


class UniformLength(_Length):
    """Integers drawn uniformly from [low, high], both ends inclusive."""

    kind: Literal["uniform"]
    low: PositiveInt
    high: PositiveInt

    @model_validator(mode="after")
    def _check_range(self):
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) must not exceed high ({self.high})")
        return self


class LogNormalLength(_Length):
    """round(exp(N(ln median, sigma^2))): `median` is the median in tokens,
    `sigma` the standard deviation of the underlying normal (log-space)."""

    kind: Literal["lognormal"]
    median: PositiveFloat
    sigma: Annotated[float, Field(ge=0.0)]


class ChoiceLength(_Length):
    """One of `values`, with `probabilities` (uniform when omitted; must sum to 1)."""

    kind: Literal["choice"]
    values: Annotated[list[PositiveInt], Field(min_length=1)]
    probabilities: list[Annotated[float, Field(ge=0.0)]] | None = None

    @model_validator(mode="after")
    def _check_probabilities(self):
        p = self.probabilities
        if p is None:
            return self
        if len(p) != len(self.values):
            raise ValueError(
                f"probabilities has {len(p)} entries but values has {len(self.values)}"
            )
        if not math.isclose(sum(p), 1.0, rel_tol=0.0, abs_tol=1e-6):
            raise ValueError(f"probabilities must sum to 1, got {sum(p):.6g}")
        return self


LengthSpec = Annotated[
    Union[FixedLength, UniformLength, LogNormalLength, ChoiceLength],
    Field(discriminator="kind"),
]


# --------------------------------------------------------------------------- presets


class Preset(NamedTuple):
    prompt: LengthSpec
    output: LengthSpec


# "chat": ShareGPT-like single-turn chat. vLLM's serving benchmark samples
# ShareGPT_V3_unfiltered_cleaned_split (first human turn as prompt, the reply's
# length as output, keeping prompts in [4, 1024] and prompt+output <= 2048
# tokens); its published runs on 1000 sampled requests report 215,196 input
# tokens and ~198k output tokens, i.e. means of ~215 and ~198 tokens. The same
# dataset drives the chatbot workloads of vLLM (Kwon et al., SOSP'23) and
# DistServe (Zhong et al., OSDI'24). The lognormal medians and sigmas below
# reproduce those means (~218 prompt, ~203 output after clipping) with the
# heavy right tail of real chat; medians: prompt 140, output 130 tokens.
CHAT = Preset(
    prompt=LogNormalLength(kind="lognormal", median=140, sigma=1.0, min=4, max=1024),
    output=LogNormalLength(kind="lognormal", median=130, sigma=0.95, min=4, max=2048),
)

# "long_context": document QA / summarisation / RAG, where prefill and the KV
# transfer dominate. LongBench (Bai et al., ACL'24) averages ~6.7k words
# (~9k tokens) per English task, with single- and multi-document QA and
# summarisation contexts well beyond 16k tokens; Mooncake's production trace
# (Qin et al., FAST'25) reports a mean input of ~7.6k and a mean output of
# ~182 tokens. We push prompts into the 8k-64k range (median 16k) to stress
# KV transfer over degraded links, and keep outputs short (median 128).
LONG_CONTEXT = Preset(
    prompt=LogNormalLength(kind="lognormal", median=16384, sigma=0.5, min=8192, max=65536),
    output=LogNormalLength(kind="lognormal", median=128, sigma=0.7, min=16, max=1024),
)

PRESETS: dict[str, Preset] = {"chat": CHAT, "long_context": LONG_CONTEXT}

ProfileName = Literal["chat", "long_context"]


def preset(name: str) -> Preset:
    """The (prompt, output) length specs of a named preset."""
    try:
        return PRESETS[name]
    except KeyError:
        raise WorkloadError(
            f"unknown workload preset {name!r}; known: {', '.join(sorted(PRESETS))}"
        ) from None


# --------------------------------------------------------------------------- workload


class WorkloadSpec(_Spec):
    """A request stream.

    Synthetic arrivals (poisson, gamma) are generated in [0, duration_s),
    stopping early at `max_requests`; at least one of the two must be given
    (with only `max_requests`, exactly that many requests are drawn).
    `prompt` / `output` default to the preset named by `profile`; they are
    ignored for trace replay, whose lengths come from the file. A trace is cut
    at duration_s and max_requests where given; a looping trace needs one.
    """

    arrival: ArrivalSpec
    profile: ProfileName | None = None
    prompt: LengthSpec | None = None
    output: LengthSpec | None = None
    duration_s: PositiveFloat | None = None
    max_requests: PositiveInt | None = None

    @model_validator(mode="after")
    def _fill_and_check(self):
        if self.profile is not None:
            p = PRESETS[self.profile]
            # object.__setattr__: the model is frozen once validated.
            for name in ("prompt", "output"):
                if getattr(self, name) is None:
                    object.__setattr__(self, name, getattr(p, name))
                    self.__pydantic_fields_set__.add(name)
        is_trace = isinstance(self.arrival, TraceArrival)
        if not is_trace:
            missing = [f for f in ("prompt", "output") if getattr(self, f) is None]
            if missing:
                raise ValueError(
                    f"{' and '.join(missing)} length spec missing: give it or a `profile`"
                )
            if self.duration_s is None and self.max_requests is None:
                raise ValueError(
                    f"{self.arrival.kind} arrivals need duration_s or max_requests"
                )
        elif self.arrival.loop and self.duration_s is None and self.max_requests is None:
            raise ValueError("a looping trace needs duration_s or max_requests")
        return self
