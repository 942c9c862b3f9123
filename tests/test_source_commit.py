"""run.json names the project's commit (core/util/source.py): the hash of a checkout's HEAD, whether
tracked files differ from it, and nothing where the project is not a checkout of its own."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from core.records import RunWriter
from core.util import source

pytestmark = pytest.mark.background  # no core of its own: beside the others under -n (tests/conftest.py)


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def root_at(monkeypatch):
    """Point the reader at another folder, its per-process answer forgotten before and after."""
    def point(folder: Path) -> dict | None:
        monkeypatch.setattr(source, "ROOT", folder.resolve())
        source.source_commit.cache_clear()
        return source.source_commit()
    yield point
    source.source_commit.cache_clear()


@pytest.fixture
def repo(tmp_path) -> Path:
    r = tmp_path / "project"
    r.mkdir()
    _git(r, "init", "-q")
    (r / "a.py").write_text("x = 1\n")
    _git(r, "add", "a.py")
    _git(r, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    return r


def test_a_checkout_gives_its_head_and_turns_dirty_only_when_a_tracked_file_changes(repo, root_at):
    head = _git(repo, "rev-parse", "HEAD")
    assert root_at(repo) == {"commit": head, "dirty": False}
    (repo / "notes.txt").write_text("untracked\n")
    assert root_at(repo) == {"commit": head, "dirty": False}
    (repo / "a.py").write_text("x = 2\n")
    assert root_at(repo) == {"commit": head, "dirty": True}


def test_a_folder_that_is_no_checkout_or_lies_inside_another_gives_none(repo, tmp_path, root_at):
    plain = tmp_path / "site-packages"
    plain.mkdir()
    assert root_at(plain) is None
    inside = repo / "venv" / "lib"  # an installed copy inside someone else's repository
    inside.mkdir(parents=True)
    assert root_at(inside) is None


def test_every_run_json_names_the_commit_of_the_code_that_wrote_it(tmp_path):
    d = tmp_path / "run"
    with RunWriter(d, {"world": "sim", "policy": "LC", "seed": 0, "spec": {}}):
        pass
    recorded = json.loads((d / "run.json").read_text())["source"]
    if not (source.ROOT / ".git").exists():
        assert recorded is None
        pytest.skip(f"{source.ROOT} is not a git checkout: run.json records no commit")
    assert recorded["commit"] == _git(source.ROOT, "rev-parse", "HEAD")
    assert recorded["dirty"] == bool(_git(source.ROOT, "status", "--porcelain", "--untracked-files=no"))
