"""`testbed leftovers` finds what the project sets on a machine, by the project's own names."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest

from testbed.machine.netns import Fabric, create_fabric, destroy_fabric, in_netns, missing_privileges

pytestmark = pytest.mark.skipif(missing_privileges() is not None,
                                reason=f"needs root for network namespaces: {missing_privileges()}")


def _kinds(items) -> set[str]:
    return {x.kind for x in items}


def test_namespaces_qdiscs_and_links_are_listed_while_they_exist_and_not_after():
    from testbed.faults import shaping
    from testbed.cluster.leftovers import find_leftovers

    fab = Fabric.plan(uuid.uuid4().hex[:10], 2)
    ours = lambda: [x for x in find_leftovers() if fab.run_id in x.what]  # noqa: E731 (other runs may be up)
    try:
        create_fabric(fab)
        pod0 = fab.node("pod0").netns
        with in_netns(pod0):
            shaping.shape(shaping.Shaping("eth0", "egress", 10e6))
            shaping.shape(shaping.Shaping("eth0", "ingress", 0.0))  # a link down: its ifb and drop qdisc
        found = ours()
        whats = "\n".join(x.line() for x in found)
        assert {ns for ns in fab.namespaces} <= {x.what for x in found if x.kind == "namespace"}, whats
        assert f"qdisc     {pod0}:eth0 7e57: htb" in whats
        assert f"{pod0}:tb-ifb-eth0 7e59: pfifo" in whats  # the drop under the ifb's shaped class
        assert "(testbed cluster down)" in whats and "(testbed faults clear)" in whats
    finally:
        destroy_fabric(fab)
    assert ours() == []


def test_a_process_of_an_emulated_cluster_is_listed_by_its_marker():
    from testbed.machine.procs import RUN_MARKER_ENV
    from testbed.cluster.leftovers import find_leftovers

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            env={RUN_MARKER_ENV: "leftover-test"})
    try:
        found = [x for x in find_leftovers() if x.kind == "process" and x.what.startswith(f"{proc.pid} ")]
        assert len(found) == 1 and "time.sleep(60)" in found[0].what, found
    finally:
        proc.kill()
        proc.wait()
    assert not [x for x in find_leftovers() if x.kind == "process" and x.what.startswith(f"{proc.pid} ")]


def test_the_command_says_nothing_is_left_or_lists_it_with_exit_status_1(tmp_path):
    from testbed.cluster.leftovers import find_leftovers

    res = subprocess.run([sys.executable, "-m", "cli", "leftovers"], capture_output=True, text=True, timeout=60)
    if find_leftovers():  # a machine with something on it already (another run going on)
        assert res.returncode == 1 and res.stdout.strip()
        return
    assert res.returncode == 0 and "nothing of the project's is left" in res.stdout
    fab = Fabric.plan(uuid.uuid4().hex[:10], 1)
    try:
        create_fabric(fab)
        res = subprocess.run([sys.executable, "-m", "cli", "leftovers"], capture_output=True, text=True,
                             timeout=60)
        assert res.returncode == 1 and fab.namespaces[0] in res.stdout
    finally:
        destroy_fabric(fab)
