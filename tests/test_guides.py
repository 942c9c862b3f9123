"""The task guides (docs/guides/) are run as written, so that a guide cannot rot.

A guide says what this test does with a fenced block by an HTML comment on the line before it
(invisible where the page is rendered):

* ``<!-- guide-test: write PATH -->``: the block is written to PATH;
* ``<!-- guide-test: append PATH -->``: it is appended to PATH;
* ``<!-- guide-test: insert PATH after "TEXT" -->``: inserted after the one line containing TEXT;
* ``<!-- guide-test: replace PATH line "TEXT" -->``: it replaces the one line containing TEXT;
* ``<!-- guide-test: run -->`` (or ``run, exit N``): each line a command, ``testbed`` run as
  ``python -m cli`` and ``python`` as this interpreter; each must exit 0 (or N);
* ``<!-- guide-test: python -->``: a Python script, its output kept for the next step;
* ``<!-- guide-test: output -->``: what the step before printed: the same text (runs of spaces
  aside), each number the guide states reproduced (:func:`figures_off`): a whole number exactly (a
  count: "18 of 19" where the run prints 17 is a stale guide), a decimal within 5% of itself or one
  unit of its last printed digit, whichever is wider (the simulator's runs are deterministic; the
  slack absorbs float formatting across library versions, not a change of behaviour).

Steps run in order, in a folder of the guide's own under pytest's ``tmp_path``; a guide that edits
the project (add-a-fault-kind.md) runs in a copy of its packages there. Each test then checks what the
guide's example made. Every ``testbed`` command of a guide, run or not, must parse, and every link
of a guide must resolve.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

from cli.main import build_parser
from core.policies import POLICY_NAMES

pytestmark = pytest.mark.background  # needs no core of its own: under -n, beside the others (tests/conftest.py)

REPO = Path(__file__).resolve().parents[1]
GUIDES = REPO / "docs" / "guides"
NAMES = ("write-a-policy.md", "replay-a-trace.md", "fault-experiment.md", "carry-over.md", "add-a-fault-kind.md")
MAX_LINES = 150
PACKAGES = ("cli", "core", "simulator", "workloads", "faults", "analysis", "vocab", "study", "testbed")

_MARK = re.compile(r"<!-- guide-test: (.+?) -->\n```[\w-]*\n(.*?)```", re.S)
_PROGRAMS = {"testbed": [sys.executable, "-m", "cli"], "python": [sys.executable]}  # as installed
_NUM = r"(?:[-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?|nan)"


@dataclass
class Step:
    action: str
    block: str
    out: str = ""


def steps(name: str, folder: Path = GUIDES) -> list[Step]:
    return [Step(a.strip(), b) for a, b in _MARK.findall((folder / name).read_text())]


def shaped(expected: str) -> re.Pattern:
    """Any text that is ``expected`` with other numbers and other runs of spaces; each number a group."""
    parts = re.split(_NUM, expected.strip())
    lit = [re.sub(r"(?:\\\s)+|\s+", r"\\s*", re.escape(p)) for p in parts]
    return re.compile(f"({_NUM})".join(lit))


def _agrees(stated: str, printed: str) -> bool:
    """A printed number reproduces a stated one: a whole number exactly; a decimal within 5% of the
    stated value or one unit of its last digit, whichever is wider; nan only as nan."""
    if stated.lower() == "nan" or printed.lower() == "nan":
        return stated.lower() == printed.lower()
    if re.fullmatch(r"[-+]?\d+", stated):
        return re.fullmatch(r"[-+]?\d+", printed) is not None and int(stated) == int(printed)
    mantissa = stated.lower().split("e")[0]
    digits = len(mantissa.split(".")[1]) if "." in mantissa else 0
    unit = 10.0 ** (-digits) * (10.0 ** int(stated.lower().split("e")[1]) if "e" in stated.lower() else 1.0)
    return abs(float(printed) - float(stated)) <= max(0.05 * abs(float(stated)), unit) + 1e-12


def figures_off(expected: str, printed: str) -> list[str]:
    """What keeps ``printed`` from being the guide's ``expected`` output: ["shape"] when its words,
    columns or rows differ, else each stated number the run did not reproduce ("stated -> printed")."""
    m = shaped(expected).fullmatch(printed.strip())
    if m is None:
        return ["shape"]
    stated = re.findall(_NUM, expected.strip())
    return [f"{a} -> {b}" for a, b in zip(stated, m.groups()) if not _agrees(a, b)]


def _one_line(text: str, needle: str, path: Path) -> int:
    hits = [i for i, ln in enumerate(text.splitlines()) if needle in ln]
    assert len(hits) == 1, f"{path}: {len(hits)} lines contain {needle!r} (the guide needs exactly one)"
    return hits[0]


def _env(root: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(root), "MPLBACKEND": "Agg", "COLUMNS": "200"}


def run_guide(name: str, work: Path, root: Path = REPO, folder: Path = GUIDES) -> list[Step]:
    """Every step of a guide, in ``work``, with the project at ``root`` on the path; ``folder``: where
    the page is (another page whose examples are marked the same way: tests/test_troubleshooting.py)."""
    done = []
    for st in steps(name, folder):
        verb, _, rest = st.action.partition(" ")
        if verb in ("write", "append", "insert", "replace"):
            m = re.fullmatch(r'(\S+)(?: (after|line) "((?:[^"\\]|\\.)*)")?', rest)
            assert m, f"{name}: bad step {st.action!r}"
            path, needle = work / m.group(1), (m.group(3) or "").replace('\\"', '"')
            path.parent.mkdir(parents=True, exist_ok=True)
            old = path.read_text() if path.exists() else ""
            if verb in ("write", "append"):
                path.write_text(st.block if verb == "write" else old + st.block)
            else:
                lines = old.splitlines(keepends=True)
                i = _one_line(old, needle, path)
                lines[i:i + 1] = ([lines[i]] if verb == "insert" else []) + [st.block]
                path.write_text("".join(lines))
        elif verb.startswith("run"):
            want = int(re.fullmatch(r"run(?:, exit (\d+))?", st.action).group(1) or 0)
            for line in st.block.splitlines():
                argv = shlex.split(line, comments=True)
                if not argv:
                    continue
                argv = _PROGRAMS.get(argv[0], argv[:1]) + argv[1:]
                res = subprocess.run(argv, cwd=work, env=_env(root), capture_output=True, text=True, timeout=300)
                st.out += res.stdout + res.stderr
                assert res.returncode == want, f"{name}: `{line}` exited {res.returncode}:\n{res.stdout}\n{res.stderr}"
        elif verb == "python":
            res = subprocess.run([sys.executable, "-c", st.block], cwd=work, env=_env(root), capture_output=True,
                                 text=True, timeout=300)
            assert res.returncode == 0, f"{name}: a python block failed:\n{st.block}\n{res.stderr}"
            st.out = res.stdout
        elif verb == "output":
            prev = done[-1].out.strip()
            off = figures_off(st.block, prev)
            assert not off, f"{name}: printed\n{prev}\nnot as the guide says\n{st.block}\n({', '.join(off)})"
        else:
            raise AssertionError(f"{name}: unknown step {st.action!r}")
        done.append(st)
    return done


def guide_policy_package(out: Path) -> Path:
    """write-a-policy.md's package, made from the guide's own files outside the repository and
    pip-installed into a folder of its own (the e2e cluster runs its policy: tests/e2e_cluster.py);
    returns that folder."""
    src = out / "guide-policy"
    for st in steps("write-a-policy.md"):
        verb, _, path = st.action.partition(" ")
        if verb == "write" and path.startswith("my-policies/"):
            (src / path).parent.mkdir(parents=True, exist_ok=True)
            (src / path).write_text(st.block)
    site = out / "guide-policy-site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(site), str(src / "my-policies")], check=True, capture_output=True, timeout=300)
    return site


def _outputs(done: list[Step], verb: str) -> list[str]:
    return [s.out for s in done if s.action.startswith(verb)]


def _requests(run_dir: Path) -> pd.DataFrame:
    return pd.read_parquet(run_dir / "requests.parquet")


def _project(root: Path, files: tuple[str, ...]) -> Path:
    """A copy of the project's packages at ``root`` (a guide that edits the project edits it), with ``files``."""
    for pkg in PACKAGES:
        shutil.copytree(REPO / pkg, root / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    for f in files:
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / f, root / f)
    return root


