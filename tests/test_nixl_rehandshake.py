"""The engines' re-handshake after a failed KV read (testbed/engines/vllm_hooks.py install_rehandshake),
against vLLM's own NIXL worker code: without it vLLM 0.32 keeps a peer whose endpoint failed, and
every later read to it fails (docs/testbed.md "The outage after the outage"). On real engines the
link-down runs of the end-to-end tests exercise it."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="vLLM's CPU build is not installed (the README's install command installs it)")


def _nixl_worker_after_a_failed_read(rehandshake: bool, reading: bool = False):
    """vLLM's own NIXL pull worker (its cleanup code, state stubbed) after a read from engine "E"
    failed on an endpoint whose metadata NIXL still holds (a UCX peer dropped), no read in flight:
    the state its `_cleanup_remote_engines` then keeps, and the agents it removed."""
    import threading
    import types

    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker import NixlBaseConnectorWorker

    removed: list[str] = []
    wrapper = types.SimpleNamespace(check_remote_metadata=lambda agent: True, remove_remote_agent=removed.append,
                                    release_dlist_handle=lambda h: None)
    w = object.__new__(NixlBaseConnectorWorker)
    empty = ("dst_xfer_side_handles", "_engine_by_address", "_recving_metadata", "_invalid_engine_backoff",
             "kv_caches_base_addr", "dst_num_blocks", "dst_region_num_blocks", "dst_region_group_ids",
             "dst_uses_region_group_mapping", "dst_region_mem_types", "tp_mappings", "_engine_clock_offset",
             "_engine_last_active", "_handshake_futures", "_recving_transfers")
    for name in empty:
        setattr(w, name, {})
    w._TRANSFER_MODE, w.transfer_topo, w.nixl_wrapper = "pull", None, wrapper
    w._handshake_lock = threading.Lock()
    w._remote_agents = {"E": {(0, 0): "agent-E"}}
    w._engine_by_address = {("10.0.0.2", 5600): "E"}  # a live peer, not one replaced by another
    w._failed_remote_engines, w._invalid_remote_engines = {"E"}, set()
    if reading:  # another read of E still in flight (a slow link's)
        w._recving_transfers = {"req-2": [7]}
        w._recving_metadata = {"req-2": types.SimpleNamespace(remote=types.SimpleNamespace(engine_id="E"))}
    if rehandshake:
        from testbed.engines.vllm_hooks import install_rehandshake

        install_rehandshake()
        w._cleanup_remote_engines()
        if reading:  # kept (vLLM would reject every new read of an invalid peer meanwhile), not forgotten
            assert "E" in w._remote_agents and removed == [] and not w._invalid_remote_engines
            w._recving_transfers, w._recving_metadata = {}, {}
            w._failed_remote_engines = set()  # vLLM's cleanup cleared it; the hook kept E
            w._cleanup_remote_engines()
    else:  # vLLM 0.32's own method (the hook keeps it where it is installed)
        getattr(NixlBaseConnectorWorker, "_vllm_cleanup_remote_engines",
                NixlBaseConnectorWorker._cleanup_remote_engines)(w)
    return w, removed


def test_after_a_failed_read_the_nixl_worker_drops_the_peer_for_a_new_handshake():
    """testbed/engines/vllm_hooks.py install_rehandshake, against vLLM's own cleanup: vLLM 0.32 keeps a
    peer whose read failed while NIXL still has its metadata, so every later read to it fails
    (docs/testbed.md "The outage after the outage"); with the hook the peer is released and its
    agent removed, and the next read handshakes anew."""
    kept, removed = _nixl_worker_after_a_failed_read(rehandshake=False)
    assert "E" in kept._remote_agents and removed == []
    for reading in (False, True):  # with another read of it in flight: once that has drained
        dropped, removed = _nixl_worker_after_a_failed_read(rehandshake=True, reading=reading)
        assert "E" not in dropped._remote_agents and removed == ["agent-E"]
        assert "E" in dropped._invalid_engine_backoff  # vLLM's backoff against a peer that keeps failing
