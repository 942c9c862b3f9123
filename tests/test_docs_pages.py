"""The reference pages stay short and narrow, and no page speaks of how it was made.

A reference page (``docs/*.md``: not the guides, not the dated history) holds at most 400 lines
and no line over 120 columns. Three kinds of line may be longer, since breaking them would break
what they hold: a markdown table's row (a line starting with ``|``), a line inside a fenced code
block (commands and program output, as written), and a line that is a bare link or URL (one link,
alone on its line, with at most brackets and punctuation around it: a link with a long anchor).
Prose is wrapped; a long link goes on a line of its own.

Every page a reader can reach (README.md, ``docs/**/*.md``, the history included) says what was
measured, with which command and on which commit, never how the page came to be written: it names
a commit, not an issue number, and no "session", no machine "lent", no "working tree" and no
"tree of <commit> with the change that became <commit>" (name the commit that recorded the figure,
as docs/README.md says, or say on a dated page that it was measured before that commit). The
phrases are ``MADE_OF``'s; the checker is shown catching them on made-up text first.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.background  # needs no core of its own: under -n, beside the others (tests/conftest.py)

REPO = Path(__file__).resolve().parents[1]
MAX_LINES = 400
MAX_COLUMNS = 120

# What a page must not say, each with why. A space in a phrase matches any run of whitespace, so a
# phrase wrapped across two lines is found too.
MADE_OF = {
    r"\blent\b": "who was lent a machine is not the project's to tell",
    r"\bsessions? that\b": "what a session did: say what was run, on which commit",
    r"\bto a session\b": "what a session was given: say what was run, on which commit",
    r"\bwhole session\b": "a session is no unit of the project",
    r"\bthis session\b": "a session is no unit of the project",
    r"\btree of `?[0-9a-f]{7}": "an uncommitted tree: name the commit that recorded the figure",
    r"\bworking tree\b": "an uncommitted tree: name the commit that recorded the figure",
    r"\bwith the (?:change|benchmark) that became\b": "an uncommitted tree: name the commit",
    r"\btree that became\b": "an uncommitted tree: name the commit",
    r"\buncommitted\b": "an uncommitted tree: name the commit",
    r"\b[Ii]ssue #?\d+": "docs name commits, not issue numbers",
}
_MADE_OF = {re.compile(p.replace(" ", r"\s+")): why for p, why in MADE_OF.items()}

_BARE_LINK = re.compile(r"\s*[(\[]*\s*(?:\[[^\]]*\]\([^)\s]+\)|<?[a-z]+://\S+?>?)[\s.,;:)\]]*")


def made_of(text: str) -> list[tuple[int, str, str]]:
    """(line, phrase, why) for every phrase of ``MADE_OF`` in a page's text, in order of line."""
    found = [(text.count("\n", 0, m.start()) + 1, " ".join(m.group(0).split()), why)
             for rx, why in _MADE_OF.items() for m in rx.finditer(text)]
    return sorted(found)


def long_lines(text: str, limit: int = MAX_COLUMNS) -> list[tuple[int, int]]:
    """(line, columns) of every line over ``limit`` that is prose: not a table's row, not inside a
    fenced code block, not a bare link or URL."""
    found, fenced = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced or line.lstrip().startswith("|") or _BARE_LINK.fullmatch(line):
            continue
        if len(line) > limit:
            found.append((n, len(line)))
    return found


def reference_pages() -> list[Path]:
    return sorted((REPO / "docs").glob("*.md"))


def every_page() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


# ----------------------------------------------------------------------------------------------------------
# the checkers themselves, on made-up pages


def test_the_phrase_checker_catches_a_made_up_page_and_passes_plain_words():
    page = ("Measured on the tree of `5b7f062` with the change\n"
            "that became `f355857`, as Issue 30 asked, on a GPU lent to us.\n")
    found = made_of(page)
    assert [(line, phrase) for line, phrase, _ in found] == [
        (1, "tree of `5b7f062"), (1, "with the change that became"), (2, "Issue 30"), (2, "lent")], found
    assert made_of("the tests this session added") and made_of("in the working tree")
    # the same words in their plain sense, and a commit named as the docs name it, pass
    plain = ("Recorded at `f355857` (2026-11-26). Each node is started in its own session; the ssh\n"
             "session's environment; a fat-tree of 32 pods; the issue is the host, not NIXL.\n")
    assert made_of(plain) == []


def test_the_width_checker_spares_tables_code_and_bare_links_only():
    wide = "x" * (MAX_COLUMNS + 1)
    page = "\n".join([
        "| " + wide + " |",                                         # a table's row
        "```text", wide, "```",                                     # a code block
        "[history](history/" + wide + ".md#" + wide + ").",         # a bare link
        "  ([the history page](history/" + wide + ".md)).",         # one, bracketed and indented
        "https://example.org/" + wide,                              # a bare URL
        "prose " + wide,                                            # line 8: prose
        "see [history](history/" + wide + ".md)",                   # line 9: a link inside prose
        "short",
    ])
    assert long_lines(page) == [(8, len("prose " + wide)), (9, len("see [history](history/" + wide + ".md)"))]
    assert long_lines("x" * MAX_COLUMNS) == []


# ----------------------------------------------------------------------------------------------------------
# the pages


@pytest.mark.parametrize("page", reference_pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_a_reference_page_holds_at_most_400_lines_of_at_most_120_columns(page):
    text = page.read_text()
    lines = len(text.splitlines())
    assert lines <= MAX_LINES, f"{page.relative_to(REPO)} has {lines} lines: move what happened to docs/history/"
    wide = long_lines(text)
    assert not wide, f"{page.relative_to(REPO)}: lines over {MAX_COLUMNS} columns (line, columns): {wide}"


@pytest.mark.parametrize("page", every_page(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_page_speaks_of_how_it_was_made(page):
    found = made_of(page.read_text())
    assert not found, f"{page.relative_to(REPO)}: " + "; ".join(f"line {n}: {p!r} ({why})" for n, p, why in found)
