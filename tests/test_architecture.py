"""The boundaries of the code base, read from the source: the direction of imports is the
architecture (core <- each world <- cli), no module imports one that imports it, modules stay small,
and a request's record is built in one place. The rules are functions of a source tree, so each is
also run on a small tree made to break it: a rule that can never fail checks nothing."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.background  # needs no core of its own: under -n, beside the others (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[1]
# The nodes of the package graph: the words, the pure models, the two worlds and the command line.
PACKAGES = ("vocab", "core", "faults", "workloads", "simulator", "analysis", "testbed", "study", "cli")
MAX_LINES = 600  # DESIGN.md: files small, named for what they hold


def modules(root: Path, packages=PACKAGES) -> dict[str, Path]:
    """Every module of ``packages`` under ``root``, by dotted name (a package by its __init__)."""
    out = {}
    for pkg in packages:
        for path in (root / pkg).rglob("*.py"):
            rel = path.relative_to(root).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            out[".".join(parts)] = path
    return out


def _type_checking_only(tree: ast.AST) -> set[int]:
    """Ids of import nodes under ``if TYPE_CHECKING:`` (never run)."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(n) for b in node.body for n in ast.walk(b)}
    return skip


def imports(module: str, path: Path, known: set[str]) -> set[str]:
    """The modules ``module`` imports when it runs, anywhere in its body (lazy imports included,
    ``if TYPE_CHECKING:`` aside): for ``from a import b`` the module ``a.b`` where it is one, else ``a``."""
    is_pkg = path.name == "__init__.py"
    here = module.split(".") if is_pkg else module.split(".")[:-1]
    tree = ast.parse(path.read_text())
    skip = _type_checking_only(tree)
    found = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(here[: len(here) - node.level + 1])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            subs = {f"{target}.{a.name}" for a in node.names} & known
            found |= subs or {target}
            if len(subs) < len(node.names):
                found.add(target)
    return found


def module_graph(root: Path, packages=PACKAGES) -> dict[str, set[str]]:
    mods = modules(root, packages)
    known = set(mods)
    return {m: {i for i in imports(m, p, known) if i in known and i != m} for m, p in mods.items()}


def package_of(module: str) -> str:
    return module.split(".")[0]


