"""A testbed run's jobs as the launcher hands them to the driver: a spec travels once.

The command line validates the spec (core.spec.model); the launcher (launch.py) generates each
seed's workload once, from the seed's workload stream (core.experiment.seeded_workload, as the
simulator does), and checks it against the engines' context before anything starts; the
driver (driver.py, in the head's namespace) reads the jobs back from one file and hands the
spec object and the workload to each run's router actor through Ray. Nothing on the way
re-validates the spec or regenerates a workload. The file is a pickle: the launcher and the
driver are the same interpreter and code, and a spec's validated object is what travels.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from core.experiment import seeded_workload
from core.spec.model import ExperimentSpec
from testbed.faults.injector import INJECTED_KINDS
from workloads.generate import Workload

# What the command line asks for: a spec, its policies and its seeds.
Job = tuple[ExperimentSpec, list[str], list[int]]


@dataclass(frozen=True)
class RunJob:
    """One job as the driver runs it: ``workloads`` holds each seed's workload (none when serving:
    the ingress's clients are the workload)."""

    spec: ExperimentSpec
    policies: list[str]
    seeds: list[int]
    workloads: dict[int, Workload] = field(default_factory=dict)
    # Where its runs go (absolute); None: the driver's --out. A repeat of a job on the same engines
    # (the testbed's repeatability, docs/twin.md "Repeatability") goes to its own folder, so each
    # pass is one set of runs of the scenario.
    out_dir: Path | None = None


def check_workload(wl: Workload, spec: ExperimentSpec) -> None:
    """Real engines refuse prompts longer than their context: say so before starting."""
    longest = int((wl.prompt_tokens + wl.output_tokens).max()) if len(wl) else 0
    if longest > spec.testbed.max_model_len:
        raise ValueError(f"workload: a request needs {longest} tokens (prompt + output) but testbed.max_model_len is "
                         f"{spec.testbed.max_model_len}; lower the workload's prompt/output max")


def prepare_jobs(jobs: Sequence[Job], serve: bool = False) -> list[RunJob]:
    """Each job with its seeds' workloads, generated once and checked (ValueError on one the
    engines cannot serve, or on a kind of fault the testbed does not inject); serving, no workload."""
    out = []
    for spec, policies, seeds in jobs:
        if foreign := [(i, f.kind) for i, f in enumerate(spec.faults) if f.kind not in INJECTED_KINDS]:
            i, kind = foreign[0]
            raise ValueError(f"{spec.name}: faults[{i}] is a {kind!r} fault, which the testbed does not inject "
                             f"(it injects {', '.join(INJECTED_KINDS)}: testbed/faults/injector.py)")
        workloads = {}
        for seed in [] if serve else seeds:
            workloads[seed] = wl = seeded_workload(spec, seed)
            check_workload(wl, spec)
        out.append(RunJob(spec, list(policies), list(seeds), workloads))
    return out


def repeat_of(job: RunJob, out_dir: Path) -> RunJob:
    """The same job run again into ``out_dir``: the very workloads (the same requests at the same
    times), so what differs between the two passes is the testbed's own doing."""
    return RunJob(job.spec, job.policies, job.seeds, job.workloads, Path(out_dir).resolve())


def write_jobs(path: Path, jobs: Sequence[RunJob]) -> None:
    Path(path).write_bytes(pickle.dumps(list(jobs), protocol=pickle.HIGHEST_PROTOCOL))


def read_jobs(path: Path) -> list[RunJob]:
    """What :func:`write_jobs` wrote (the launcher, for this driver: the same code)."""
    return pickle.loads(Path(path).read_bytes())
