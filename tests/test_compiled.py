"""The simulator's compiled hot modules (core/compiled.py, setup.py): built by the install where a
C compiler exists, identical in their records to the Python they are compiled from, and never
used once their source has changed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pandas as pd
import pytest

from core import compiled
from core.records import read_table

pytestmark = pytest.mark.background  # needs no core of its own: under -n, beside the others (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[1]


def _simulate(spec: dict, out: Path, pure: bool) -> tuple[Path, int]:
    """Simulate ``spec`` with FaultAwareOTF-R in a fresh process; the run directory and how many
    hot modules ran compiled."""
    code = (
        "import json, sys\n"
        "from pathlib import Path\n"
        "from core.compiled import COMPILED_MODULES, is_compiled\n"
        "from core.spec.model import parse_spec\n"
        "from simulator.run import run_sim\n"
        "rd = run_sim(parse_spec(json.loads(sys.argv[1])), 'FaultAwareOTF-R', 0, Path(sys.argv[2]))\n"
        "print(json.dumps([str(rd), sum(is_compiled(sys.modules[m]) for m in COMPILED_MODULES)]))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != compiled.PURE_ENV}
    if pure:
        env[compiled.PURE_ENV] = "1"
    res = subprocess.run([sys.executable, "-c", code, json.dumps(spec), str(out)], env=env, cwd=ROOT,
                         capture_output=True, text=True, check=True)
    run_dir, n = json.loads(res.stdout.strip().splitlines()[-1])
    return Path(run_dir), n


def _built() -> list[str]:
    """The hot modules that have an extension beside their source."""
    return [m for m in compiled.COMPILED_MODULES
            if any((ROOT / (m.replace(".", "/") + s)).exists() for s in EXTENSION_SUFFIXES)]


def test_the_install_compiled_every_hot_module():
    if shutil.which(os.environ.get("CC", "cc")) is None:
        pytest.skip("no C compiler here: the install leaves the hot modules as Python")
    assert _built() == list(compiled.COMPILED_MODULES)


def test_compiled_and_python_runs_give_identical_records(tmp_path, faulted_spec):
    if not _built():
        pytest.skip("the install built no compiled modules (no C compiler)")
    fast, n_fast = _simulate(faulted_spec, tmp_path / "compiled", pure=False)
    slow, n_slow = _simulate(faulted_spec, tmp_path / "python", pure=True)
    assert (n_fast, n_slow) == (len(_built()), 0)
    requests = read_table(fast, "requests")
    assert (requests.outcome != "ok").any() and requests.kv_bytes.sum() > 0  # the fault bit: not a trivial run
    for table in ("requests", "prices", "health", "faults", "decisions"):
        a, b = read_table(fast, table), read_table(slow, table)
        if table == "decisions":  # latency_s is the wall clock's
            a, b = a.drop(columns="latency_s"), b.drop(columns="latency_s")
        pd.testing.assert_frame_equal(a, b, check_exact=True)


def _fake_package(tmp_path: Path) -> Path:
    """A package whose module `mod` has a source and an extension file beside it (never loaded:
    only where the finder sends the import is checked)."""
    pkg = tmp_path / "fakepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text("X = 1\n")
    (pkg / f"mod{EXTENSION_SUFFIXES[0]}").write_bytes(b"not loaded by this test")
    return pkg


def _found(pkg: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(compiled, "COMPILED_MODULES", ("fakepkg.mod",))
    spec = compiled._CurrentOrSource().find_spec("fakepkg.mod", [str(pkg)])
    return Path(spec.origin).name


def test_an_extension_is_used_only_while_its_source_is_the_one_it_was_built_from(tmp_path, monkeypatch):
    monkeypatch.delenv(compiled.PURE_ENV, raising=False)
    pkg = _fake_package(tmp_path)
    ext = pkg / f"mod{EXTENSION_SUFFIXES[0]}"
    assert _found(pkg, monkeypatch) == "mod.py"  # no digest: built by something else
    Path(str(ext) + compiled.DIGEST_SUFFIX).write_text(compiled.source_digest(pkg / "mod.py") + "\n")
    assert _found(pkg, monkeypatch) == ext.name
    monkeypatch.setenv(compiled.PURE_ENV, "1")
    assert _found(pkg, monkeypatch) == "mod.py"
    monkeypatch.delenv(compiled.PURE_ENV)
    (pkg / "mod.py").write_text("X = 2\n")  # edited after the build
    assert _found(pkg, monkeypatch) == "mod.py"


def test_the_finder_is_in_place_before_any_hot_module_is_imported():
    # A fresh interpreter that imports a hot module first: the finder is already on sys.meta_path
    # (core's and simulator's __init__ put it there), so an edited module cannot run stale.
    for module in ("simulator.network", "core.policies.base"):
        code = (f"import importlib, sys; importlib.import_module({module!r}); "
                "print(type(sys.meta_path[0]).__name__)")
        res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
        assert res.stdout.strip() == "_CurrentOrSource"
