"""Policies from the user's own code (core/policies/plugins.py): a package outside the repository,
installed with pip into a folder of its own, registers one by an entry point; a spec names another by
its dotted path; both run in the simulator, in `testbed study` and through the testbed's request flow,
and a path that does not import or a piece of the wrong shape is one line naming it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from builders import small_spec_dict
from policy_package import POLICIES, cli, installed, make_package, mine_spec, package_on_path
from core.policies import (PolicyPluginError, UnknownPolicy, Weights, check_policy_name, forget_plugins, make_policy,
                           policy_names, reads_price)
from core.records import read_table
from core.spec.model import parse_spec
from core.topology import Topology
from core.view import Capacity, ClusterView, Loads, PodState

pytestmark = pytest.mark.background  # computations and command lines, no engine or Ray (tests/conftest.py)

@pytest.fixture
def on_path(tmp_path, monkeypatch):
    yield from package_on_path(tmp_path, monkeypatch)


def _view(prices) -> ClusterView:
    topo = Topology.build(4, 4)
    cap = Capacity(prefill_slots=8, prefill_token_budget=8192, decode_slots=64, decode_kv_tokens=100_000)
    view = ClusterView(topo, cap, Loads.zeros(topo), PodState.initial(4))
    view.pods = view.pods.replace(price=np.array(prices))
    return view


def test_a_dotted_path_names_a_policy_whose_records_carry_that_name(on_path):
    name = "my_policies.price_step_policy"
    assert check_policy_name(name) == name
    policy = make_policy(name, Weights(), np.random.default_rng(0))
    assert policy.name == name  # not the config's own "anything"
    view = _view([0.0, 0.9, 0.3, 0.0])
    pods = {int(view.topo.prefill_pod[policy.choose(view).prefill]) for _ in range(64)}
    assert pods == {0, 2, 3}  # the step keeps pod 1 out
    assert reads_price(name, Weights()) and not reads_price(name, Weights(lambda_r=0.0))
    assert not reads_price("my_policies.strict", Weights())  # a filter, no weighted scorer
    strict = make_policy("my_policies.strict", Weights(), np.random.default_rng(0))
    assert {int(view.topo.decode_pod[strict.choose(view).decode]) for _ in range(64)} == {0, 2, 3}


@pytest.mark.parametrize("name, needle", [
    ("my_policies.nothing", "module 'my_policies' has no 'nothing'"),
    ("no_such_package.policy", "cannot import 'no_such_package'"),
    ("my_policies.one_number", "pod scorer my_policies.one_number.<locals>.<lambda> gave float of shape ()"),
    ("my_policies.bad_filter", "filter my_policies.bad_filter.<locals>.<lambda> failed on a 3-pod view: TypeError"),
    ("my_policies.not_a_config", "returned a dict, not a PolicyConfig"),
    ("my_policies.unknown_piece", "no registered piece named 'healthy'"),
    ("my_policies.no_pick", "a choice on a 3-pod view failed (picker builtins.dict): TypeError: dict has no pick("),
    ("my_policies.A_CONFIG", "is a PolicyConfig, not a function of the spec's Weights"),
    ("NoSuchPolicy", "unknown policy 'NoSuchPolicy'"),
])
def test_a_policy_that_cannot_be_used_is_one_line_naming_it(on_path, name, needle):
    with pytest.raises((PolicyPluginError, UnknownPolicy)) as e:
        check_policy_name(name)
    msg = str(e.value)
    assert needle in msg and "\n" not in msg and repr(name) in msg, msg


def test_a_spec_with_a_bad_path_is_refused_by_the_spec_error(on_path):
    spec = small_spec_dict()
    with pytest.raises(ValueError) as e:
        parse_spec({**spec, "policies": ["LC", "my_policies.nothing"]})
    assert "my_policies.nothing" in str(e.value) and "has no 'nothing'" in str(e.value)


# --- installed from outside the repository -----------------------------------------------------------


def test_a_package_installed_from_outside_registers_its_policy_for_the_simulator(tmp_path):
    """`testbed policies` lists its entry point after the built-in ones, and `testbed sim` runs it
    beside a built-in policy and a dotted path, each under its own name; a path that does not import
    is one line."""
    site, work = installed(tmp_path)
    listed = cli("policies", cwd=work, site=site)
    assert listed.returncode == 0 and listed.stdout.split() == [*policy_names(), "PriceStep"], \
        listed.stdout + listed.stderr
    (work / "mine.yaml").write_text(json.dumps(mine_spec()))
    sim = cli("sim", "mine.yaml", "--out", "runs", cwd=work, site=site)
    assert sim.returncode == 0, sim.stderr[-2000:]
    for p in POLICIES:
        assert len(read_table(work / "runs" / "mine" / p / "seed-0", "requests")) > 0, p
    bad = cli("sim", "mine.yaml", "--policies", "my_policies.nothing", "--out", "runs", cwd=work, site=site)
    err = bad.stderr.strip().splitlines()
    assert bad.returncode != 0 and len(err) == 1 and "has no 'nothing'" in err[0], bad.stderr


def _dist_info(root: Path, entry_points: str, name: str = "my_policies") -> None:
    """What pip leaves for an installed distribution (its metadata and entry points), on sys.path."""
    d = root / f"{name}-0.1.dist-info"
    d.mkdir(parents=True)
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (d / "entry_points.txt").write_text(f"[pd_testbed.policies]\n{entry_points}\n")


def test_an_entry_point_is_found_by_its_name_and_one_that_takes_a_builtins_name_is_refused(tmp_path, monkeypatch):
    site = tmp_path / "site"
    _dist_info(site, "PriceStep = my_policies:price_step_policy\nLC = my_policies:strict")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.syspath_prepend(str(make_package(tmp_path / "src")))
    forget_plugins()
    try:
        assert make_policy("PriceStep", Weights(), np.random.default_rng(0)).name == "PriceStep"
        assert make_policy("LC", Weights(), np.random.default_rng(0)).config.filters == ()  # the built-in one
        with pytest.raises(PolicyPluginError, match=r"^policy 'LC': an installed package declares the name of a "
                                                    r"built-in policy; give its entry point another name$"):
            policy_names()
    finally:
        sys.modules.pop("my_policies", None)
        forget_plugins()
