"""The vocabulary is compared through its constants: a world, a cluster mode, a launcher, a kind of
fault, an outcome or a stage is never compared against a string literal outside ``vocab/``, where a
typo ("tesbed") would compare false forever and a renamed word would leave its old spelling behind.

The check parses the code (not a grep): a comparison (==, !=, in, not in) one side of which is a
literal word of one of those sets (or a tuple, list or set of them), the other an expression whose
name says what it holds (a variable, attribute, subscript or ``.get`` of ``world``, ``mode``,
``launcher``, ``kind``, ``outcome``, ``stage`` or ``failed_stage``). A name that says nothing
(``x == "sim"``) escapes it: the names above are how the project spells these fields."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import vocab
from faults.spec import ComputeFault, EngineFault, LinkFault

pytestmark = pytest.mark.background  # needs no core of its own (tests/conftest.py)

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("core", "faults", "workloads", "simulator", "analysis", "testbed", "study", "cli")
WORDS = {
    "world": set(vocab.WORLDS),
    "mode": set(vocab.CLUSTER_MODES) | set(vocab.EMULATED_MODES),
    "launcher": set(vocab.LAUNCHERS),
    "kind": set(vocab.FAULT_KINDS),
    "outcome": set(vocab.OUTCOMES),
    "stage": set(vocab.STAGES),
}
# The names a field of each set goes by in this code base.
NAMED = {"world": "world", "mode": "mode", "cluster_mode": "mode", "launcher": "launcher", "kind": "kind",
         "fault_kind": "kind", "outcome": "outcome", "stage": "stage", "failed_stage": "stage"}


def _name(e: ast.expr) -> str | None:
    """What an expression's name says it holds: x, a.x, a["x"], a.get("x"), getattr(a, "x")."""
    if isinstance(e, ast.Name):
        return e.id
    if isinstance(e, ast.Attribute):
        return e.attr
    if isinstance(e, ast.Subscript) and isinstance(e.slice, ast.Constant) and isinstance(e.slice.value, str):
        return e.slice.value
    if isinstance(e, ast.Call):
        f, args = e.func, e.args
        if isinstance(f, ast.Attribute) and f.attr == "get" and args and isinstance(args[0], ast.Constant):
            return args[0].value
        if isinstance(f, ast.Name) and f.id in ("getattr", "field_of") and len(args) == 2 \
                and isinstance(args[1], ast.Constant):
            return args[1].value
    return None


def _words(e: ast.expr) -> list[str]:
    if isinstance(e, ast.Constant) and isinstance(e.value, str):
        return [e.value]
    if isinstance(e, (ast.Tuple, ast.List, ast.Set)):
        return [x.value for x in e.elts if isinstance(x, ast.Constant) and isinstance(x.value, str)]
    return []


def literal_comparisons(source: str, where: str) -> list[str]:
    """"where:line: field == 'word'" for each comparison of a vocabulary field against a literal word."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        fields = {NAMED[n] for n in map(_name, sides) if n in NAMED}
        for side in sides:
            for w in _words(side):
                found += [f"{where}:{node.lineno}: {f} == {w!r}" for f in sorted(fields) if w in WORDS[f]]
    return found


def test_no_world_mode_launcher_fault_kind_outcome_or_stage_is_compared_against_a_literal():
    found = [hit for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))
             for hit in literal_comparisons(p.read_text(), str(p.relative_to(REPO)))]
    assert not found, "compare through vocab's constants:\n" + "\n".join(found)


def test_a_literal_comparison_is_caught_and_a_constant_is_not():
    code = '''
if run.world == "testbed": pass
if spec.testbed.mode in ("netns", "auto"): pass
if f["kind"] != "link": pass
if row.get("failed_stage") == "kv_transfer": pass
if self.world == TESTBED: pass
if direction == "none": pass
if fmt == "auto": pass
'''
    assert literal_comparisons(code, "x.py") == [
        "x.py:2: world == 'testbed'", "x.py:3: mode == 'netns'", "x.py:3: mode == 'auto'", "x.py:4: kind == 'link'",
        "x.py:5: stage == 'kv_transfer'"]


def test_the_fault_kinds_are_the_fault_models_own():
    from typing import get_args

    from faults.spec import FaultSpec

    models = get_args(get_args(FaultSpec)[0])  # the union's members, in its order
    assert {LinkFault, ComputeFault, EngineFault} <= set(models)
    assert tuple(m.model_fields["kind"].default for m in models) == vocab.FAULT_KINDS


# The record fields that hold a word of the vocabulary, by name, and the type each must carry.
RECORD_WORDS = {"outcome": "Outcome", "failed_stage": "Stage", "kind": "FaultKind", "ending": "PullEnding",
                "role": "Role"}


def untyped_word_fields(record_types) -> list[str]:
    """``Table.field: annotation`` of every record field named for a vocabulary set but not typed with it."""
    out = []
    for cls in record_types:
        for name, t in cls.__annotations__.items():
            t = getattr(t, "__forward_arg__", t)
            want = RECORD_WORDS.get(name)
            if want is not None and str(t).split(" | ")[0] != want:
                out.append(f"{cls.__name__}.{name}: {t}")
    return out


def test_record_fields_holding_a_word_are_typed_with_its_set():
    from core.records import RECORD_TYPES

    assert {n for cls in RECORD_TYPES for n in cls.__annotations__} >= set(RECORD_WORDS)  # every name is a field
    assert untyped_word_fields(RECORD_TYPES) == []


def test_a_word_field_typed_as_a_plain_string_is_caught():
    from typing import NamedTuple

    from vocab import Role

    class Row(NamedTuple):
        outcome: str
        role: Role | None

    assert untyped_word_fields([Row]) == ["Row.outcome: str"]
