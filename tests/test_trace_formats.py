"""Public trace formats read as published: Azure (2023, 2024), BurstGPT, Mooncake.

Samples come from `workloads.samples` (seeded, written in each source's exact
layout); every check compares what the reader returns with what was written.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from pydantic import ValidationError

from workloads import WorkloadError, WorkloadSpec, generate, load_trace
from workloads.samples import main as samples_main
from workloads.samples import write_azure, write_burstgpt, write_mooncake, write_samples

pytestmark = pytest.mark.background  # needs no core of its own: under -n, beside the others (tests/conftest.py)

ROWS = 120


@pytest.fixture(scope="module")
def samples(tmp_path_factory):
    return write_samples(tmp_path_factory.mktemp("samples"), rows=ROWS, seed=7)


def rng():
    return np.random.default_rng(0)


def wl(path, **arrival):
    """The workload of a trace arrival; workload-level keys (duration_s, max_requests) go in `_wl`."""
    extra = arrival.pop("_wl", {})
    return generate(WorkloadSpec(arrival={"kind": "trace", "path": str(path), **arrival}, **extra), rng())


def edit_line(src: Path, dst: Path, lineno: int, change) -> Path:
    """Copy src to dst with line `lineno` (1-based) replaced by change(line)."""
    lines = src.read_text().split("\n")
    lines[lineno - 1] = change(lines[lineno - 1])
    dst.write_text("\n".join(lines))
    return dst


def load_error(path, fmt="auto") -> str:
    with pytest.raises(WorkloadError) as err:
        load_trace(path, fmt)
    msg = str(err.value)
    assert "\n" not in msg and str(path) in msg
    return msg


# --------------------------------------------------------------------------- reading


@pytest.mark.parametrize("name", ["azure2023", "azure2024", "burstgpt", "mooncake"])
def test_each_format_reads_its_sample(samples, name):
    s = samples[name]
    tr = load_trace(s.path)  # auto-detected
    assert tr.format == s.format
    np.testing.assert_allclose(tr.arrival_s, s.arrival_s, rtol=0, atol=1e-9)
    np.testing.assert_array_equal(tr.prompt_tokens, s.prompt_tokens)
    np.testing.assert_array_equal(tr.output_tokens, s.output_tokens)
    assert tr.arrival_s[0] == 0.0 and np.all(np.diff(tr.arrival_s) >= 0)
    assert tr.dropped == s.dropped
    # Named explicitly, the same rows come back.
    again = load_trace(s.path, s.format)
    np.testing.assert_array_equal(again.arrival_s, tr.arrival_s)
    np.testing.assert_array_equal(again.prompt_tokens, tr.prompt_tokens)


def test_line_numbers_of_rows(samples):
    for name in ("azure2023", "mooncake"):
        s = samples[name]
        tr = load_trace(s.path)
        np.testing.assert_array_equal(tr.line, np.arange(ROWS) + 1 + s.header_lines)
    # BurstGPT: the failed rows are gone, the others keep their own lines.
    s = samples["burstgpt"]
    tr = load_trace(s.path)
    text = s.path.read_text().splitlines()
    failed = [i + 1 for i, ln in enumerate(text[1:], 1) if ln.split(",")[3] == "0"]
    assert len(failed) == s.dropped["failed"] > 0
    assert sorted(set(range(2, ROWS + 2)) - set(tr.line.tolist())) == failed


def test_azure_2023_and_2024_timestamp_shapes(tmp_path):
    p23 = tmp_path / "a23.csv"
    p23.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.7784190,374,44\n"
        "2023-11-16 18:15:46.7784191,10,1\n"  # 100 ns later: the 7th digit counts
        "2023-11-16 18:15:50.9951690,396,109"
    )
    tr = load_trace(p23)
    np.testing.assert_allclose(tr.arrival_s, [0.0, 1e-7, 4.21675], rtol=0, atol=1e-12)
    # 2024: an offset, 6 digits or none; the shape the brief quoted (7 digits, naive) in its own file.
    p24 = tmp_path / "a24.csv"
    p24.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2024-05-12 00:00:00+00:00,1452,3\n"
        "2024-05-12 00:00:00.001163+00:00,584,3\n"
        "2024-05-12 01:00:00.5+01:00,862,38\n"  # same instant as 00:00:00.5 UTC
    )
    np.testing.assert_allclose(load_trace(p24).arrival_s, [0.0, 0.001163, 0.5], rtol=0, atol=1e-12)
    p7 = tmp_path / "a7.csv"
    p7.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00.0009330,5,5\n2024-05-10 00:00:01.0009330,5,5\n")
    np.testing.assert_allclose(load_trace(p7).arrival_s, [0.0, 1.0], rtol=0, atol=1e-12)


def test_rows_out_of_order_are_sorted_from_the_earliest(tmp_path):
    p = tmp_path / "mc.jsonl"
    p.write_text(
        '{"timestamp": 9000, "input_length": 3, "output_length": 1}\n'
        "\n"
        '{"timestamp": 3000, "input_length": 2, "output_length": 1, "hash_ids": [0]}\n'
    )
    tr = load_trace(p)
    np.testing.assert_array_equal(tr.arrival_s, [0.0, 6.0])
    np.testing.assert_array_equal(tr.prompt_tokens, [2, 3])
    np.testing.assert_array_equal(tr.line, [3, 1])
    assert tr.hash_ids.tolist() == [[0], None]


def test_mooncake_keeps_hash_ids(samples):
    s = samples["mooncake"]
    assert load_trace(s.path).hash_ids.tolist() == s.hash_ids


# --------------------------------------------------------------------------- detection


@pytest.mark.parametrize(
    "header, row, fmt",
    [
        ("arrival_s,prompt_tokens,output_tokens", "0.5,10,2", "native"),
        # a native file that also has another format's columns stays native
        ("TIMESTAMP,arrival_s,prompt_tokens,output_tokens,ContextTokens,GeneratedTokens", "x,0.5,10,2,1,1", "native"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens", "2023-11-16 18:15:46.7784190,10,2", "azure"),
        ("GeneratedTokens,TIMESTAMP,ContextTokens", "2,2023-11-16 18:15:46.7784190,10", "azure"),
        ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type", "5,ChatGPT,10,2,12,API log", "burstgpt"),
        # the columns BurstGPT's README announces for later releases
        ("Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type",
         "5,s1,3.2,GPT-4,10,2,12,Conversation log", "burstgpt"),
    ],
)
def test_csv_format_detected_from_the_header(tmp_path, header, row, fmt):
    p = tmp_path / "t.csv"
    p.write_text(f"{header}\n{row}\n")
    tr = load_trace(p)
    assert tr.format == fmt and tr.prompt_tokens.tolist() == [10] and tr.output_tokens.tolist() == [2]


def test_jsonl_format_detected_from_the_first_object(tmp_path):
    native = tmp_path / "n.jsonl"
    native.write_text('{"arrival_s": 1.5, "prompt_tokens": 4, "output_tokens": 2}\n')
    assert load_trace(native).format == "native"
    assert load_trace(native).arrival_s.tolist() == [1.5]  # native times are not rebased
    moon = tmp_path / "m.ndjson"
    moon.write_text('\n{"timestamp": 250, "input_length": 4, "output_length": 2, "hash_ids": [0]}\n')
    assert load_trace(moon).format == "mooncake"


def test_a_named_public_format_ignores_the_extension(tmp_path, samples):
    p = tmp_path / "trace.txt"
    shutil.copy(samples["mooncake"].path, p)
    assert len(load_trace(p, "mooncake")) == ROWS
    assert "unknown extension '.txt'" in load_error(p)  # auto goes by the extension


def test_unknown_columns_list_the_known_formats(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("when,in,out\n1,2,3\n")
    msg = load_error(p)
    assert "missing column(s) arrival_s, prompt_tokens, output_tokens (has: when, in, out)" in msg
    assert "azure: TIMESTAMP, ContextTokens, GeneratedTokens" in msg and "arrival.format" in msg


def test_public_columns_read_as_native_say_which_format_they_are(samples):
    msg = load_error(samples["azure2023"].path, "native")
    assert msg.endswith("these are the columns of format azure (arrival.format: azure or auto)")


# --------------------------------------------------------------------------- spec options


def test_window_speedup_and_cap(samples):
    s = samples["azure2023"]
    a = s.arrival_s
    start, end = float(a[20]), float(a[80])  # [start, end): rows 20..79, unless ties at the edges
    sel = (a >= start) & (a < end)
    w = wl(s.path, start_s=start, end_s=end)
    np.testing.assert_allclose(w.arrival_s, a[sel] - start, atol=1e-9)
    np.testing.assert_array_equal(w.prompt_tokens, s.prompt_tokens[sel])
    assert w.arrival_s[0] == 0.0 and w.trace["in_window"] == sel.sum()
    # speedup divides the times; time_scale multiplies; both are the same rate scaling
    fast = wl(s.path, start_s=start, end_s=end, speedup=4.0)
    np.testing.assert_allclose(fast.arrival_s, (a[sel] - start) / 4.0, atol=1e-9)
    np.testing.assert_allclose(wl(s.path, time_scale=0.25).arrival_s, a * 0.25, atol=1e-9)
    # the workload's cap counts from the window's start, after scaling
    capped = wl(s.path, start_s=start, speedup=4.0, _wl={"max_requests": 7})
    np.testing.assert_allclose(capped.arrival_s, (a[a >= start][:7] - start) / 4.0, atol=1e-9)
    cut = wl(s.path, speedup=2.0, _wl={"duration_s": 10.0})
    assert len(cut) == int(np.sum(a / 2.0 < 10.0)) and cut.duration_s == 10.0


def test_an_empty_window_is_an_error(samples):
    s = samples["burstgpt"]
    last = float(s.arrival_s[-1])
    with pytest.raises(WorkloadError) as err:
        wl(s.path, start_s=last + 1.0)
    msg = str(err.value)
    assert "\n" not in msg and str(s.path) in msg
    assert msg.startswith(f"trace {s.path}: no requests in the window [{last + 1.0:g}, end) s;")


@pytest.mark.parametrize(
    "arrival, problem",
    [
        ({"speedup": 2.0, "time_scale": 0.5}, "speedup or time_scale, not both"),
        ({"start_s": 5.0, "end_s": 5.0}, "end_s (5) must be greater than start_s (5)"),
        ({"start_s": -1.0}, "start_s"),
        ({"speedup": 0}, "speedup"),
        ({"too_long": "clip"}, "too_long needs max_context_tokens"),
        ({"max_context_tokens": 1}, "max_context_tokens"),
        ({"too_long": "truncate", "max_context_tokens": 100}, "too_long"),
        ({"format": "sharegpt"}, "format"),
        ({"fromat": "azure"}, "fromat"),
    ],
)
def test_bad_trace_options_are_validation_errors(arrival, problem):
    with pytest.raises(ValidationError, match=re.escape(problem)):
        WorkloadSpec(arrival={"kind": "trace", "path": "t.csv", **arrival})


def _long_sample(tmp_path) -> Path:
    """Mooncake rows with known lengths: line 4 needs 5000 + 100 tokens."""
    rows = [(0, 1000, 10), (1000, 2000, 20), (2000, 3000, 30), (3000, 5000, 100), (4000, 4096, 1), (5000, 100, 5000)]
    p = tmp_path / "long.jsonl"
    p.write_text("".join(json.dumps({"timestamp": t, "input_length": i, "output_length": o}) + "\n" for t, i, o in rows))
    return p


def test_too_long_refuse_names_the_line_and_values(tmp_path):
    p = _long_sample(tmp_path)
    with pytest.raises(WorkloadError) as err:
        wl(p, max_context_tokens=4096)
    assert str(err.value) == (
        f"trace {p}, line 4: input_length + output_length = 5000 + 100 = 5100 tokens, more than "
        "max_context_tokens 4096 (too_long: refuse; clip or drop replays the trace)"
    )
    # only what is replayed is checked
    assert len(wl(p, max_context_tokens=4096, _wl={"max_requests": 3})) == 3
    assert len(wl(p, max_context_tokens=4096, end_s=3.0)) == 3


def test_too_long_drop_and_clip(tmp_path):
    p = _long_sample(tmp_path)
    d = wl(p, max_context_tokens=4096, too_long="drop")
    assert d.prompt_tokens.tolist() == [1000, 2000, 3000]
    assert d.arrival_s.tolist() == [0.0, 1.0, 2.0]
    assert d.trace["dropped_too_long"] == 3 and d.summary()["trace"]["dropped_too_long"] == 3
    c = wl(p, max_context_tokens=4096, too_long="clip")
    assert c.prompt_tokens.tolist() == [1000, 2000, 3000, 3996, 4095, 1]
    assert c.output_tokens.tolist() == [10, 20, 30, 100, 1, 4095]
    assert np.all(c.prompt_tokens + c.output_tokens <= 4096) and c.trace["clipped_too_long"] == 3
    with pytest.raises(WorkloadError, match="all 1 requests need more than max_context_tokens 100"):
        wl(p, max_context_tokens=100, too_long="drop", start_s=5.0)


def test_burstgpt_failed_requests_are_dropped_and_counted(samples, tmp_path):
    s = samples["burstgpt"]
    w = wl(s.path)
    assert len(w) == ROWS - s.dropped["failed"]
    assert w.summary()["trace"] == {
        "path": str(s.path), "format": "burstgpt", "rows": len(w), "dropped_failed": s.dropped["failed"]
    }
    p = tmp_path / "allfail.csv"
    p.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n5,ChatGPT,10,0,10,API log\n")
    assert load_error(p) == f"trace {p}: all 1 rows are failed requests (Response tokens 0)"


# --------------------------------------------------------------------------- malformed files: one line, file, line, value


def test_malformed_azure(samples, tmp_path):
    src = samples["azure2023"].path
    p = edit_line(src, tmp_path / "a1.csv", 7, lambda ln: ln.replace(",", ",12x", 1))
    assert load_error(p) == f"trace {p}, line 7: ContextTokens is not a number: '12x{ln_field(src, 7, 1)}'"
    p = edit_line(src, tmp_path / "a2.csv", 9, lambda ln: "2023-11-16 25:61:00.0000000" + ln[27:])
    assert load_error(p) == f"trace {p}, line 9: TIMESTAMP is not a timestamp: '2023-11-16 25:61:00.0000000'"
    p = edit_line(src, tmp_path / "a3.csv", 11, lambda ln: ln.rsplit(",", 1)[0] + ",-4")
    assert load_error(p) == f"trace {p}, line 11: GeneratedTokens must be >= 1, got -4"
    p = edit_line(src, tmp_path / "a5.csv", 13, lambda ln: ln + ",9")  # a field too many: pandas names the line
    assert load_error(p) == f"trace {p}: cannot read as csv: Error tokenizing data. C error: Expected 3 fields in line 13, saw 4"
    p = edit_line(src, tmp_path / "a4.csv", 1, lambda ln: "TIMESTAMP,ContextTokens,Generated")
    assert load_error(p, "azure") == (
        f"trace {p}, line 1: missing column(s) GeneratedTokens for format azure (has: TIMESTAMP, ContextTokens, Generated)"
    )


def ln_field(path: Path, lineno: int, col: int) -> str:
    return path.read_text().split("\n")[lineno - 1].split(",")[col]


def test_malformed_burstgpt(samples, tmp_path):
    src = samples["burstgpt"].path

    def negative(ln):
        f = ln.split(",")
        f[2] = "-5"
        return ",".join(f)

    p = edit_line(src, tmp_path / "b1.csv", 20, negative)
    assert load_error(p) == f"trace {p}, line 20: Request tokens must be >= 1, got -5"
    p = edit_line(src, tmp_path / "b2.csv", 4, lambda ln: "soon" + ln[ln.index(","):])
    assert load_error(p) == f"trace {p}, line 4: Timestamp is not a number: 'soon'"


def test_malformed_mooncake(samples, tmp_path):
    src = samples["mooncake"].path
    p = edit_line(src, tmp_path / "m1.jsonl", 15, lambda ln: ln[:-5])
    msg = load_error(p)
    assert msg.startswith(f"trace {p}, line 15: cannot read as jsonl: not valid JSON (")
    assert "'{\"timestamp\": " in msg  # the line's text
    p = edit_line(src, tmp_path / "m2.jsonl", 16, lambda ln: ln.replace('"output_length"', '"out_len"'))
    assert load_error(p).startswith(f"trace {p}, line 16: missing key 'output_length' for format mooncake (has: ")
    p = edit_line(src, tmp_path / "m3.jsonl", 17, lambda ln: re.sub(r'"input_length": \d+', '"input_length": "12"', ln))
    assert load_error(p) == f'trace {p}, line 17: input_length is not a number: "12"'
    p = edit_line(src, tmp_path / "m4.jsonl", 18, lambda ln: re.sub(r'"timestamp": \d+', '"timestamp": -3', ln))
    assert load_error(p) == f"trace {p}, line 18: timestamp must be a finite number >= 0 (milliseconds), got -3"


def test_blank_lines_do_not_shift_the_line_numbers(samples, tmp_path):
    src = samples["azure2023"].path
    lines = src.read_text().split("\n")
    lines.insert(3, "")  # a blank line 4; data row 3 moves to line 5
    lines[9] = lines[9].rsplit(",", 1)[0] + ",x"  # line 10
    p = tmp_path / "blank.csv"
    p.write_text("\n".join(lines))
    assert load_error(p) == f"trace {p}, line 10: GeneratedTokens is not a number: 'x'"


def test_native_format_keeps_its_messages(tmp_path):
    p = tmp_path / "n.csv"
    p.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,1\n1,x7,1\n")
    assert load_error(p) == f"trace {p}: non-numeric value 'x7' in column prompt_tokens at data row 2"


# --------------------------------------------------------------------------- samples and the simulator


def test_samples_are_seeded_and_the_cli_writes_them(tmp_path, capsys):
    a = write_mooncake(tmp_path / "a.jsonl", rows=50, seed=3)
    b = write_mooncake(tmp_path / "b.jsonl", rows=50, seed=3)
    assert a.path.read_text() == b.path.read_text()
    assert write_azure(tmp_path / "c.csv", rows=50, seed=3).path.read_text() != write_azure(
        tmp_path / "d.csv", rows=50, seed=4).path.read_text()
    first = write_azure(tmp_path / "e.csv", rows=60, seed=1, year=2024).path.read_text().split("\n")[1]
    assert re.fullmatch(r"2024-05-10 00:00:00\+00:00,\d+,\d+", first)
    assert write_burstgpt(tmp_path / "f.csv", rows=50, seed=1, failures=0).dropped == {}
    samples_main([str(tmp_path / "out"), "--rows", "60"])
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == ["sample_AzureLLMInferenceTrace_code.csv", "sample_AzureLLMInferenceTrace_conv_1week.csv",
                     "sample_BurstGPT_1.csv", "sample_mooncake_trace.jsonl"]
    assert "azure2023" in capsys.readouterr().out


def test_simulator_replays_an_azure_sample(samples, tmp_path):
    from core.records import read_table
    from core.spec.model import parse_spec
    from simulator.run import run_sim

    s = samples["azure2023"]
    spec = parse_spec({
        "name": "azure_smoke",
        "topology": {"pods": 2, "workers_per_pod": 2},
        "workload": {"arrival": {"kind": "trace", "path": s.path.name, "speedup": 2.0}, "max_requests": 30},
        "deadline_s": 60.0,
        "policies": ["LC"],
    })
    run_dir = run_sim(spec, "LC", 0, tmp_path / "runs", base_dir=s.path.parent)
    r = read_table(run_dir, "requests").sort_values("request_id").reset_index(drop=True)
    assert len(r) == 30
    np.testing.assert_allclose(r.arrival_s, s.arrival_s[:30] / 2.0, atol=1e-9)
    np.testing.assert_array_equal(r.prompt_tokens, s.prompt_tokens[:30])
    assert (r.outcome == "ok").all()
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["workload"]["trace"]["format"] == "azure"
    assert meta["spec"]["workload"]["arrival"]["format"] == "auto"


def test_a_too_long_rule_without_a_limit_takes_the_testbed_engines_context():
    from builders import shipped_spec_dict
    from core.spec.model import parse_spec

    base = shipped_spec_dict()
    wl = {k: v for k, v in base["workload"].items() if k != "duration_s"}

    def arrival(**kw):
        return parse_spec({**base, "testbed": {**base["testbed"], "max_model_len": 2048},
                           "workload": {**wl, "arrival": {"kind": "trace", "path": "t.csv", **kw}}}).workload.arrival

    assert arrival(too_long="clip").max_context_tokens == 2048
    assert arrival(too_long="clip", max_context_tokens=512).max_context_tokens == 512
    assert arrival().max_context_tokens is None  # no rule: the simulator keeps every request


def test_a_trace_named_relative_to_its_spec_is_that_file_wherever_the_command_runs(tmp_path, monkeypatch):
    """load_spec makes a relative trace path its spec's: the testbed's jobs (testbed/runs/jobs.py, which
    generate without a base folder) read the file the simulator reads, from any working directory."""
    from core.experiment import seed_streams
    from core.spec.model import load_spec

    (tmp_path / "specs" / "traces").mkdir(parents=True)
    (tmp_path / "specs" / "traces" / "t.csv").write_text("arrival_s,prompt_tokens,output_tokens\n0,100,8\n1,200,8\n")
    (tmp_path / "specs" / "s.yaml").write_text("name: t\nworkload:\n  arrival: {kind: trace, path: traces/t.csv}\n"
                                               "policies: [LC]\n")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    spec = load_spec("../specs/s.yaml")
    assert Path(spec.workload.arrival.path) == (tmp_path / "specs" / "traces" / "t.csv").resolve()
    wl = generate(spec.workload, seed_streams(0)["workload"])
    assert list(wl.prompt_tokens) == [100, 200]
