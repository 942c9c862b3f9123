"""Malformed specs and traces, made here by breaking valid ones in every field and format:
each gets exit status 2 and one line on stderr naming the problem, never a traceback, and
nothing is written to the output folder.

The cases run through ``cli.main.main`` in this process (a subprocess each would cost a
second of imports apiece); a handful go through the installed script as well, so that what
the process prints around the error is checked too.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from builders import shipped_spec_dict
from cli.main import main
from workloads.samples import write_azure, write_burstgpt, write_mooncake

pytestmark = pytest.mark.background  # needs no core of its own: under -n, beside the others (tests/conftest.py)

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "experiments" / "smoke.yaml"


def _leaves(d: Any, path: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    if isinstance(d, dict):
        for k, v in d.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(d, list) and d and isinstance(d[0], dict):
        for i, v in enumerate(d):
            yield from _leaves(v, (*path, i))
    else:
        yield path, d


def _set(d: dict, path: tuple, value: Any) -> dict:
    d = copy.deepcopy(d)
    cur = d
    for k in path[:-1]:
        cur = cur[k]
    cur[path[-1]] = value
    return d


def _drop(d: dict, path: tuple) -> dict:
    d = copy.deepcopy(d)
    cur = d
    for k in path[:-1]:
        cur = cur[k]
    del cur[path[-1]]
    return d


def _base() -> dict:
    """smoke.yaml with every default written out: each field is there to break."""
    data = shipped_spec_dict(path=SMOKE, exclude={"study"})
    return data


def _wrong_type(value: Any) -> Any:
    """A value of a type the field cannot take (pydantic coerces numeric strings, so not those)."""
    if isinstance(value, bool):
        return "perhaps"
    if isinstance(value, (int, float)):
        return "a lot"
    if isinstance(value, str):
        return {"not": "a string"}
    if isinstance(value, list):
        return "not a list"
    return [["nested"]]


def _spec_cases() -> list[tuple[str, Any]]:
    """(case id, spec data or raw YAML text): every one of them invalid."""
    base = _base()
    cases: list[tuple[str, Any]] = []
    # every field, one at a time, of a type it cannot take
    for path, value in _leaves(base):
        if value is None or path[:1] == ("description",):
            continue  # None fields are optional; a description is free text
        cases.append(("type:" + ".".join(map(str, path)), _set(base, path, _wrong_type(value))))
    # an unknown key in every block (a misspelt key must not become a silent default)
    for block in ("topology", "engine", "router", "health", "telemetry", "testbed", "metrics", "workload"):
        cases.append((f"unknown-key:{block}", _set(base, (block, "colour"), "blue")))
    cases.append(("unknown-key:faults[0]", _set(base, ("faults", 0, "severity"), 3)))
    cases.append(("unknown-key:top", {**base, "polices": ["LC"]}))
    # required fields missing
    for key in ("name", "workload", "policies"):
        cases.append((f"missing:{key}", _drop(base, (key,))))
    cases.append(("missing:faults[0].pods", _drop(base, ("faults", 0, "pods"))))
    # values out of range or contradicting each other
    bad_values = {
        "topology.pods=0": (("topology", "pods"), 0),
        "topology.prefill_fraction=1": (("topology", "prefill_fraction"), 1.0),
        "topology.nic_gbps=-1": (("topology", "nic_gbps"), -1.0),
        "topology.oversubscription=0.5": (("topology", "oversubscription"), 0.5),
        "engine.prefill_tokens_per_s=nan": (("engine", "prefill_tokens_per_s"), float("nan")),
        "deadline_s=0": (("deadline_s",), 0.0),
        "ttft_timeout_s=-5": (("ttft_timeout_s",), -5.0),
        "seeds=[]": (("seeds",), []),
        "policies=[]": (("policies",), []),
        "policies=unknown": (("policies",), [{"name": "Fastest"}]),
        "policies=twice": (("policies",), [{"name": "LC"}, {"name": "LC"}]),
        "name=spaces": (("name",), "my scenario"),
        "faults[0].pods=out-of-range": (("faults", 0, "pods"), [7]),
        "faults[0].pods=twice": (("faults", 0, "pods"), [1, 1]),
        "faults[0].residual_bw=2": (("faults", 0, "residual_bw"), 2.0),
        "faults[0].residual_bw=-0.1": (("faults", 0, "residual_bw"), -0.1),
        "faults[0].duration_s=inf": (("faults", 0, "duration_s"), float("inf")),
        "faults[0].start_s=-1": (("faults", 0, "start_s"), -1.0),
        "faults[0].kind=disk": (("faults", 0, "kind"), "disk"),
        "faults[0].down-with-delay": (("faults", 0), {"kind": "link", "pods": [1], "residual_bw": 0, "start_s": 1,
                                                      "duration_s": 2, "delay_ms": 5}),
        "compute.slowdown=0.5": (("faults", 0), {"kind": "compute", "pods": [1], "slowdown": 0.5, "start_s": 1,
                                                 "duration_s": 2}),
        "arrival.kind=uniform": (("workload", "arrival"), {"kind": "uniform", "rate_rps": 1}),
        "arrival.rate_rps=-4": (("workload", "arrival", "rate_rps"), -4.0),
        "workload.no-end": (("workload",), {"arrival": {"kind": "poisson", "rate_rps": 4}, "profile": "chat"}),
        "workload.profile=huge": (("workload", "profile"), "huge"),
        "prompt.min>max": (("workload", "prompt"), {"kind": "fixed", "value": 5, "min": 9, "max": 3}),
        "prompt.uniform-low>high": (("workload", "prompt"), {"kind": "uniform", "low": 9, "high": 3}),
        "topology.within_pod-one-worker": (("topology", "workers_per_pod"), 1),
        "testbed.transport=rdma-with-link-fault": (("testbed", "transport"), "rdma"),
        "testbed.ingress_port=70000": (("testbed", "ingress_port"), 70000),
        "testbed.kv_cache_bytes=1": (("testbed", "kv_cache_bytes"), 1),
        "size:10^9 pods": (("topology", "pods"), 10**9),
        "size:10^11 requests": (("workload",), {"arrival": {"kind": "poisson", "rate_rps": 10**6}, "profile": "chat",
                                                "duration_s": 10**5}),
    }
    # the within_pod case needs pods that the faults still fit
    for name, (path, value) in bad_values.items():
        cases.append((f"value:{name}", _set(base, path, value)))
    # not YAML, or not a mapping
    cases += [
        ("yaml:unclosed", "name: x\ntopology: {pods: 4\n"),
        ("yaml:tab", "name: x\n\tpolicies: [LC]\n"),
        ("yaml:colon", "name: x: y\n"),
        ("yaml:list", "- name: x\n"),
        ("yaml:scalar", "just words\n"),
        ("yaml:empty", ""),
        ("yaml:binary", b"\x00\x01\xff\xfe name".decode("latin-1")),
    ]
    return cases


SPEC_CASES = _spec_cases()


def test_there_are_at_least_fifty_malformed_specs_and_every_field_is_broken():
    assert len(SPEC_CASES) >= 50
    assert len({c for c, _ in SPEC_CASES}) == len(SPEC_CASES)


def _check_refused(capsys, tmp_path: Path, argv: list[str], needle: str | None = None) -> str:
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse's own errors exit 2 too
        rc = e.code
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert rc == 2, (argv, rc, err)
    assert len(lines) == 1, lines
    assert "Traceback" not in err and out == ""
    assert not (tmp_path / "runs").exists(), "nothing is written for a refused spec"
    if needle is not None:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("case", [c for c, _ in SPEC_CASES])
def test_a_malformed_spec_is_one_line_and_exit_2(case, tmp_path, capsys):
    data = dict(SPEC_CASES)[case]
    path = tmp_path / "spec.yaml"
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    line = _check_refused(capsys, tmp_path, ["sim", str(path), "--out", str(tmp_path / "runs")])
    assert line.startswith("testbed: error: ")
    # it names the file, or the scenario, and for a field the field
    assert str(path) in line or "spec.yaml" in line or "smoke" in line, line
    if case.startswith(("type:", "unknown-key:", "missing:")):
        field = case.split(":", 1)[1].split(".")[-1].split("[")[0]
        assert field in line or "colour" in line or "polices" in line or "severity" in line, line


# --------------------------------------------------------------------------- traces


def _trace_cases(d: Path) -> list[tuple[str, Path, str, str]]:
    """(case id, file, format for the spec, a word the error must hold)."""
    cases = []

    def write(name: str, text: str | bytes) -> Path:
        p = d / name
        p.write_bytes(text if isinstance(text, bytes) else text.encode())
        return p

    good_rows = "arrival_s,prompt_tokens,output_tokens\n0.0,10,5\n0.5,20,5\n"
    cases += [
        ("native-csv:missing-column", write("a.csv", "arrival_s,prompt_tokens\n0.0,10\n"), "auto", "output_tokens"),
        ("native-csv:text-value", write("b.csv", good_rows + "1.0,many,5\n"), "auto", "many"),
        ("native-csv:negative", write("c.csv", good_rows + "1.0,10,-3\n"), "auto", "-3"),
        ("native-csv:nan", write("d.csv", good_rows + "nan,10,3\n"), "auto", "arrival_s"),
        ("native-csv:empty", write("e.csv", ""), "auto", "e.csv"),
        ("native-csv:header-only", write("f.csv", "arrival_s,prompt_tokens,output_tokens\n"), "auto", "f.csv"),
        ("native-csv:binary", write("g.csv", bytes(range(256)) * 4), "auto", "g.csv"),
        ("native-csv:fraction", write("h.csv", good_rows + "1.0,10.5,3\n"), "auto", "10.5"),
        ("native-jsonl:truncated", write("i.jsonl", '{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 2}\n'
                                                   '{"arrival_s": 1, "prompt'), "auto", "i.jsonl"),
        ("native-jsonl:not-object", write("j.jsonl", "[1, 2, 3]\n"), "auto", "j.jsonl"),
        ("native-parquet:garbage", write("k.parquet", b"PAR1 this is not parquet"), "auto", "k.parquet"),
        ("native:unknown-extension", write("l.tsv", good_rows), "auto", "l.tsv"),
        ("native:directory", d, "auto", "a directory, not a file"),
        ("native:missing-file", d / "nowhere.csv", "auto", "nowhere.csv"),
    ]
    az = write_azure(d / "az.csv", rows=5).path.read_text().splitlines()
    cases += [
        ("azure:bad-timestamp", write("az1.csv", "\n".join([*az[:3], "yesterday,10,5", *az[3:]])), "azure",
         "yesterday"),
        ("azure:missing-column", write("az2.csv", "\n".join(["TIMESTAMP,ContextTokens",
                                                             *[",".join(r.split(",")[:2]) for r in az[1:]]])),
         "azure", "GeneratedTokens"),
        ("azure:zero-tokens", write("az3.csv", "\n".join([*az[:2], az[2].rsplit(",", 1)[0] + ",0", *az[3:]])),
         "azure", "line 3"),
    ]
    bg = write_burstgpt(d / "bg.csv", rows=5, failures=0).path.read_text().splitlines()
    cases += [
        ("burstgpt:text-timestamp", write("bg1.csv", "\n".join([bg[0], "noon" + bg[1][bg[1].index(","):], *bg[2:]])),
         "burstgpt", "noon"),
        ("burstgpt:as-azure", write("bg2.csv", "\n".join(bg)), "azure", "bg2.csv"),
    ]
    mc = write_mooncake(d / "mc.jsonl", rows=5).path.read_text().splitlines()
    first = json.loads(mc[0])
    cases += [
        ("mooncake:text-timestamp", write("mc1.jsonl", "\n".join([json.dumps({**first, "timestamp": "soon"}), *mc[1:]])),
         "mooncake", "soon"),
        ("mooncake:missing-field", write("mc2.jsonl", "\n".join(
            [json.dumps({k: v for k, v in first.items() if k != "input_length"}), *mc[1:]])), "mooncake",
         "input_length"),
        ("mooncake:broken-line", write("mc3.jsonl", "\n".join([*mc[:2], "{oops", *mc[2:]])), "mooncake", "line 3"),
        ("mooncake:unknown-format-name", write("mc4.jsonl", "\n".join(mc)), "moon", "moon"),
    ]
    return cases


def test_malformed_traces_in_every_format_are_one_line_and_exit_2(tmp_path, capsys):
    cases = _trace_cases(tmp_path)
    assert len(cases) >= 20
    for case, path, fmt, needle in cases:
        spec = tmp_path / f"trace-{case.replace(':', '-')}.yaml"
        spec.write_text(yaml.safe_dump({
            "name": "t", "topology": {"pods": 2, "workers_per_pod": 2},
            "workload": {"arrival": {"kind": "trace", "path": str(path), "format": fmt}},
            "policies": ["LC"]}))
        try:
            line = _check_refused(capsys, tmp_path, ["sim", str(spec), "--out", str(tmp_path / "runs")], needle)
        except AssertionError as e:
            raise AssertionError(f"{case}: {e}") from None
        assert line.startswith("testbed: error: "), (case, line)


def test_the_installed_script_prints_one_line_and_nothing_else(tmp_path):
    """A few of the cases through the console script: no warning or log line around the error."""
    for case in ("yaml:unclosed", "value:faults[0].pods=out-of-range", "value:size:10^9 pods"):
        data = dict(SPEC_CASES)[case]
        path = tmp_path / "spec.yaml"
        path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
        res = subprocess.run([sys.executable, "-m", "cli", "sim", str(path), "--out", str(tmp_path / "runs")],
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 2 and res.stdout == "", (case, res)
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("testbed: error: "), (case, res.stderr)
    assert not (tmp_path / "runs").exists()
