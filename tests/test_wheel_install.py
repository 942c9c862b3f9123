"""An install that stands on its own: the project built as a wheel and installed into a fresh
virtual environment runs `testbed sim` and `testbed doctor` from a folder outside the repository,
its data files (the embedded specs, the Prometheus configuration) found inside the installed
package, and nothing imported from the repository.

No network: the wheel is built without build isolation (this machine's setuptools; setup.py
compiles nothing where Cython is missing, and the modules then run as Python) and installed with
--no-deps --no-index; the dependencies come from this machine's site-packages, which the virtual
environment sees (--system-site-packages). Everything is written under tmp_path, pip's and the
commands' temporary files too (TMPDIR).
"""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import shutil
import subprocess
import sys
import venv
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

# subprocesses of the command line, judged on what they print, not on time
pytestmark = pytest.mark.background  # needs no core of its own: under -n, beside the others (tests/conftest.py)

REPO = Path(__file__).resolve().parents[1]
DIST = "pd-reliability-testbed"
PROMETHEUS_FILES = ("prometheus.yml", "rules.yml", "rules_test.yml")
# What a build would otherwise pick up from the working tree: earlier builds' output (build/lib
# keeps files deleted since, and bdist_wheel packs all of it), in-place extensions, runs.
_NOT_SOURCES = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", "*.so",
                                      "*.source-sha256", "runs", "reports")


def _env(tmp: Path) -> dict[str, str]:
    """The environment of every command here: nothing that would put the repository on sys.path
    (PYTHONPATH, a user site), temporary files under tmp_path, no pip index or cache."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PIP_", "VIRTUAL_ENV"))}
    (tmp / "tmp").mkdir(exist_ok=True)
    return {**env, "PYTHONNOUSERSITE": "1", "TMPDIR": str(tmp / "tmp"), "PIP_NO_INDEX": "1",
            "PIP_NO_CACHE_DIR": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "COLUMNS": "200"}


def _run(argv: list, tmp: Path, timeout: float, ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess:
    r = subprocess.run([str(a) for a in argv], cwd=tmp, env=_env(tmp), capture_output=True, text=True, timeout=timeout)
    assert r.returncode in ok, f"{' '.join(map(str, argv))}: exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def _installed_here() -> tuple[str, str | None] | None:
    """Where this python has the project installed (the editable install's direct_url.json), if at all."""
    try:
        dist = md.distribution(DIST)
    except md.PackageNotFoundError:
        return None
    return str(dist.locate_file("")), dist.read_text("direct_url.json")


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """(the virtual environment, a working folder outside the repository) with the wheel installed;
    all of it removed afterwards (pytest keeps its last temporary folders, a venv included)."""
    tmp = tmp_path_factory.mktemp("wheel")
    before = _installed_here()
    src = tmp / "src"
    shutil.copytree(REPO, src, ignore=_NOT_SOURCES)  # the repository itself is left as it is
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", tmp / "wheels", src],
         tmp, timeout=300)
    (wheel,) = (tmp / "wheels").glob("pd_reliability_testbed-*.whl")
    shutil.rmtree(src)
    venv_dir = tmp / "venv"
    # No pip of its own (ensurepip takes seconds): this machine's pip, seen through the system
    # site-packages, installs into the environment whose python runs it.
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(venv_dir)
    # --force-reinstall: the system site-packages already hold this version (the editable install
    # of the repository), and pip would otherwise call the wheel installed; it leaves that one alone,
    # as it is outside the environment.
    _run([venv_dir / "bin" / "python", "-m", "pip", "install", "--no-deps", "--no-index", "--force-reinstall", wheel],
         tmp, timeout=300)
    assert _installed_here() == before  # the system's own install (editable, say) left as it was
    work = tmp / "work"
    work.mkdir()
    yield venv_dir, work
    shutil.rmtree(tmp, ignore_errors=True)


def _site_packages(venv_dir: Path) -> Path:
    (site,) = (venv_dir / "lib").glob("python3*/site-packages")
    return site.resolve()


