from pathlib import Path

import pytest

from core.spec.model import SpecError, load_spec, parse_spec

pytestmark = pytest.mark.background  # needs no core of its own: under -n, beside the others (tests/conftest.py)

REPO = Path(__file__).resolve().parents[1]
MINIMAL = {
    "name": "m",
    "workload": {"arrival": {"kind": "poisson", "rate_rps": 1.0}, "profile": "chat", "duration_s": 10},
    "policies": ["LC"],
}


def _err(data) -> str:
    with pytest.raises(SpecError) as e:
        parse_spec(data, "x.yaml")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("x.yaml: ")
    return msg


@pytest.mark.parametrize("path", sorted((REPO / "experiments").glob("*.yaml")))
def test_shipped_experiments_are_valid(path):
    spec = load_spec(path)
    assert spec.policies and spec.faults


def test_embedded_default_is_valid():
    spec = load_spec(None)
    assert spec.topology.pods == 32 and spec.topology.workers_per_pod == 32
    assert {p.name for p in spec.policies} >= {"LC", "FaultAwareLC", "OTF-R", "FaultAwareOTF-R", "OracleAvoidance"}


def test_unknown_policy_lists_the_known_ones():
    msg = _err({**MINIMAL, "policies": ["LC", "FastestFirst"]})
    assert "policies.1.name" in msg and "FastestFirst" in msg and "OracleAvoidance" in msg


def test_misspelt_field_is_named():
    msg = _err({**MINIMAL, "topology": {"podz": 4}})
    assert "topology.podz" in msg and "Extra inputs" in msg


def test_out_of_range_values_are_named():
    assert "residual_bw" in _err({**MINIMAL, "faults": [{"kind": "link", "pods": [0], "residual_bw": 1.5,
                                                         "start_s": 0, "duration_s": 1}]})
    assert "deadline_s" in _err({**MINIMAL, "deadline_s": -1})


def test_fault_on_a_pod_the_topology_lacks():
    msg = _err({**MINIMAL, "topology": {"pods": 4}, "faults": [{"kind": "compute", "pods": [7], "slowdown": 2,
                                                                  "start_s": 0, "duration_s": 1}]})
    assert "faults[0]" in msg and "pod 7" in msg


def test_unknown_fault_kind_and_missing_field():
    assert "faults.0" in _err({**MINIMAL, "faults": [{"kind": "meteor", "pods": [0]}]})
    assert "workload" in _err({k: v for k, v in MINIMAL.items() if k != "workload"})


def test_per_policy_weights_override(tmp_path):
    spec = parse_spec({**MINIMAL, "policies": ["LC", {"name": "OTF-R", "weights": {"lambda_r": 3.0}}]})
    assert spec.weights_for("OTF-R").lambda_r == 3.0
    assert spec.weights_for("LC").lambda_r == spec.weights.lambda_r


def test_bad_files(tmp_path):
    with pytest.raises(SpecError, match="not found"):
        load_spec(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(SpecError, match=r"not valid YAML at line \d+"):
        load_spec(bad)
    bad.write_text("- just\n- a list\n")
    with pytest.raises(SpecError, match="must be a YAML mapping"):
        load_spec(bad)


def test_two_gpus_per_engine_are_refused_in_one_line_saying_why():
    msg = _err({**MINIMAL, "testbed": {"gpus_per_engine": 2}})
    assert "at testbed.gpus_per_engine:" in msg and "got 2" in msg and "one device" in msg
    assert "greater than or equal to 0" in _err({**MINIMAL, "testbed": {"gpus_per_engine": -1}})
    assert parse_spec({**MINIMAL, "testbed": {"gpus_per_engine": 1}}).testbed.gpus_per_engine == 1


def test_enforce_eager_is_left_to_the_device_or_a_bool():
    assert parse_spec(MINIMAL).testbed.enforce_eager is None
    assert parse_spec({**MINIMAL, "testbed": {"enforce_eager": False}}).testbed.enforce_eager is False
    assert "at testbed.enforce_eager:" in _err({**MINIMAL, "testbed": {"enforce_eager": "perhaps"}})