def package_graph(root: Path, packages=PACKAGES) -> dict[str, set[str]]:
    g: dict[str, set[str]] = {p: set() for p in packages}
    for m, deps in module_graph(root, packages).items():
        g[package_of(m)] |= {package_of(d) for d in deps} - {package_of(m)}
    return g


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected part of ``graph`` that has one (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    parts: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                parts.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return parts


def room_graph(root: Path, packages=PACKAGES) -> dict[str, set[str]]:
    """The module graph with each sub-package folded into one node, its room (testbed.cluster,
    testbed.machine, core.policies, ...); a package's own top-level modules stay nodes of their own.
    A circle here is two rooms that each import the other, however far apart their modules are."""
    def room(module: str) -> str:
        parts = module.split(".")
        return ".".join(parts[:2]) if len(parts) > 1 and (root / parts[0] / parts[1] / "__init__.py").is_file() \
            else module

    g: dict[str, set[str]] = {}
    for m, deps in module_graph(root, packages).items():
        g.setdefault(room(m), set()).update(room(d) for d in deps)
    return {r: deps - {r} for r, deps in g.items()}


def too_long(root: Path, dirs=PACKAGES + ("tests", "benchmarks", "tools")) -> list[str]:
    return [f"{p.relative_to(root)}: {n} lines" for d in dirs for p in sorted((root / d).rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_LINES]


# What each package may not import: everything above it.
FORBIDDEN = {
    "vocab": set(PACKAGES) - {"vocab"},  # the ground floor: everything may import it, it imports nothing of ours
    "core": {"simulator", "testbed", "cli", "analysis", "study"},
    "simulator": {"testbed", "cli", "analysis", "study"},
    "testbed": {"simulator", "cli", "analysis", "study"},
    "faults": {"core", "simulator", "testbed", "cli", "analysis", "study"},
    "workloads": {"core", "simulator", "testbed", "cli", "analysis", "study"},
    "analysis": {"simulator", "testbed", "cli", "study"},
    "study": {"cli"},  # the study runs both worlds; the command line calls it
}


# The layout inside the two largest packages: their sub-packages in floors, each importing only those
# before it (the package's own top-level modules are not floors: the no-circle rule holds them). A new
# sub-package must take its place here. analysis: the verdict rule, one run's metrics, the instruments
# checked against a run, two sets of runs compared (the study's claims and figures live in study/).
# core: data and helpers, the policies, the spec, the calibration built on the spec.
LAYOUT = {
    "analysis": ("analysis.rule", "analysis.run", "analysis.checks", "analysis.compare"),
    "core": ("core.defaults", "core.util", "core.policies", "core.spec", "core.calibration"),
}


def sub_package_breaches(root: Path, layout=LAYOUT) -> list[str]:
    """Sub-packages importing one on their floor or above it, and sub-packages with no floor."""
    g = room_graph(root)
    out = []
    for pkg, floors in layout.items():
        rooms = {r for r in g if r.startswith(pkg + ".") and (root / Path(*r.split("."))).is_dir()}
        out += [f"{r}: no floor in LAYOUT" for r in sorted(rooms - set(floors))]
        for i, room in enumerate(floors):
            above = set(floors[i:])
            if bad := sorted(g.get(room, set()) & above):
                out.append(f"{room} imports {bad} (its floor or above)")
    return out


def layering_breaches(root: Path) -> list[str]:
    g = package_graph(root)
    return [f"{p} imports {sorted(g[p] & bad)}" for p, bad in FORBIDDEN.items() if g[p] & bad]


# --- the rules on this repository ------------------------------------------------------------

def test_the_import_walk_sees_the_known_edges():
    g = package_graph(ROOT)
    # a walk that saw nothing would pass every rule below
    assert {"faults", "workloads", "vocab"} <= g["core"] and "vocab" in g["faults"]
    assert {"core", "faults"} <= g["simulator"]
    assert "core" in g["testbed"] and "core" in g["analysis"]
    assert {"simulator", "testbed", "analysis", "study"} <= g["cli"] and {"simulator", "testbed"} <= g["study"]
    m = module_graph(ROOT)
    assert "testbed.router.flow" in m["testbed.router.actor"]


def test_each_package_imports_only_what_lies_below_it():
    assert layering_breaches(ROOT) == []


def test_no_module_imports_one_that_imports_it():
    assert cycles(module_graph(ROOT)) == []


def test_no_sub_package_imports_one_that_imports_it():
    g = room_graph(ROOT)
    assert "testbed.machine" in g["testbed.faults"] and "testbed.faults" in g["testbed.cluster"]  # the walk saw them
    assert cycles(g) == []


def test_the_sub_packages_of_analysis_and_core_keep_their_floors():
    g = room_graph(ROOT)
    assert "analysis.rule" in g["analysis.checks"] and "core.spec" in g["core.calibration"]  # the walk saw them
    assert sub_package_breaches(ROOT) == []


def test_no_module_is_over_600_lines():
    assert too_long(ROOT) == []


def test_the_pure_fault_model_does_not_touch_the_host():
    host = {"pyroute2", "subprocess", "ctypes", "pynvml", "ray", "socket"}
    for path in (ROOT / "faults").rglob("*.py"):
        mods = {m.split(".")[0] for m in imports("faults." + path.stem, path, set())}
        assert not mods & host, f"{path.name} imports {mods & host}"


def test_the_pure_fault_model_says_where_the_injectors_live():
    import faults

    assert "testbed.faults" in faults.__doc__


def test_a_request_record_is_built_in_one_place():
    sites = []
    for module, path in modules(ROOT).items():
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\bRequestRecord\(", line) and not line.lstrip().startswith("class "):
                sites.append(f"{path.relative_to(ROOT)}:{i}")
    assert len(sites) == 1 and sites[0].startswith("core/ticket.py"), sites


# --- the rules on trees made to break them ---------------------------------------------------

def _tree(root: Path, files: dict[str, str]) -> Path:
    for pkg in PACKAGES:
        (root / pkg).mkdir(parents=True, exist_ok=True)
        (root / pkg / "__init__.py").touch()
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.mark.parametrize("core_imports", ["import simulator.run", "from testbed.router import flow",
                                          "def f():\n    from cli import main\n"])
def test_a_core_module_importing_a_world_is_caught(tmp_path, core_imports):
    root = _tree(tmp_path, {"core/spec/model.py": core_imports + "\n", "simulator/run.py": "", "testbed/router/flow.py": "",
                            "cli/main.py": ""})
    assert layering_breaches(root) and layering_breaches(root)[0].startswith("core imports")


def test_the_vocabulary_importing_anything_of_ours_is_caught(tmp_path):
    root = _tree(tmp_path, {"vocab/__init__.py": "from faults.spec import LinkFault\n", "faults/spec.py": ""})
    assert layering_breaches(root) == ["vocab imports ['faults']"]


def test_an_import_circle_between_modules_is_caught_even_through_a_lazy_import(tmp_path):
    root = _tree(tmp_path, {"analysis/run/metrics.py": "from analysis.run.host_stall import x\n",
                            "analysis/run/host_stall.py": "def f():\n    from .metrics import y\n",
                            "core/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from core.b import B\n",
                            "core/b.py": "from core import a\n"})
    assert cycles(module_graph(root)) == [["analysis.run.host_stall", "analysis.run.metrics"]]  # the TYPE_CHECKING pair is none


def test_a_circle_between_sub_packages_is_caught_though_no_module_circle_exists(tmp_path):
    # cluster.nodes -> faults.agent -> cluster.netns: no module imports one that imports it, yet the rooms circle
    root = _tree(tmp_path, {"testbed/cluster/__init__.py": "", "testbed/faults/__init__.py": "",
                            "testbed/cluster/nodes.py": "from testbed.faults.agent import FaultAgent\n",
                            "testbed/faults/agent.py": "from testbed.cluster.netns import in_netns\n",
                            "testbed/cluster/netns.py": ""})
    assert cycles(module_graph(root)) == []
    assert cycles(room_graph(root)) == [["testbed.cluster", "testbed.faults"]]


def test_a_sub_package_importing_its_floor_or_above_is_caught(tmp_path):
    root = _tree(tmp_path, {"analysis/run/__init__.py": "", "analysis/run/metrics.py": "from analysis.compare import x\n",
                            "analysis/compare/__init__.py": "", "analysis/compare/fidelity.py": "",
                            "analysis/extra/__init__.py": "", "analysis/extra/a.py": ""})
    layout = {"analysis": ("analysis.run", "analysis.compare")}
    assert sub_package_breaches(root, layout) == ["analysis.extra: no floor in LAYOUT",
                                                  "analysis.run imports ['analysis.compare'] (its floor or above)"]
    (root / "analysis/run/metrics.py").write_text("")
    (root / "analysis/compare/fidelity.py").write_text("from analysis.run import metrics\n")
    assert sub_package_breaches(root, {"analysis": ("analysis.run", "analysis.compare")})[1:] == []


def test_a_module_over_600_lines_is_caught(tmp_path):
    root = _tree(tmp_path, {"core/big.py": "x = 1\n" * (MAX_LINES + 1), "core/fine.py": "x = 1\n" * MAX_LINES})
    assert too_long(root) == [f"core/big.py: {MAX_LINES + 1} lines"]


# --- module paths written as strings: a move breaks them silently -----------------------------

_OURS = r"(?:cli|core|testbed|simulator|analysis|faults|workloads|vocab|study)"
_DOTTED = re.compile(rf"{_OURS}(?:\.[A-Za-z_]\w*)+")
_FILES = (".yaml", ".json", ".py", ".md", ".csv", ".parquet", ".txt")  # file names such as testbed.yaml
# Strings that name a module of another revision on purpose (the layout before issue 26's move).
_OTHER_REVISIONS = {("tools/same_records.py", "testbed.cli")}


def _resolves(dotted: str, root: Path) -> bool:
    """A module of the project (a file or a package), or a name a module of it defines."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        base = root.joinpath(*parts[:i])
        if base.with_suffix(".py").is_file() or (base / "__init__.py").is_file():
            rest = parts[i:]
            if not rest:
                return True
            src = (base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py").read_text()
            return len(rest) == 1 and re.search(rf"^(?:class|def)\s+{rest[0]}\b|^{rest[0]}\s*[:=]", src, re.M) is not None
    return False


def module_strings(root: Path) -> list[tuple[str, str]]:
    """(where, dotted path) for every module path the project writes as a string: string literals
    of its Python that look like one of its modules, ``python -m`` in its scripts and configs, and
    the console script."""
    found = []
    for path in sorted(p for d in (*PACKAGES, "tests", "benchmarks", "tools") for p in (root / d).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and _DOTTED.fullmatch(node.value) \
                    and not node.value.endswith(_FILES) and (str(path.relative_to(root)), node.value) not in _OTHER_REVISIONS:
                found.append((f"{path.relative_to(root)}:{node.lineno}", node.value))
    for name in ("cluster.yaml", "install.sh", "pyproject.toml", ".ci/run"):
        if (root / name).is_file():
            text = (root / name).read_text()
            found += [(name, m) for m in re.findall(rf"python3? -m ({_DOTTED.pattern})", text)]
            found += [(name, m.replace(":", ".")) for m in re.findall(rf'= "({_OURS}[\w.]*:\w+)"', text)]
    return found


def test_every_module_path_written_as_a_string_exists():
    found = [(w, d) for w, d in module_strings(ROOT) if not w.startswith("tests/test_architecture.py")]
    assert {"cli.main.main", "testbed.cluster.clusterfile", "testbed.runs.driver"} <= {d for _, d in found}
    assert [f"{w}: {d}" for w, d in found if not _resolves(d, ROOT)] == []


def test_a_module_path_left_behind_by_a_move_is_caught(tmp_path):
    root = _tree(tmp_path, {"testbed/runs/launch.py": 'ARGV = ["-m", "testbed.runtime.driver"]\n',
                            "testbed/runs/driver.py": "def main():\n    pass\n",
                            "cluster.yaml": "setup: python -m testbed.clusterfile check\n"})
    bad = [d for _, d in module_strings(root) if not _resolves(d, root)]
    assert bad == ["testbed.runtime.driver", "testbed.clusterfile"]
    assert _resolves("testbed.runs.driver.main", root)