# ----------------------------------------------------------------------------------------------------------
# the guides as pages


def test_the_guides_are_short_linked_and_each_has_an_example_this_file_runs():
    """Their links, anchors and the repository paths they name: tests/test_docs.py, as on every page."""
    assert sorted(p.name for p in GUIDES.glob("*.md")) == sorted(NAMES)
    index, readme = (REPO / "docs" / "README.md").read_text(), (REPO / "README.md").read_text()
    assert "(docs/guides/" in readme
    for name in NAMES:
        text = (GUIDES / name).read_text()
        assert len(text.splitlines()) <= MAX_LINES, f"{name}: {len(text.splitlines())} lines"
        assert f"(guides/{name})" in index, f"docs/README.md does not link guides/{name}"
        assert steps(name), f"{name}: no example the test runs"


def test_every_testbed_command_of_the_guides_parses():
    parser = build_parser()
    for name in NAMES:
        text = (GUIDES / name).read_text()
        written = {a.split()[1] for a, _ in _MARK.findall(text) if a.startswith("write ")}
        # the built-in ones, a guide's own package's entry points (`Name = "module:function"`), dotted paths
        policies = set(POLICY_NAMES) | set(re.findall(r'^(\w[\w-]*) = "[\w.]+:\w+"$', text, re.M))
        cmds = [ln.strip() for b in re.findall(r"```bash\n(.*?)```", text, re.S) for ln in b.splitlines()
                if ln.strip().startswith("testbed ")]
        cmds += re.findall(r"`(testbed (?:sim|run|twin|compare|report|study) [^`]*)`", text)
        for cmd in cmds:
            args = parser.parse_args(shlex.split(cmd.replace("SPEC", "x.yaml"), comments=True)[1:])
            spec = getattr(args, "spec", None)
            if spec and spec != "x.yaml":
                assert (REPO / spec).is_file() or spec in written, (name, cmd)
            for p in args.policies.split(",") if getattr(args, "policies", None) else []:
                assert p in policies or "." in p, (name, cmd)


