"""What a router knows of its own requests still in flight: the in-flight evidence of the risk price.

Without telemetry the price learns of a degraded link only from requests that have ended: a
pull stuck on the link counts once its request is given up, a first-token limit after it was
routed. The router knows more than that without any telemetry: which of its own requests were
handed to decode (their prefill returned) and have not ended, and since when. Both worlds know
exactly that much, live: the testbed's router stamps the hand-off when the prefill call returns
and learns nothing more of a decode call until it returns (the calls do not stream); the
simulator knows more but must not use it, or the two worlds would price differently.

The evidence (``telemetry.in_flight``): a request handed off longer ago than the longest
hand-off-to-end of the requests that ended ``ok`` within the history window has already
waited longer than any healthy request did, so it counts as a provisional timeout of its two
pods (a stuck request may be stuck in the pull or in the decode, the testbed cannot tell which,
as the blame rule does for ``kv_transfer``) until it ends, when its real outcome replaces it.
The threshold is the router's own observation, not a parameter: with no request ended ``ok``
in the window there is no evidence. A spec turns it on with ``telemetry.in_flight`` (docs/spec.md).
"""

from __future__ import annotations

from collections import deque

import numpy as np

__all__ = ["InFlightEvidence"]


class InFlightEvidence:
    def __init__(self, n_pods: int, window_s: float) -> None:
        if window_s <= 0:
            raise ValueError("in-flight evidence: window_s must be positive")
        self.n_pods = n_pods
        self.window_s = window_s
        self._open: dict[object, tuple[float, int, int]] = {}  # key -> (hand-off time, prefill pod, decode pod)
        self._ok: deque[tuple[float, float]] = deque()  # (end time, hand-off to end) of attempts ended ok

    def handed_off(self, key: object, at: float, prefill_pod: int, decode_pod: int) -> None:
        """The request ``key`` (a ticket) was handed to its decode worker at ``at``."""
        self._open[key] = (at, prefill_pod, decode_pod)

    def ended(self, now: float, key: object, ok: bool) -> None:
        """The request ``key`` ended at ``now`` (a request never handed off is ignored)."""
        opened = self._open.pop(key, None)
        if opened is not None and ok:
            self._ok.append((now, now - opened[0]))

    def longest_ok_s(self, now: float) -> float:
        """The longest hand-off-to-end of the requests ended ok in (now - window_s, now]; NaN if none."""
        ok = self._ok
        while ok and ok[0][0] <= now - self.window_s:
            ok.popleft()
        return max((d for _, d in ok), default=float("nan"))

    def overdue(self, now: float) -> np.ndarray:
        """Per pod, the open requests touching it that have waited past :meth:`longest_ok_s`
        (a request whose two ends are one pod counts once there)."""
        out = np.zeros(self.n_pods)
        limit = self.longest_ok_s(now)
        if limit != limit:  # NaN: nothing ended ok in the window, so no yardstick
            return out
        for at, pp, dp in self._open.values():
            if now - at > limit:
                out[pp] += 1
                if dp != pp:
                    out[dp] += 1
        return out
