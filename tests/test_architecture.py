"""The boundaries of the code base, read from the source: the direction of imports is the
architecture (core <- each world <- CLI), and a request's record is built in one place."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The nodes of the import graph: top-level packages, with the real world and the CLI apart
# from the `testbed` package that holds them both.
PACKAGES = ("core", "faults", "workloads", "simulator", "analysis", "testbed.runtime", "testbed.cli")


def _node(module: str) -> str | None:
    for p in sorted(PACKAGES, key=len, reverse=True):
        if module == p or module.startswith(p + "."):
            return p
    # The study runner drives the simulator from the CLI's side: it belongs with the CLI.
    return "testbed.cli" if module in ("testbed", "testbed.study") else None


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in ("core", "faults", "workloads", "simulator", "analysis", "testbed"):
        for path in (ROOT / pkg).rglob("*.py"):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            out[".".join(parts)] = path
    return out


def _imports(module: str, path: Path) -> set[str]:
    """Every module ``module`` imports, anywhere in its body (lazy imports included)."""
    is_pkg = path.name == "__init__.py"
    here = module.split(".") if is_pkg else module.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(here[: len(here) - node.level + 1])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            found.add(target)
            found |= {f"{target}.{a.name}" for a in node.names}
    return found


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {p: set() for p in PACKAGES}
    for module, path in _modules().items():
        src = _node(module)
        if src is None:
            continue
        for imp in _imports(module, path):
            dst = _node(imp)
            if dst is not None and dst != src:
                graph[src].add(dst)
    return graph


def test_the_import_walk_sees_the_known_edges():
    g = _graph()
    # a walk that saw nothing would pass every rule below
    assert {"faults", "workloads"} <= g["core"]
    assert {"core", "faults"} <= g["simulator"]
    assert "core" in g["testbed.runtime"] and "core" in g["analysis"]
    assert {"simulator", "testbed.runtime", "analysis"} <= g["testbed.cli"]


@pytest.mark.parametrize("package,forbidden", [
    ("core", {"simulator", "testbed.runtime", "testbed.cli", "analysis"}),
    ("simulator", {"testbed.runtime", "testbed.cli", "analysis"}),
    ("testbed.runtime", {"simulator", "testbed.cli", "analysis"}),
    ("faults", {"core", "simulator", "testbed.runtime", "testbed.cli", "analysis"}),
    ("workloads", {"core", "simulator", "testbed.runtime", "testbed.cli", "analysis"}),
    ("analysis", {"simulator", "testbed.runtime", "testbed.cli"}),
])
def test_each_package_imports_only_what_lies_below_it(package, forbidden):
    assert not _graph()[package] & forbidden


def test_no_package_imports_one_that_imports_it():
    g = _graph()
    state: dict[str, int] = {}

    def visit(n: str, path: list[str]) -> None:
        state[n] = 1
        for m in sorted(g[n]):
            assert state.get(m) != 1, f"import cycle: {' -> '.join(path + [n, m])}"
            if m not in state:
                visit(m, path + [n])
        state[n] = 2

    for n in g:
        if n not in state:
            visit(n, [])


def test_the_pure_fault_model_does_not_touch_the_host():
    host = {"pyroute2", "subprocess", "ctypes", "pynvml", "ray", "socket"}
    for path in (ROOT / "faults").rglob("*.py"):
        mods = {m.split(".")[0] for m in _imports("faults." + path.stem, path)}
        assert not mods & host, f"{path.name} imports {mods & host}"


def test_a_request_record_is_built_in_one_place():
    sites = []
    for module, path in _modules().items():
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\bRequestRecord\(", line) and not line.lstrip().startswith("class "):
                sites.append(f"{path.relative_to(ROOT)}:{i}")
    assert len(sites) == 1 and sites[0].startswith("core/ticket.py"), sites
