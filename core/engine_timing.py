"""An engine's timing: the one rule the simulator runs, the calibration fits and checks, and the
host analysis prices a request by. A second copy is how the worlds would drift apart unnoticed.

* a prefill batch: ``overhead_s + tokens / tokens_per_s`` (the batch's prompt tokens);
* a decode step: ``base_s + per_seq_s x batch + per_kv_token_s x KV tokens in the batch`` (every
  running sequence advances one token a step);
* a lone KV pull: ``latency_s + bytes / bytes_per_s``. This is an approximation of the
  simulator's flow network (simulator/network.py: max-min fair flows over the sender's NIC, the
  pods' core links and the receiver's NIC, in whole cache blocks, with protocol headers on the
  wire), exact only for a pull that shares no link with another one: the calibration check prices
  only such pulls with it (analysis/checks/calibration.py ``lone_pulls``).

The fitted coefficients and where they come from: core/calibration/fit.py (``testbed calibrate``).
Plain arithmetic, so each function takes floats (the simulator's hot path, on the compiled list
of core/compiled.py) or numpy arrays (the analysis) alike; a slow-down factor multiplies the
result.
"""

from __future__ import annotations

__all__ = ["decode_step_s", "lone_pull_s", "prefill_s"]


def prefill_s(overhead_s, tokens_per_s, tokens):
    """Seconds of a prefill batch of ``tokens`` prompt tokens, on an engine at full speed."""
    return overhead_s + tokens / tokens_per_s


def decode_step_s(base_s, per_seq_s, per_kv_token_s, batch, kv_tokens):
    """Seconds of one decode step of ``batch`` sequences holding ``kv_tokens`` KV tokens, at full speed."""
    return base_s + per_seq_s * batch + per_kv_token_s * kv_tokens


def lone_pull_s(latency_s, kv_bytes, bytes_per_s):
    """Seconds of a KV pull of ``kv_bytes`` alone on its path at ``bytes_per_s``, its completion notice included."""
    return latency_s + kv_bytes / bytes_per_s
