"""A policy of the user's own through the testbed's request flow and in `testbed study`
(core/policies/plugins.py; the rest in tests/test_policy_plugins.py). Not marked background: the
flow runs on the wall clock against deadlines and the study starts a local Ray, so they run in the
group, one at a time (tests/conftest.py)."""

from __future__ import annotations

import asyncio
import json
import time

import numpy as np
import pytest

from builders import small_spec_dict
from core.experiment import build_topology
from core.records import read_table
from core.run import RunContext
from core.spec.model import parse_spec
from policy_package import POLICIES, cli, installed, mine_spec, package_on_path


@pytest.fixture
def on_path(tmp_path, monkeypatch):
    yield from package_on_path(tmp_path, monkeypatch)


def test_the_testbeds_request_flow_routes_with_a_users_policy(on_path, tmp_path):
    """The testbed's router (RunContext and RequestFlow, what its router actor runs) makes the policy
    from the same name; against scripted engines, pod 1, priced over the step, gets nothing."""
    from test_stages import KV, ScriptedEngine
    from testbed.router.flow import RequestFlow

    name = "my_policies.price_step_policy"
    spec = parse_spec({**small_spec_dict(), "policies": [name]})
    topo = build_topology(spec)
    engines = [ScriptedEngine({"alloc": 0.0, "alloc_remote": 0.0, "recv_done": 0.01}, end=0.02, first=0.01)
               for _ in range(topo.prefill_ids.size + topo.decode_ids.size)]
    n = 12
    with RunContext(spec, "testbed", name, 0, tmp_path, topo, {"requests": n}) as ctx:
        ctx.router.view.pods = ctx.router.view.pods.replace(price=np.where(np.arange(topo.n_pods) == 1, 0.9, 0.0))
        t0 = time.monotonic()
        flow = RequestFlow(ctx, engines[:topo.prefill_ids.size], engines[topo.prefill_ids.size:], spec.deadline_s,
                           lambda: time.monotonic() - t0, vocab=2048, kv_bytes_per_token=KV,
                           block_tokens=spec.engine.kv_block_tokens, first_token_limit_s=spec.first_token_limit_s)

        async def go():
            return [await flow.handle(i, time.monotonic() - t0, 256, 4) for i in range(n)]

        assert asyncio.run(go()) == ["ok"] * n
    req = read_table(ctx.run_dir, "requests")
    assert ctx.run_dir.parent.name == name and len(req) == n
    assert 1 not in set(req.prefill_pod) | set(req.decode_pod)


def test_a_package_installed_from_outside_runs_in_a_study(tmp_path):
    """`testbed study` runs the entry point's policy and the dotted path in its cells (Ray's workers
    import them as the command did)."""
    site, work = installed(tmp_path)
    study = mine_spec(study={"seeds": [0], "sweeps": [{"name": "severe", "axes": {"severity": [0.005]}}]})
    (work / "study.yaml").write_text(json.dumps(study))
    res = cli("study", "study.yaml", "--world", "sim", "--workers", "1", "--out", "studies", cwd=work, site=site)
    assert res.returncode == 0, res.stderr[-2000:]
    cells = {p.parent.parent.name for p in (work / "studies").rglob("seed-0/requests.parquet")}
    assert cells == set(POLICIES), cells
