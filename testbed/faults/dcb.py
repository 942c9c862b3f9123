"""A link fault on RDMA: the NIC's own egress rate limit of one traffic class (iproute2's ``dcb maxrate``).

A NIC's RDMA engine moves the KV without the kernel's qdiscs, so the tc shaping of
``testbed/faults/shaping.py`` never touches it (docs/cluster.md "RDMA: what could fault it"). What
does is the NIC's per-traffic-class egress limit (IEEE 802.1Qaz maxrate, the kernel's ``struct
ieee_maxrate``), set here through iproute2's ``dcb`` command with the KV in a class of its own: the
engines mark it with a DSCP (:func:`kv_class_environment`) that the NIC maps to that class, a
mapping the user sets on each node (``dcb app`` / ``dcb ets``, or ``mlnx_qos``).

What ``dcb`` reads and writes, from iproute2's own source (dcb/dcb_maxrate.c, lib/json_print.c,
lib/utils_math.c get_rate64; man/man8/dcb-maxrate.8):

* ``dcb -j maxrate show dev IF`` prints one JSON object, ``{"tc_maxrate":[r0,...,r7]}``, 0 meaning
  no limit. The kernel holds kbit/s. Since iproute2 6.18 (its commit e7d4c060, "dcb: fix tc-maxrate
  unit conversions") ``dcb`` prints bytes/s (kbit/s x 125) and converts a set's rate to kbit/s;
  from 5.11, which added the command, to 6.17 it printed the kernel's kbit/s as they were and
  handed a set's rate to the kernel in bytes/s as if kbit/s (a factor 125 off). So the version
  (``dcb -V``: "dcb utility, iproute2-6.1.0") decides both directions (:func:`units_fixed`).
* ``dcb maxrate set dev IF tc-maxrate TC:RATE ...``: RATE in tc's notation ("bit" bits/s, "kbit"
  kbit/s, ...); ``dcb`` reads the current rates first and changes only the classes named.

The NIC quantises what it is given: ConnectX (mlx5's ``mlx5e_dcbnl_ieee_setmaxrate``) keeps an
8-bit count of 100 Mbit/s up to 25.5 Gbit/s, then of 1 Gbit/s up to 255 Gbit/s (16 bits on
firmware that says so), rounding down, at least one step. What counts is the rate read back after
the set, which :meth:`DcbRateLimit.apply` returns: the rate the NIC says it configured, never a
measured one (nothing here can load an RDMA link). None of this has run on an RDMA NIC: these
machines have none, and the tests drive a fake ``dcb`` written from the sources above.

Like the GPU clock locks (testbed/faults/gpu.py), a limit outlives the process that set it, so
every set is preceded by a marker file (the interface, the class, the rates read before) and an
entry in the exit registry (testbed/faults/compute_common.py): interpreter exit restores it, and
after a SIGKILL ``testbed faults clear`` does (:func:`restore_leftovers`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import subprocess
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from core.util.files import write_json_atomic
from testbed.faults.cgroups import rmdir_state_dir, state_dir
from testbed.faults.compute_common import register, unregister
from testbed.machine.rdma import SYSFS, nic_driver

log = logging.getLogger(__name__)

DCB = "dcb"
TCS = 8  # IEEE_8021QAZ_MAX_TCS: tc_maxrate has one rate per traffic class 0..7
FIXED_UNITS = (6, 18)  # the first iproute2 release with commit e7d4c060 (its units fixed)
NOT_FOUND = 127  # the shell's status for a command that is not there
# ConnectX's rate steps (mlx5e_dcbnl_ieee_setmaxrate): MLX5E_100MB_TO_KB and MLX5E_1GB_TO_KB in kbit/s
_MLX5_STEPS_KBPS = (100_000, 1_000_000)
_MLX5_DRIVER = "mlx5_core"

# argv -> (exit status, stdout, stderr); a fake stands in for the NIC in the tests
Runner = Callable[[Sequence[str]], tuple[int, str, str]]


class DcbError(RuntimeError):
    """A dcb rate limit that cannot be read, set or restored; the message is one line."""


def run_command(argv: Sequence[str], timeout_s: float = 10.0) -> tuple[int, str, str]:
    """Run ``argv`` (no shell): (exit status, stdout, stderr); NOT_FOUND when the program is not there."""
    try:
        r = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        return NOT_FOUND, "", f"{argv[0]}: command not found"
    except subprocess.TimeoutExpired:
        return 124, "", f"{' '.join(argv)}: no answer within {timeout_s:g} s"
    return r.returncode, r.stdout, r.stderr


def _runner(runner: Runner | None) -> Runner:
    return runner if runner is not None else run_command  # looked up at call time: tests replace it


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def fmt_rate(bps: float) -> str:
    """``bps`` for a message: "250 Mbit/s", "2.5 Gbit/s"; 0 is "no limit" (DCB's meaning)."""
    if bps == 0:
        return "no limit"
    for scale, unit in ((1e9, "Gbit/s"), (1e6, "Mbit/s"), (1e3, "kbit/s")):
        if bps >= scale:
            return f"{bps / scale:.4g} {unit}"
    return f"{bps:.4g} bit/s"


# --------------------------------------------------------------------------- what dcb says, parsed

_VERSION = re.compile(r"iproute2-(\d+)\.(\d+)")


def parse_version(text: str) -> tuple[int, int] | None:
    """(major, minor) of ``dcb -V``'s "dcb utility, iproute2-6.1.0"; None for anything else."""
    m = _VERSION.search(text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def parse_maxrates(text: str, fixed: bool) -> tuple[int, ...]:
    """The rate of each traffic class 0..7 in bit/s (0: no limit) from ``dcb -j maxrate show dev IF``'s
    ``{"tc_maxrate":[...]}``: bytes/s where ``fixed`` (iproute2 6.18 on), else the kernel's kbit/s."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        raise DcbError(f"dcb -j maxrate show printed no JSON: {text.strip()[:80]!r}") from None
    rates = data.get("tc_maxrate") if isinstance(data, dict) else None
    if not (isinstance(rates, list) and len(rates) == TCS
            and all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in rates)):
        raise DcbError(f"dcb -j maxrate show: expected {{\"tc_maxrate\": [{TCS} rates]}}, got {text.strip()[:120]!r}")
    return tuple(r * 8 if fixed else r * 1000 for r in rates)


def rate_arg(rate_bps: float, fixed: bool) -> str:
    """``rate_bps`` (whole kbit/s, the kernel's unit, rounded down) as the RATE of a ``tc-maxrate``
    mapping such that the kernel gets it: "kbit" where dcb converts (6.18 on); before, dcb hands the
    kernel get_rate64's bytes/s as they are, so the kbit/s are written as that many bytes/s (x 8 bit)."""
    kbps = int(rate_bps) // 1000
    return f"{kbps}kbit" if fixed else f"{kbps * 8}bit"


def show_argv(ifname: str) -> list[str]:
    return [DCB, "-j", "maxrate", "show", "dev", ifname]


def set_argv(ifname: str, rates: Mapping[int, float], fixed: bool) -> list[str]:
    """``dcb maxrate set`` of the classes in ``rates`` (bit/s) only: dcb keeps the others as it reads them."""
    return [DCB, "maxrate", "set", "dev", ifname, "tc-maxrate",
            *(f"{tc}:{rate_arg(r, fixed)}" for tc, r in sorted(rates.items()))]


# --------------------------------------------------------------------------- refusals (one line each)


def mlx5_rate(rate_bps: float, wide: bool = False) -> int | None:
    """The rate (bit/s) ConnectX sets for a maxrate of ``rate_bps``, as mlx5e_dcbnl_ieee_setmaxrate
    computes it: 100 Mbit/s steps (at least one) up to 255 (``wide``: 65535) of them, then 1 Gbit/s
    steps up to as many; None above, where it refuses (EINVAL). 0 stays 0 (no limit)."""
    kbps = int(rate_bps) // 1000
    if kbps == 0:
        return 0
    top = 65535 if wide else 255
    small, big = _MLX5_STEPS_KBPS
    if kbps <= top * small:
        return max(kbps // small, 1) * small * 1000
    if kbps <= top * big:
        return kbps // big * big * 1000
    return None


def tc_refusal(tc: Any) -> str | None:
    if isinstance(tc, bool) or not isinstance(tc, int) or not 0 <= tc < TCS:
        return f"traffic class {tc!r} is outside 0-{TCS - 1} (IEEE 802.1Qaz has {TCS})"
    return None


def rate_refusal(rate_bps: float, driver: str | None = None) -> str | None:
    """Why a NIC (its kernel driver's name, ``driver``) cannot hold ``rate_bps`` as a maxrate, or None."""
    if not math.isfinite(rate_bps) or rate_bps <= 0:
        return (f"a rate of {rate_bps} bit/s cannot be a maxrate, where 0 means no limit: a link down "
                "(residual_bw 0) cannot be set this way")
    if rate_bps < 1000:
        return f"{rate_bps:g} bit/s is below 1 kbit/s, the kernel's maxrate unit"
    q = mlx5_rate(rate_bps) if driver == _MLX5_DRIVER else None
    if q is not None and q > rate_bps:
        return (f"{fmt_rate(rate_bps)} is below ConnectX's smallest step: mlx5 holds 100 Mbit/s steps up to "
                f"25.5 Gbit/s, then 1 Gbit/s steps, and would set {fmt_rate(q)}")
    return None


def side_refusal(side: str) -> str | None:
    if side != "uplink":
        return (f"dcb maxrate limits a NIC's egress only, and a {side} fault limits traffic entering the node "
                "(sent by its peers' NICs)")
    return None


def units_fixed(runner: Runner | None = None) -> bool:
    """Whether this node's dcb converts maxrate units (iproute2 6.18 on); refused where it cannot tell."""
    rc, out, err = _runner(runner)([DCB, "-V"])
    if rc == NOT_FOUND:
        raise DcbError("iproute2's dcb is not installed (apt-get install iproute2; dcb maxrate needs 5.11 or later)")
    version = parse_version(out)
    if version is None:
        raise DcbError(f"dcb -V said {_last_line(out + err)[:80]!r}, no iproute2 version: the maxrate units are "
                       "unknown (before 6.18 dcb reads them 125 times off)")
    return version >= FIXED_UNITS


def read_maxrates(ifname: str, runner: Runner | None = None, fixed: bool | None = None) -> tuple[int, ...]:
    """The maxrate of each traffic class of ``ifname`` in bit/s (0: no limit), as the NIC reports it."""
    fixed = units_fixed(runner) if fixed is None else fixed
    rc, out, err = _runner(runner)(show_argv(ifname))
    if rc != 0:
        said = _last_line(err) or f"exit status {rc}"
        hint = ": its driver has no DCB maxrate (ConnectX's mlx5 has)" if "not supported" in said.lower() else ""
        raise DcbError(f"dcb maxrate show dev {ifname}: {said}{hint}")
    return parse_maxrates(out, fixed)


def dcb_support(ifname: str, runner: Runner | None = None) -> str | None:
    """None where this node can limit ``ifname``'s traffic classes (the dcb binary, and maxrate answers
    for it), else why not, in one line. Reads only."""
    try:
        read_maxrates(ifname, runner)
    except DcbError as exc:
        return str(exc)
    return None


def _set_class(runner: Runner | None, ifname: str, tc: int, rate_bps: float, fixed: bool) -> int:
    """Set one class's maxrate and return what the NIC reads back for it (bit/s)."""
    rc, _, err = _runner(runner)(set_argv(ifname, {tc: rate_bps}, fixed))
    if rc != 0:
        raise DcbError(f"dcb maxrate set dev {ifname} tc-maxrate {tc}:{fmt_rate(rate_bps)}: "
                       f"{_last_line(err) or f'exit status {rc}'}")
    return read_maxrates(ifname, runner, fixed)[tc]


# --------------------------------------------------------------------------- markers (after a SIGKILL)


def marker_dir() -> Path:
    """One marker file per traffic class the project may have limited on this machine."""
    return state_dir() / "dcb-maxrate"


def _marker(ifname: str, tc: int) -> Path:
    return marker_dir() / f"{ifname}.tc{tc}.json"


def _mark(ifname: str, tc: int, before: Sequence[int], key: str) -> None:
    record = {"ifname": ifname, "tc": tc, "before_bps": list(before), "pid": os.getpid(), "key": key}
    for attempt in range(3):
        try:
            marker_dir().mkdir(parents=True, exist_ok=True)
            write_json_atomic(_marker(ifname, tc), record)
            return
        except FileNotFoundError:  # the CPU throttle removed the (empty) state dir meanwhile
            if attempt == 2:
                raise DcbError(f"cannot write the dcb marker in {marker_dir()}") from None


def _unmark(ifname: str, tc: int) -> None:
    _marker(ifname, tc).unlink(missing_ok=True)
    try:
        marker_dir().rmdir()  # only when empty
    except OSError:
        pass
    rmdir_state_dir()


def markers() -> list[dict[str, Any]]:
    """What the markers on this machine record (interface, class, rates before, owner pid, key)."""
    d = marker_dir()
    found = []
    for path in sorted(d.glob("*.tc[0-7].json")) if d.is_dir() else []:
        try:
            m = json.loads(path.read_text())
            ok = (isinstance(m, dict) and isinstance(m.get("ifname"), str) and tc_refusal(m.get("tc")) is None
                  and isinstance(m.get("before_bps"), list) and len(m["before_bps"]) == TCS)
        except (OSError, json.JSONDecodeError):
            ok = False
        if not ok:
            raise DcbError(f"dcb marker {path} is unreadable: check dcb maxrate show on its interface, then remove it")
        found.append(m)
    return found


def _alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def restore_leftovers(ifnames: Collection[str] | None = None, only_dead: bool = False,
                      runner: Runner | None = None) -> list[str]:
    """``testbed faults clear`` for dcb limits: give every class a marker names its rate from before
    (``ifnames``: on those interfaces only; ``only_dead``: only those whose process is gone, as an
    agent's ``clear_all`` does). Idempotent; returns "IF/tcN" of each restored. Without markers dcb
    is not run."""
    todo = [m for m in markers() if (ifnames is None or m["ifname"] in ifnames)
            and not (only_dead and _alive(m.get("pid")))]
    if not todo:
        return []
    fixed = units_fixed(runner)
    done, errors = [], []
    for m in todo:
        ifname, tc = m["ifname"], m["tc"]
        want = m["before_bps"][tc]
        try:
            got = _set_class(runner, ifname, tc, want, fixed)
            if got != want:
                raise DcbError(f"{ifname} traffic class {tc} reads {fmt_rate(got)} after restoring {fmt_rate(want)}")
        except DcbError as exc:
            errors.append(exc)
            continue
        _unmark(ifname, tc)
        done.append(f"{ifname}/tc{tc}")
    if errors:
        raise DcbError(f"{len(errors)} dcb limit(s) could not be restored, first: {errors[0]}")
    return done


# --------------------------------------------------------------------------- the limit


class DcbRateLimit:
    """The KV's traffic class on one interface, limited to a rate by the NIC (egress only).

    :meth:`apply` is "make it so": it reads every class's rate first (kept as the rates before),
    sets only the KV's class, reads back what the NIC accepted and returns it: the configured
    rate read back, not a measured one, and quantised by the NIC (ConnectX: :func:`mlx5_rate`); a
    read-back of no limit or above the asked rate (the NIC's units cannot hold it) is restored and
    refused. :meth:`clear` restores the class's rate from before. Never run on an RDMA NIC.
    """

    def __init__(self, runner: Runner | None = None, sysfs: Path = SYSFS) -> None:
        self.runner = runner
        self.sysfs = sysfs
        self.ifname: str | None = None
        self.tc: int | None = None
        self.before: tuple[int, ...] | None = None  # every class's rate before the first apply (bit/s)
        self.configured_bps: int | None = None  # the KV class's rate the NIC read back after the last apply
        self._lock = threading.RLock()

    @property
    def key(self) -> str:
        """The limit's name in the exit registry and markers: one limit per interface and class."""
        return f"{self.ifname}.tc{self.tc}"

    @property
    def active(self) -> bool:
        return self.before is not None

    def apply(self, ifname: str, tc: int, rate_bps: float) -> int:
        """Limit traffic class ``tc`` of ``ifname``'s egress to ``rate_bps``; returns the rate the NIC
        reads back for it (bit/s). Refused in one line, nothing changed, for a class outside 0-7, a
        rate the NIC cannot hold, or a class another live process holds."""
        why = tc_refusal(tc) or rate_refusal(rate_bps, nic_driver(ifname, self.sysfs))
        if why:
            raise DcbError(f"dcb maxrate on {ifname}: {why}: refused, nothing changed")
        with self._lock:
            if self.active and (self.ifname, self.tc) != (ifname, tc):
                self.clear()
            fixed = units_fixed(self.runner)
            first = not self.active
            if first:
                before = self._before(ifname, tc, read_maxrates(ifname, self.runner, fixed))
                self.ifname, self.tc, self.before = ifname, tc, before
            try:
                if first:
                    register(self)  # before the set: from here on, interpreter exit restores it
                    _mark(ifname, tc, before, self.key)  # `testbed faults clear` finds it after a SIGKILL
                got = _set_class(self.runner, ifname, tc, rate_bps, fixed)
                if got == 0 or got > rate_bps:
                    raise DcbError(f"dcb maxrate on {ifname}: the NIC set {fmt_rate(got)} for traffic class {tc} where "
                                   f"{fmt_rate(rate_bps)} was asked, a rate its units cannot hold: restored, refused")
            except BaseException:
                try:
                    self._restore()
                except DcbError as exc:  # the marker and the registry keep it: exit and `testbed faults clear` retry
                    log.error("restoring %s after a failed set failed: %s", self.key, exc)
                raise
            self.configured_bps = got
            return got

    def _before(self, ifname: str, tc: int, now: tuple[int, ...]) -> tuple[int, ...]:
        """The rates before: ``now``, or where a dead process left its limit on the class (its marker),
        the class's rate from before that one."""
        path = _marker(ifname, tc)
        if not path.exists():
            return now
        old = next((m for m in markers() if m["ifname"] == ifname and m["tc"] == tc), None)
        if old is None:
            return now
        if _alive(old.get("pid")):
            raise DcbError(f"dcb maxrate on {ifname}: traffic class {tc} is limited by process {old['pid']} "
                           f"({old.get('key')}): refused, nothing changed")
        return now[:tc] + (int(old["before_bps"][tc]),) + now[tc + 1:]

    def _restore(self) -> int | None:
        if not self.active:
            unregister(self)
            return None
        assert self.ifname is not None and self.tc is not None and self.before is not None
        want = self.before[self.tc]
        got = _set_class(self.runner, self.ifname, self.tc, want, units_fixed(self.runner))
        if got != want:
            raise DcbError(f"dcb maxrate on {self.ifname}: traffic class {self.tc} reads {fmt_rate(got)} after "
                           f"restoring {fmt_rate(want)}: left limited, `testbed faults clear` retries")
        _unmark(self.ifname, self.tc)
        unregister(self)
        self.before = self.configured_bps = None
        return got

    def clear(self) -> int | None:
        """Restore the class's rate from before (idempotent); returns what the NIC reads back for it, None
        when nothing was limited. A restore that fails stays marked and registered, so it is retried."""
        with self._lock:
            return self._restore()

    def _teardown(self) -> list[str]:
        """The exit registry's undo; returns what was restored."""
        with self._lock:
            what = [f"dcb:{self.ifname}/tc{self.tc}"] if self.active else []
            self._restore()
            return what
