"""Errors said in one line: bad input (a spec, a calibration file, a metrics block) is refused with one
line naming the file and what is wrong, never a traceback or pydantic's multi-line message (a
trace's refusals: workloads/formats.py first_line, below core)."""

from __future__ import annotations

from typing import Any


def first_error(exc: Any) -> tuple[str, str, Any, str]:
    """(location, message, the input refused, " (and N more)" or "") of a pydantic ValidationError's
    first error: what a one-line refusal of a file says."""
    errs = exc.errors()
    err = errs[0]
    loc = ".".join(str(x) for x in err["loc"] if not str(x).startswith("function-"))
    more = f" (and {len(errs) - 1} more)" if len(errs) > 1 else ""
    return loc, err["msg"], err.get("input"), more
