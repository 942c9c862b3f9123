"""The router's per-pod circuit breaker (core/breaker.py): its state machine, then in a run."""

import math

import numpy as np
import pytest

from analysis.run.scalars import run_metrics
from core.breaker import CLOSED, HALF_OPEN, OPEN, PodBreakers
from core.records import read_table
from core.spec.model import parse_spec
from builders import faulted_spec_dict, link_fault, poisson
from simulator.run import run_sim

pytestmark = pytest.mark.background  # needs no core of its own: under -n, beside the others (tests/conftest.py)


def _breakers(**kw):
    rows = []
    b = PodBreakers(2, kw.get("failures", 3), kw.get("successes", 2), kw.get("open_s", 10.0), rows.append)
    return b, rows


def test_consecutive_failures_open_a_pod_and_a_success_resets_the_count():
    b, rows = _breakers()
    assert not b.observe(0.0, (), (1,)) and not b.observe(1.0, (), (1,))
    assert not b.observe(2.0, (1,), ())  # a success: the count starts again
    assert not b.observe(3.0, (), (1,)) and not b.observe(4.0, (), (1,))
    assert b.observe(5.0, (), (1,))  # third in a row
    assert b.state == [CLOSED, OPEN] and b.blocked.tolist() == [False, True]
    assert [(r.time_s, r.pod, r.state) for r in rows] == [(5.0, 1, OPEN)]
    assert b.next_change_s == 15.0


def test_an_open_pod_half_opens_after_its_time_and_closes_after_successes():
    b, rows = _breakers(failures=1)
    b.observe(0.0, (), (0,))
    assert not b.tick(9.9) and b.state[0] == OPEN
    assert b.tick(10.0) and b.state[0] == HALF_OPEN and not b.blocked.any()
    assert math.isinf(b.next_change_s)
    assert not b.observe(11.0, (0, 1), ())  # one success of two
    assert b.observe(12.0, (0,), ()) and b.state[0] == CLOSED
    assert [r.state for r in rows] == [OPEN, HALF_OPEN, CLOSED]


def test_one_failure_while_half_open_opens_again():
    b, rows = _breakers(failures=2)
    b.observe(0.0, (), (0,))
    b.observe(0.5, (), (0,))
    b.tick(10.5)
    b.observe(11.0, (0,), ())
    assert b.observe(12.0, (), (0,)) and b.state[0] == OPEN and b.next_change_s == 22.0
    assert [r.state for r in rows] == [OPEN, HALF_OPEN, OPEN]


# Pod 1's KV link down from 20 s to 50 s: every pull across it stalls until the deadline (10 s).
RUN = faulted_spec_dict(
    name="breaker", seeds=[3], workload={"arrival": poisson(4.0), "duration_s": 90},
    faults=[link_fault([1], 0.0, 20.0, 30.0)], deadline_s=10.0,
    router={"circuit_breaker": {"failure_threshold": 3, "success_threshold": 2, "open_s": 15.0}},
    policies=["LC"])


def test_in_a_run_the_breaker_keeps_a_failing_pod_out_and_lets_it_back_once_healed(tmp_path):
    d = run_sim(parse_spec(RUN), "LC", 3, tmp_path)
    br = read_table(d, "breaker")
    pod1 = br[br.pod == 1].sort_values("time_s", kind="stable")
    opened = pod1[pod1.state == OPEN]
    assert len(opened) >= 1 and opened.time_s.min() > 20.0 + 10.0 - 1e-9  # the first timeouts come a deadline in
    # while open, not one decision sends a request to pod 1
    dec = read_table(d, "decisions")
    changes = pod1.time_s.to_numpy()
    for t_open in opened.time_s:
        later = changes[changes > t_open]
        until = later.min() if later.size else np.inf
        during = dec[(dec.time_s > t_open) & (dec.time_s < until)]
        assert len(during) > 0 and not ((during.prefill_pod == 1) | (during.decode_pod == 1)).any()
    # the link is back at 50 s: the breaker ends closed, and requests through pod 1 succeed again
    assert pod1.state.iloc[-1] == CLOSED and pod1.time_s.iloc[-1] > 50.0
    req = read_table(d, "requests")
    back = req[(req.routed_s > pod1.time_s.iloc[-1]) & ((req.prefill_pod == 1) | (req.decode_pod == 1))]
    assert len(back) > 0 and (back.outcome == "ok").all()
    m = run_metrics(d)
    assert m["breaker_opens"] == len(br[br.state == OPEN]) and m["breaker_open_pod_s"] > 0


def test_without_the_option_there_is_no_breaker(tmp_path):
    spec = parse_spec({**RUN, "router": {}})
    assert spec.router.circuit_breaker is None
    d = run_sim(spec, "LC", 3, tmp_path)
    assert read_table(d, "breaker").empty and run_metrics(d)["breaker_opens"] == 0
    # sgl-router's defaults when turned on with no field
    cb = parse_spec({**RUN, "router": {"circuit_breaker": {}}}).router.circuit_breaker
    assert (cb.failure_threshold, cb.success_threshold, cb.open_s) == (5, 2, 30.0)


@pytest.mark.parametrize("bad, where", [({"failure_threshold": 0}, "failure_threshold"), ({"open_s": -1}, "open_s"),
                                        ({"cooldown": 3}, "cooldown")])
def test_a_bad_breaker_field_is_one_line(tmp_path, bad, where):
    from core.spec.model import SpecError, load_spec

    path = tmp_path / "bad.yaml"
    import json

    path.write_text(json.dumps({**RUN, "router": {"circuit_breaker": bad}}))
    with pytest.raises(SpecError) as e:
        load_spec(path)
    msg = str(e.value)
    assert "\n" not in msg and "router.circuit_breaker" in msg and where in msg
