"""Engines kept between commands (testbed/engines/kept.py): their key says what makes them, and
on a real (local) Ray a kept set is found by its key and names, an incomplete or other set is not,
and stopping them leaves none. The engines themselves are stood in for by detached actors with the
engine actor's `shutdown`; the e2e cluster (tests/e2e_cluster.py) keeps and reuses real ones."""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="Ray is not installed")

from testbed.engines.kept import KEPT_NAMESPACE, actor_name, engine_key, find_kept, list_kept, stop_kept  # noqa: E402

NAMES = ["pod0-prefill", "pod1-prefill", "pod2-decode", "pod3-decode"]


def _made(lease: int = 20, pod0: str = "pod0") -> list[dict]:
    return [{"role": "prefill", "interface": ["eth0"], "placement": {"resources": {pod0: 0.9}},
             "config": {"name": "pod0-prefill", "kv_lease_s": lease, "model": "/m"}}]


def test_the_key_follows_what_makes_the_engines_and_nothing_else():
    assert engine_key(_made()) == engine_key(_made())
    assert engine_key(_made(lease=25)) != engine_key(_made())  # another lease: other engines
    assert engine_key(_made(pod0="pod1")) != engine_key(_made())  # placed elsewhere


@pytest.fixture
def ray_local():
    import ray

    if ray.is_initialized():  # another module's connection: this test wants its own node
        ray.shutdown()
    from core.util.logs import LEVEL_ENV

    # as the driver starts its job: its log level handed to every worker (core/util/logs.py child_env)
    ray.init(address="local", num_cpus=1, include_dashboard=False, object_store_memory=100 * 2**20,
             logging_level="ERROR", log_to_driver=False, runtime_env={"env_vars": {LEVEL_ENV: "INFO"}})
    try:
        yield ray
    finally:
        ray.shutdown()


def test_a_kept_set_is_found_whole_by_its_key_and_stopping_leaves_none(ray_local):
    ray = ray_local

    @ray.remote(num_cpus=0)
    def level_of_a_worker() -> int:  # what an actor's configure_from_env() finds in its worker
        import logging

        from core.util.logs import configure_from_env

        configure_from_env()
        return logging.getLogger().level

    assert ray.get(level_of_a_worker.remote(), timeout=60) == 20  # logging.INFO, the job's level

    @ray.remote(num_cpus=0)
    class Stand:  # the engine actor's part kept_engines calls
        def __init__(self, name: str) -> None:
            self.name = name

        def who(self) -> str:
            return self.name

        def shutdown(self) -> None:
            pass

    def keep(key: str, gen: int, names: list[str]) -> None:
        for n in names:
            Stand.options(name=actor_name(key, gen, n), namespace=KEPT_NAMESPACE, lifetime="detached").remote(n)

    keep("aaa", 0, NAMES)
    keep("bbb", 0, NAMES[:3])  # an incomplete set of other engines
    Stand.options(name="aaa.0.pod0-prefill", namespace="someone-else", lifetime="detached").remote("x")
    assert sorted((k.key, k.name) for k in list_kept()) == sorted([("aaa", n) for n in NAMES] + [("bbb", n) for n in NAMES[:3]])
    gen, handles = find_kept("aaa", NAMES[::-1])
    assert gen == 0 and ray.get([h.who.remote() for h in handles]) == NAMES[::-1]  # in the order asked
    assert find_kept("bbb", NAMES) is None and find_kept("ccc", NAMES) is None
    keep("aaa", 1, NAMES[:1])  # a restart under way: the newest generation is not whole
    assert find_kept("aaa", NAMES) is None
    stopped = stop_kept()
    assert len(stopped) == 4 + 3 + 1 and "aaa.1.pod0-prefill" in stopped
    assert list_kept() == []  # gone when it returns: their names are free for new engines
    keep("aaa", 0, NAMES)
    assert find_kept("aaa", NAMES) is not None
    stop_kept()
    # the actor in another namespace is not the project's to stop
    assert ray.get(ray.get_actor("aaa.0.pod0-prefill", namespace="someone-else").who.remote()) == "x"