def test_the_output_check_holds_the_stated_figures_and_the_words():
    guide = "policy  failure_rate  failed\nLC          0.070      19\nOTF-R       0.004       1"
    assert figures_off(guide, "policy failure_rate failed\nLC  0.0702  19\nOTF-R  0.0045  1") == []
    assert figures_off(guide, "policy failure_rate failed\nLC  0.071  18\nOTF-R  0.004  1") == ["19 -> 18"]
    assert figures_off(guide, "policy failure_rate failed\nLC  0.1  19\nOTF-R  0.004  1") == ["0.070 -> 0.1"]
    assert figures_off(guide, "policy failure_rate failed\nLC  0.07  19\nRandom  0.004  1") == ["shape"]
    assert figures_off("arrivals [4.  4.5] s", "arrivals [4.  4.5] s") == []


# ----------------------------------------------------------------------------------------------------------
# each guide, run


def test_write_a_policy(tmp_path):
    """The guide's package, outside the repository, installed by pip into a folder of the guide's
    own (on PYTHONPATH for its commands): listed, run under its entry point's name and by its path,
    and its own test passes."""
    done = run_guide("write-a-policy.md", tmp_path, tmp_path / "site")
    listed = _outputs(done, "run")[0].split()[-len(POLICY_NAMES) - 1:]  # after what pip says, testbed policies
    assert listed == [*POLICY_NAMES, "PriceStep"]
    runs = tmp_path / "runs" / "price_step"
    assert sorted(p.name for p in runs.iterdir()) == ["LC", "OTF-R", "PriceStep", "my_policies.price_step_policy"]
    summary = pd.read_csv(tmp_path / "runs" / "report" / "summary.csv").set_index("policy")
    assert summary.loc["PriceStep", "failure_rate_mean"] <= summary.loc["LC", "failure_rate_mean"]
    # the same function under two names: seed 0 decided alike
    by_entry, by_path = (_requests(runs / p / "seed-0").sort_values("request_id")
                         for p in ("PriceStep", "my_policies.price_step_policy"))
    assert list(by_entry.prefill_pod) == list(by_path.prefill_pod) and list(by_entry.outcome) == list(by_path.outcome)
    assert "1 passed" in _outputs(done, "run")[-1]  # the package's own test
    assert not (REPO / "my_policies").exists()  # nothing written into the project


