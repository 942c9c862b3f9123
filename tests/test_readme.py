"""The README's commands and examples are checked here, so the docs cannot drift."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import yaml

from cli.main import build_parser
from core.policies import POLICY_NAMES
from core.spec import parse_spec

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def _section(title: str) -> str:
    return README.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_setup_has_exactly_two_commands_and_ci_runs_the_second():
    (block,) = re.findall(r"```bash\n(.*?)```", _section("Set up"), flags=re.S)
    lines = [ln for ln in block.splitlines() if ln.strip()]
    assert len(lines) == 2
    assert lines[0].startswith("./install.sh && testbed twin")
    assert lines[1] == "./install.sh && python -m pytest -q"
    ci = (REPO / ".ci" / "run").read_text()
    assert "grep -m1 '^./install.sh && python -m pytest' README.md" in ci
    assert (REPO / "install.sh").stat().st_mode & 0o111


def test_every_testbed_command_in_the_readme_parses_and_its_files_exist():
    cmds = [ln.strip() for b in _blocks("bash") for part in b.splitlines() for ln in part.split("&&")
            if ln.strip().startswith("testbed ")]
    assert len(cmds) >= 5
    parser = build_parser()
    for cmd in cmds:
        args = parser.parse_args(shlex.split(cmd, comments=True)[1:])
        if getattr(args, "spec", None):
            assert (REPO / args.spec).is_file(), cmd
        for p in args.policies.split(",") if getattr(args, "policies", None) else []:
            assert p in POLICY_NAMES, cmd


def test_the_spec_example_is_valid():
    (example,) = _blocks("yaml")
    spec = parse_spec(yaml.safe_load(example), "README example")
    assert [p.name for p in spec.policies] == ["LC", "OTF-R"]


def test_the_policy_table_lists_every_policy():
    rows = re.findall(r"^\| `([^`]+)` \|", _section("Policies"), flags=re.M)
    assert rows == list(POLICY_NAMES)


def test_the_experiment_table_lists_the_shipped_specs():
    rows = re.findall(r"^\| `([^`]+\.yaml)` \|", _section("Using it"), flags=re.M)
    assert sorted(rows) == sorted(p.name for p in (REPO / "experiments").glob("*.yaml"))


def test_the_smoke_example_runs_as_written(tmp_path):
    # the first two lines of "Using it", run in a scratch folder holding a copy of experiments/
    (block, *_) = re.findall(r"```bash\n(.*?)```", _section("Using it"), flags=re.S)
    lines = block.splitlines()[:2]
    assert lines[0].startswith("testbed sim experiments/smoke.yaml")
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "smoke.yaml").write_text((REPO / "experiments" / "smoke.yaml").read_text())
    for line in lines:
        args = shlex.split(line)[1:]
        if args[0] == "sim":
            args += ["--seeds", "0", "--policies", "LC,OTF-R"]  # keep the test short
        res = subprocess.run([sys.executable, "-m", "cli", *args], cwd=tmp_path, capture_output=True,
                             text=True, timeout=300)
        assert res.returncode == 0, res.stderr
    assert (tmp_path / "runs" / "report" / "summary.csv").is_file()