def test_the_installed_package_is_imported_from_the_environment_not_the_repository(installed):
    venv_dir, work = installed
    site = _site_packages(venv_dir)
    # The system site-packages hold an editable install pointing at the repository: its finder is
    # appended to sys.meta_path (after the PathFinder), and the environment's site-packages come
    # before the system's on sys.path, so the installed copy wins; this holds it to that.
    code = ("import sys, testbed, core, cli, simulator, analysis, workloads, faults, core.spec.model, cli.main\n"
            "for m in ('testbed', 'core', 'cli', 'simulator', 'analysis', 'workloads', 'faults', 'core.spec.model', "
            "'cli.main'): print(m, sys.modules[m].__file__)\n"
            "print('prefix', sys.prefix)")
    out = _run([venv_dir / "bin" / "python", "-c", code], work, timeout=60).stdout
    found = dict(line.split(" ", 1) for line in out.splitlines())
    assert Path(found.pop("prefix")).resolve() == venv_dir.resolve()
    for module, file in found.items():
        assert Path(file).resolve().is_relative_to(site), f"{module} imported from {file}, not {site}"
        assert not Path(file).resolve().is_relative_to(REPO), f"{module} imported from the repository: {file}"


def test_the_data_files_ship_inside_the_installed_package(installed):
    venv_dir, work = installed
    code = ("from importlib import resources\n"
            "from testbed.router.prometheus_server import SHIPPED_DIR, scrape_config\n"
            "print(SHIPPED_DIR)\n"
            "print(scrape_config(['127.0.0.1:1'])['rule_files'][0])\n"
            "print(resources.files('core.defaults').joinpath('testbed.yaml'))")
    shipped, rules, defaults = _run([venv_dir / "bin" / "python", "-c", code], work, timeout=60).stdout.split()
    site = _site_packages(venv_dir)
    assert Path(shipped) == site / "testbed" / "router" / "prometheus"
    assert sorted(p.name for p in Path(shipped).iterdir()) == sorted(PROMETHEUS_FILES)
    assert Path(rules) == Path(shipped) / "rules.yml"
    assert Path(defaults).resolve().is_relative_to(site) and Path(defaults).is_file()
    # the same files as in the repository, byte for byte
    for name in PROMETHEUS_FILES:
        assert (Path(shipped) / name).read_bytes() == (REPO / "testbed" / "router" / "prometheus" / name).read_bytes()


def test_testbed_sim_runs_the_embedded_default_outside_the_repository(installed):
    venv_dir, work = installed
    out = work / "runs"
    r = _run([venv_dir / "bin" / "testbed", "sim", "--policies", "LC", "--seeds", "0", "--out", out], work,
             timeout=300)
    assert "Traceback" not in r.stderr
    run_dir = out / "default_core_link" / "LC" / "seed-0"
    assert (run_dir / "run.json").is_file()
    requests = pd.read_parquet(run_dir / "requests.parquet")
    assert len(requests) > 100 and {"request_id", "outcome"} <= set(requests.columns)
    assert (requests["outcome"] == "ok").any()


def test_testbed_doctor_prints_its_checks_and_a_verdict_not_a_traceback(installed):
    venv_dir, work = installed
    # 0 or 1: whether this machine can run the testbed is not this test's question
    r = _run([venv_dir / "bin" / "testbed", "doctor"], work, timeout=300, ok=(0, 1))
    text = r.stdout + r.stderr
    assert "Traceback" not in text, text
    assert "spec: the embedded testbed scenario" in r.stdout  # core/defaults/testbed.yaml, from the package
    checks = re.findall(r"^  (ok|FAIL|n/a)\s+(\S[\w ]*?)\s{2}", r.stdout, flags=re.M)
    assert {"ray", "vllm", "nixl"} <= {name for _, name in checks}, r.stdout
    (summary,) = re.findall(r"^(\d+) ok, (\d+) n/a, (\d+) FAIL: ", r.stdout, flags=re.M)
    assert sum(map(int, summary)) == len(checks)
    assert (int(summary[2]) > 0) == (r.returncode == 1)