def test_replay_a_trace(tmp_path):
    done = run_guide("replay-a-trace.md", tmp_path)
    trace = pd.read_csv(tmp_path / "specs" / "traces" / "my_trace.csv")
    n, span = len(trace), trace["arrival_s"].iloc[-1] - trace["arrival_s"].iloc[0]
    period = trace["arrival_s"].iloc[-1] + span / (n - 1)  # the loop's period, as the guide says
    for policy in ("LC", "OTF-R"):
        req = _requests(tmp_path / "runs" / "my_trace" / policy / "seed-0").sort_values("request_id")
        copies = -(-len(req) // n)
        want = (trace["arrival_s"].to_numpy()[None, :] + period * pd.RangeIndex(copies).to_numpy()[:, None]).ravel()
        want = want[want < 27.0]  # the spec's duration_s
        assert len(req) == 54 and req["arrival_s"].to_numpy() == pytest.approx(want)  # 54: the guide says so
        assert list(req["prompt_tokens"]) == (list(trace["prompt_tokens"]) * copies)[: len(req)]
    meta = json.loads((tmp_path / "runs" / "my_trace" / "LC" / "seed-0" / "run.json").read_text())
    assert meta["workload"]["trace"]["rows"] == n and meta["workload"]["trace"]["format"] == "native"
    # read from the spec's folder, whichever folder the command ran in
    assert meta["workload"]["trace"]["path"] == str((tmp_path / "specs" / "traces" / "my_trace.csv").resolve())
    assert "9 rows of specs/traces/my_trace.csv" in _outputs(done, "python")[0]


def test_fault_experiment(tmp_path):
    done = run_guide("fault-experiment.md", tmp_path)
    summary = pd.read_csv(tmp_path / "runs" / "report" / "summary.csv").set_index("policy")
    printed = _outputs(done, "python")[0]
    for policy, row in summary.iterrows():  # the guide's pandas agrees with testbed report
        line = next(ln for ln in printed.splitlines() if ln.startswith(policy + " "))
        assert float(line.split()[4]) == pytest.approx(row["failure_rate_mean"], abs=5e-4), line
    stages = _outputs(done, "python")[1]
    assert "kv_transfer" in stages


def test_carry_over(tmp_path):
    done = run_guide("carry-over.md", tmp_path)
    out = "\n".join(_outputs(done, "python"))
    assert "verdict: undecided (no value on the testbed)" in out
    refused = _outputs(done, "run, exit 2")[0]
    assert "is a 'sim' run, but was given as a testbed run" in refused


def test_add_a_fault_kind(tmp_path):
    root = _project(tmp_path / "project", ("tests/test_vocabulary.py", "tests/test_faults_pure.py"))
    done = run_guide("add-a-fault-kind.md", root, root)
    for policy in ("LC", "OTF-R"):  # each down span an apply and a clear of the new kind, on pod 1's links
        run = root / "runs" / "flap" / policy / "seed-0"
        faults = pd.read_parquet(run / "faults.parquet").sort_values("time_s")
        assert set(faults["kind"]) == {"flap"} and set(faults["target"]) == {"pod1.core_links"}
        assert list(zip(faults["time_s"], faults["event"])) == [
            (10, "apply"), (14, "clear"), (20, "apply"), (24, "clear"), (30, "apply"), (34, "clear")]
        req = _requests(run)
        failed = req[req["outcome"] != "ok"]
        assert set(failed["outcome"]) <= {"error"} and set(failed["failed_stage"]) <= {"kv_transfer"}
        assert ((failed["prefill_pod"] == 1) | (failed["decode_pod"] == 1)).all()  # only through pod 1
        if policy == "LC":
            assert len(failed) > 0
    # the testbed refuses the kind it does not inject, before any engine starts (the guide's printout)
    assert "faults[0] is a 'flap' fault, which the testbed does not inject" in _outputs(done, "python")[1]
    tests = _outputs(done, "run")[1]  # the copy's vocabulary and fault model tests, with the new kind
    assert re.search(r"\b\d+ passed\b", tests) and not re.search(r"\b\d+ (failed|errors?)\b", tests)
