"""When the router takes an engine for down, and for up again: one rule both worlds feed with what
they observe (docs/reliability.md "Engine death in both worlds").

The router asks every engine whether it serves every ``testbed.engine_check_s`` from the run's
start, and at once when a call to it raised. An engine answers in one of three ways:

* ``ALIVE``: it serves (vLLM's health check through its actor answered);
* ``DEAD``: the answer is an error (its actor or its engine core is dead);
* ``NO_ANSWER``: nothing within the question's time limit: a busy engine, not a dead one.

``DEAD`` puts a live engine down (the router stops choosing it), ``ALIVE`` puts a down one up again
(restarted by an engine fault's ``restart_s``), and nothing else changes anything. The testbed
feeds the rule its engines' answers (testbed/router/flow.py ``Liveness``); the simulator, which
knows which of its engines are dead, feeds it the answer each would give (simulator/engine_deaths.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from core.run import RunContext

Answer = Literal["alive", "dead", "no_answer"]
ALIVE: Answer = "alive"
DEAD: Answer = "dead"
NO_ANSWER: Answer = "no_answer"
ANSWERS: tuple[Answer, ...] = (ALIVE, DEAD, NO_ANSWER)


def next_state(down: bool, answer: Answer) -> bool:
    """Whether the router takes the engine for down after ``answer``, having taken it for ``down``."""
    if answer not in ANSWERS:
        raise ValueError(f"unknown liveness answer {answer!r} (known: {', '.join(ANSWERS)})")
    return {ALIVE: False, DEAD: True, NO_ANSWER: down}[answer]


class EngineLiveness:
    """The router's view of which engines are down, changed only through :func:`next_state`; a change
    is recorded through the run context (an ``engines`` record, the router's view)."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx

    def is_down(self, worker: int) -> bool:
        down = self.ctx.router.view.pods.down
        return down is not None and bool(down[worker])

    def answered(self, now: float, worker: int, answer: Answer, why: str) -> bool | None:
        """The engine of ``worker`` answered the router's question: True if it went down now, False
        if it came up now, None if nothing changed."""
        was = self.is_down(worker)
        down = next_state(was, answer)
        if down == was:
            return None
        (self.ctx.engine_down if down else self.ctx.engine_up)(now, worker, why)
        return down
