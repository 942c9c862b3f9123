"""The user's policy package both policy test modules install and run (tests/test_policy_plugins.py,
tests/test_policy_plugins_study.py): its source, made on disk outside the repository, put on sys.path
or pip-installed into a folder of its own, and the command line and spec that name its policies."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from builders import small_spec_dict
from core.policies import forget_plugins

# The user's package: a pod scorer of their own (a step of the risk price) in two policies, one
# registered by an entry point, one left for a spec to name by its path; and pieces of wrong shapes.
MODULE = textwrap.dedent('''
    import numpy as np
    from core.policies import PolicyConfig, Weights

    def price_step(pods):
        """1 for a pod priced above 0.5, else 0."""
        return (pods.price > 0.5).astype(float)

    def price_step_policy(w: Weights) -> PolicyConfig:
        return PolicyConfig("anything", pod_scorers=((price_step, w.lambda_r),))

    def strict(w: Weights) -> PolicyConfig:
        """Never a pod priced above 0.5 while another is left: a filter of its own."""
        return PolicyConfig("strict", filters=(lambda pods: pods.price <= 0.5,), picker="random")

    def one_number(w):
        return PolicyConfig("bad", pod_scorers=((lambda pods: 1.0, 1.0),))

    def bad_filter(w):
        return PolicyConfig("bad", filters=(lambda pods, extra: pods.price,))

    def not_a_config(w):
        return {"filters": ["health"]}

    def unknown_piece(w):
        return PolicyConfig("bad", filters=("healthy",))

    def no_pick(w):
        return PolicyConfig("bad", picker=dict)

    A_CONFIG = PolicyConfig("bad")
''')
PYPROJECT = textwrap.dedent('''
    [build-system]
    requires = ["setuptools>=61"]
    build-backend = "setuptools.build_meta"

    [project]
    name = "my-policies"
    version = "0.1"

    [project.entry-points."pd_testbed.policies"]
    PriceStep = "my_policies:price_step_policy"
''')


def make_package(root: Path) -> Path:
    pkg = root / "my-policies"
    (pkg / "my_policies").mkdir(parents=True)
    (pkg / "my_policies" / "__init__.py").write_text(MODULE)
    (pkg / "pyproject.toml").write_text(PYPROJECT)
    return pkg


def package_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The package importable in this process (its source on sys.path), not installed."""
    monkeypatch.syspath_prepend(str(make_package(tmp_path)))
    forget_plugins()
    yield
    sys.modules.pop("my_policies", None)
    forget_plugins()




def cli(*args: str, cwd: Path, site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run([sys.executable, "-m", "cli", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def installed(tmp_path: Path) -> tuple[Path, Path]:
    """The package pip-installed into a folder of its own (nothing of the machine's changes): (site, work)."""
    pkg, site, work = make_package(tmp_path / "src"), tmp_path / "site", tmp_path / "work"
    work.mkdir()
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                          "--target", str(site), str(pkg)], capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stderr
    return site, work


POLICIES = ["LC", "PriceStep", "my_policies.strict"]  # built-in, the entry point, the dotted path


def mine_spec(**over) -> dict:
    return {**small_spec_dict(), "name": "mine", "policies": POLICIES, "seeds": [0],
            "faults": [{"kind": "link", "pods": [1], "residual_bw": 0.005, "start_s": 2.0, "duration_s": 20.0}],
            **over}
