"""The fault injector's reading of a link fault (testbed/faults/injector.py), its agents scripted: the
two directions probed at once, and probed again where they read apart (SIDES_AGREE)."""

from __future__ import annotations

import asyncio

import pytest

from builders import link_fault, parse, shipped_spec_dict

pytestmark = pytest.mark.background  # needs no core of its own: under -n, beside the others (tests/conftest.py)

R = 0.05  # the fault's residual share of the baseline
BASELINE_BPS = 10e9


class _Remote:
    def __init__(self, fn):
        self.remote = fn


class ScriptedAgent:
    """A pod's fault agent as the injector calls it (``agent.method.remote(...)``, awaited): shaping does
    nothing, and each probe of a side reads the next of ``reads[side]`` (shares of the baseline)."""

    def __init__(self, reads: dict[str, list[float]]) -> None:
        self.reads = {side: list(v) for side, v in reads.items()}
        self.probes = {"uplink": 0, "downlink": 0}

    def __getattr__(self, name: str) -> _Remote:
        async def nothing(*args, **kwargs):
            return None

        async def read(side: str) -> float:
            self.probes[side] += 1
            return self.reads[side].pop(0) * BASELINE_BPS

        async def fill(*args, **kwargs) -> int:
            return 0

        if name == "measure_uplink":
            return _Remote(lambda *a, **k: read("uplink"))
        if name == "measure_downlink":
            return _Remote(lambda *a, **k: read("downlink"))
        if name == "fill":
            return _Remote(fill)
        if name in ("apply_link", "clear"):
            return _Remote(nothing)
        raise AttributeError(name)


def _inject(tmp_path, reads: dict[str, list[float]]):
    """Pod 0's link at R of a 10 Gbit/s baseline both ways from 1 s to 2 s, read by ``reads``:
    (the apply's rows by direction, the factors the router was told after the apply, the agent)."""
    from core.experiment import build_topology
    from core.records import read_table
    from core.run import RunContext
    from testbed.faults.injector import FaultInjector, PodTargets
    from testbed.faults.probe_paths import ProbePath

    spec = parse(shipped_spec_dict("testbed.yaml"), "x.yaml", faults=[link_fault([0], R, 1.0, 1.0)],
                 topology={"link_baseline_gbps": BASELINE_BPS / 1e9})
    topo = build_topology(spec)
    agent, clock, told = ScriptedAgent(reads), [0.0], []
    path = ProbePath("10.0.0.1", 1, -1, "10.0.0.2", 2)
    with RunContext(spec, "testbed", "LC", 0, tmp_path, topo, {"requests": 0}) as ctx:
        pods = [PodTargets(agent, "eth0", [], probe=path, peer=agent)] + [
            PodTargets(ScriptedAgent({}), "eth0", []) for _ in range(topo.n_pods - 1)]
        inj = FaultInjector(ctx, pods, lambda: clock[0], BASELINE_BPS, vocab=100)

        async def walk() -> None:
            for step in ctx.steps:
                clock[0] = step.time_s
                await inj.step(step)
                if step.time_s == 1.0:
                    told.append((inj.measured["uplink"][0], inj.measured["downlink"][0]))

        asyncio.run(walk())
        run_dir = ctx.run_dir
    faults = read_table(run_dir, "faults")
    apply = faults[faults.event == "apply"].set_index("target").measured
    return {"egress": apply["pod0:eth0/egress"], "ingress": apply["pod0:eth0/ingress"]}, told[0], agent


def test_directions_that_read_alike_are_probed_once(tmp_path):
    # the clear at 2 s reads its probe at twice the old limit: got through, the limit is gone
    rows, told, agent = _inject(tmp_path, {"uplink": [0.0497, 1.0], "downlink": [0.0521, 1.0]})
    assert rows == {"egress": pytest.approx(0.0497), "ingress": pytest.approx(0.0521)}
    assert told == pytest.approx((0.0497, 0.0521)) and agent.probes == {"uplink": 2, "downlink": 2}


def test_directions_read_apart_are_probed_again_and_a_second_probe_that_agrees_is_kept(tmp_path):
    # one direction's probe starved (0.838 and 1.106 of r at once, the end-to-end job at 0e542be)
    rows, told, agent = _inject(tmp_path, {"uplink": [0.838 * R, 0.99 * R, 1.0],
                                           "downlink": [1.106 * R, 1.01 * R, 1.0]})
    assert rows == {"egress": pytest.approx(0.99 * R), "ingress": pytest.approx(1.01 * R)}
    assert told == pytest.approx((0.99 * R, 1.01 * R)) and agent.probes == {"uplink": 3, "downlink": 3}


def test_directions_apart_twice_keep_each_ones_higher_reading(tmp_path):
    # a slower port behind the downlink carries half the limit each time; the uplink's first probe starved
    rows, told, agent = _inject(tmp_path, {"uplink": [0.6 * R, R, 1.0], "downlink": [0.5 * R, 0.49 * R, 1.0]})
    assert rows == {"egress": pytest.approx(R), "ingress": pytest.approx(0.5 * R)}
    assert told == pytest.approx((R, 0.5 * R)) and agent.probes == {"uplink": 3, "downlink": 3}


@pytest.mark.parametrize("sides, rates, agree", [
    ([("uplink", 0.05, 1.0), ("downlink", 0.05, 1.0)], [0.947, 1.045], True),  # the probe's spread
    ([("uplink", 0.05, 1.0), ("downlink", 0.05, 1.0)], [0.838, 1.106], False),
    ([("uplink", 0.05, 1.0), ("downlink", 0.05, 1.0)], [0.0, 0.0], False),  # nothing read: a limit is not 0
    ([("uplink", 0.0, 1.0), ("downlink", 0.0, 1.0)], [0.0, 0.3], True),  # a link down: nothing to compare
    ([("uplink", 1.0, 0.05), ("downlink", 1.0, 0.05)], [1.0, 0.4], True),  # a clear: its own rule
    ([("uplink", 0.05, 1.0), ("downlink", 0.1, 1.0)], [1.0, 2.0], True),  # set apart
    ([("uplink", 0.05, 1.0)], [1.0], True),
])
def test_which_readings_agree(sides, rates, agree):
    from testbed.faults.injector import sides_agree

    assert sides_agree(sides, rates) is agree
