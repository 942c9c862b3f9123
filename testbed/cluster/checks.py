"""What a preflight check says (`testbed doctor`; testbed/cluster/preflight.py): its name, ``ok``,
``FAIL`` (with what to do) or ``n/a`` (it does not apply there, no failure), and what was found."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

OK, FAIL, NA = "ok", "FAIL", "n/a"


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # OK, FAIL or NA
    detail: str
    fix: str | None = None  # what to do, for a FAIL

    @property
    def failed(self) -> bool:
        return self.status == FAIL


def ok(name: str, detail: str) -> Check:
    return Check(name, OK, detail)


def fail(name: str, detail: str, fix: str) -> Check:
    return Check(name, FAIL, detail, fix)


def na(name: str, detail: str) -> Check:
    return Check(name, NA, detail)


def fault_refs(indexes: Iterable[int]) -> str:
    """The spec's faults a check speaks of, as the spec's error lines name them: ``faults[0, 2]``."""
    return "faults[" + ", ".join(str(i) for i in indexes) + "]"
