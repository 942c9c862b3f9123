"""Every package the project's code imports is declared in pyproject.toml, in its dependencies or an
extra, rather than left to arrive with another package (vLLM brings fastapi, transformers and
torch, but a change of vLLM's own requirements would then break the testbed without a word)."""

from __future__ import annotations

import importlib.metadata as md
import re
import sys
import tomllib
from pathlib import Path

from test_architecture import PACKAGES, imports

ROOT = Path(__file__).resolve().parents[1]
# Imported where no such distribution is installed here (the GPU stack), or under a fallback.
NOT_INSTALLED_HERE = {"pynvml": "nvidia-ml-py"}
OPTIONAL = {"orjson"}  # workloads/formats.py falls back to the standard library's json


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [*project["dependencies"], *(r for extra in project["optional-dependencies"].values() for r in extra)]
    return {_norm(re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0]) for r in reqs}


def _third_party_imports() -> set[str]:
    found: set[str] = set()
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found |= {m.split(".")[0] for m in imports(module, path, set())}
    return {m for m in found if m and m not in sys.stdlib_module_names and m not in PACKAGES}


def test_every_imported_package_is_declared():
    dists = md.packages_distributions()
    declared = _declared()
    missing = []
    for module in sorted(_third_party_imports() - OPTIONAL):
        names = dists.get(module) or [NOT_INSTALLED_HERE.get(module, module)]
        if not any(_norm(n) in declared for n in names):
            missing.append(f"{module} ({', '.join(names)})")
    assert not missing, "imported but not declared in pyproject.toml: " + ", ".join(missing)


def test_the_check_sees_an_undeclared_import():
    # a package the code does not import cannot be missing; one it does is found by its distribution
    assert "yaml" in _third_party_imports() and "pyyaml" in _declared()
    assert "starlette" in _third_party_imports()
