"""The simulator's hot modules, compiled with Cython at install, and their pure-Python fallback.

Why: the study's grid (``testbed study experiments/study.yaml``: 738 runs of 30,000 to 118,000
requests) must finish within 15 minutes on 2 cores. These modules are the per-event and
per-request work of a simulated run; compiled unchanged (``setup.py``: no Cython syntax, no
type declarations, so Python semantics and float arithmetic are kept), a run takes about a fifth
less CPU time with identical records (``tests/test_compiled.py`` compares them).

Python's import prefers an extension module to the ``.py`` beside it, so a module edited after
the install would silently run its old compiled code. The finder installed here prevents that:
a compiled module is used only while its source is the one it was built from (the build writes
the source's SHA-256 beside the extension); otherwise the ``.py`` is imported, slower but
current, until the next ``pip install -e .``. ``TESTBED_PURE_PYTHON=1`` imports every one of
them as Python (a profiler sees no frames inside compiled code).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import os
import sys
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec
from importlib.util import spec_from_file_location
from pathlib import Path
from types import ModuleType
from typing import Sequence

__all__ = ["COMPILED_MODULES", "DIGEST_SUFFIX", "PURE_ENV", "compiled_is_current", "install", "is_compiled",
           "source_digest"]

# Measured by benchmarks/bench_sim.py (FaultAwareOTF-R, 100k requests), three interleaved pairs:
# 22,700-23,700 requests per CPU second as Python, 28,200-28,900 compiled; compiling the router's
# other modules too (run, topology, stages, view, telemetry) gave nothing more. Only modules of `core` and `simulator`: the finder
# must be on sys.meta_path before any of them is imported, and both packages' __init__ put it
# there (`faults`, below `core`, may not import it: tests/test_architecture.py).
COMPILED_MODULES: tuple[str, ...] = (
    "simulator.events",
    "simulator.network",
    "simulator.maxmin",  # FlowNetwork's base class: the allocation half of network
    "simulator.cluster",
    "core.routing",
    "core.engine_timing",  # the prefill and decode-step rule, called per batch and per step
    "core.ticket",
    "core.records",
    "core.risk",
    "core.policies.base",
    "core.policies.filters",
    "core.policies.pickers",
    "core.policies.scorers",
    "core.policies.weights",
)
# Beside each built extension: the SHA-256 of the source it was compiled from.
DIGEST_SUFFIX = ".source-sha256"
PURE_ENV = "TESTBED_PURE_PYTHON"


def source_digest(source: Path) -> str:
    """The SHA-256 of a module's source file, as the build records it."""
    return hashlib.sha256(Path(source).read_bytes()).hexdigest()


def compiled_is_current(extension: Path, source: Path) -> bool:
    """Whether ``extension`` was built from ``source`` as it is now."""
    recorded = Path(str(extension) + DIGEST_SUFFIX)
    try:
        return recorded.read_text().strip() == source_digest(source)
    except OSError:
        return False


class _CurrentOrSource(MetaPathFinder):
    """Finds the compiled modules: the extension if it is current, else the ``.py`` beside it."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname not in COMPILED_MODULES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or not isinstance(spec.loader, importlib.machinery.ExtensionFileLoader):
            return spec
        extension = Path(spec.origin)
        source = extension.with_name(fullname.rpartition(".")[2] + ".py")
        if not source.is_file():  # an install without sources: the extension is all there is
            return spec
        if os.environ.get(PURE_ENV, "") not in ("", "0") or not compiled_is_current(extension, source):
            return spec_from_file_location(fullname, source)
        return spec


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once), before any compiled module is imported."""
    if not any(isinstance(f, _CurrentOrSource) for f in sys.meta_path):
        sys.meta_path.insert(0, _CurrentOrSource())


def is_compiled(module: ModuleType) -> bool:
    """Whether an imported module runs as compiled code."""
    return any(str(getattr(module, "__file__", "")).endswith(s) for s in importlib.machinery.EXTENSION_SUFFIXES)
