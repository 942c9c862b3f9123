"""What the project may have left on this machine: ``testbed leftovers`` lists it.

After a run ends (or its driver is SIGKILLed, and then ``testbed cluster down`` and the
faults' time to live have done their part) every item here should be gone. Each kind is
found the way the code that creates it names it, so nothing of anyone else's is listed:

* network namespaces ``tb-*`` (emulated clusters, test fabrics) and, in the root namespace
  and each of those, links named ``tb-*`` (the ingress ifb devices ``tb-ifb-*``) and
  qdiscs with the project's handle majors ``7e57``-``7e59`` (link faults);
* cgroups under ``testbed-faults`` in every CPU controller hierarchy (compute faults),
  their crash-state files, and GPU clock-lock markers (a GPU left at locked clocks);
* processes carrying an emulated cluster's marker in their environment, or living in a
  project namespace (Ray nodes, engines, fault agents, sshd of ``ray up``);
* files: emulated clusters' state files and Ray temp roots, ``ray up``'s bootstrap files
  in root's home, the drivers' and study cells' scratch folders.

Not listed: the lock file ``testbed faults clear`` serialises on (an empty file in
/run, wiped at boot, kept so that a waiting clear never locks a removed file) and the
tiny model's cache, which later runs reuse.
"""

from __future__ import annotations

import glob
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from testbed.cluster.emulated import default_state_dir
from testbed.machine.procs import RUN_MARKER_ENV, protected_pids
from testbed.faults.agent_actor import clear_lock_path
from testbed.machine.procs import all_pids
from testbed.machine.netns import PREFIX, NetnsError, in_netns, list_namespaces, processes_in_namespaces
from testbed.cluster.rayup import BOOTSTRAP_FILES

# What removes each kind (printed beside it)
REMEDY = {
    "namespace": "testbed cluster down",
    "link": "testbed faults clear",
    "qdisc": "testbed faults clear",
    "cgroup": "testbed faults clear",
    "gpu-lock": "testbed faults clear",
    "process": "testbed cluster down",
    "file": "remove it (testbed cluster down removes a cluster's)",
}


@dataclass(frozen=True)
class Leftover:
    kind: str
    what: str

    def line(self) -> str:
        return f"{self.kind:<9} {self.what}  ({REMEDY[self.kind]})"


def _links_and_qdiscs(where: str) -> list[Leftover]:
    """The project's links and qdiscs in the calling thread's namespace (named ``where``)."""
    from pyroute2 import IPRoute

    from testbed.faults.shaping import DROP, IFB_PREFIX, MAJOR, NETEM

    majors = {MAJOR, NETEM >> 16, DROP >> 16}  # the shaper's root and classes, netem's delay, a link down

    out: list[Leftover] = []
    with IPRoute() as ipr:
        names = {link["index"]: link.get_attr("IFLA_IFNAME") for link in ipr.get_links()}
        if where == "host":  # inside a project namespace every link is the project's; on the host only its own names
            out += [Leftover("link", f"host:{n}") for n in sorted(v for v in names.values() if v and
                                                                     (v.startswith(IFB_PREFIX) or v.startswith(PREFIX + "-")))]
        for q in ipr.get_qdiscs():
            if q["handle"] >> 16 in majors:
                out.append(Leftover("qdisc", f"{where}:{names.get(q['index'], q['index'])} {q['handle'] >> 16:x}: "
                                             f"{q.get_attr('TCA_KIND')}"))
    return out


def _network() -> list[Leftover]:
    out = [Leftover("namespace", ns) for ns in list_namespaces()]
    out += _links_and_qdiscs("host")
    for ns in list_namespaces():
        try:
            with in_netns(ns):
                out += _links_and_qdiscs(ns)
        except NetnsError:  # removed meanwhile
            pass
    return out


def _cgroups_and_gpus() -> list[Leftover]:
    from testbed.faults.cgroups import PARENT, cpu_layout, state_dir
    from testbed.faults.gpu import locked_uuids

    out: list[Leftover] = []
    try:
        layout = cpu_layout()
    except Exception:  # no CPU controller: none can have been made
        layout = None
    for h in layout.hierarchies if layout is not None else ():
        parent = h.mount / PARENT
        if parent.is_dir():
            out += [Leftover("cgroup", str(d)) for d in sorted(parent.iterdir()) if d.is_dir()] or \
                [Leftover("cgroup", str(parent))]
    sd = state_dir()
    if sd.is_dir():
        out += [Leftover("file", str(f)) for f in sorted(sd.iterdir())]
    out += [Leftover("gpu-lock", u) for u in locked_uuids()]
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def _processes() -> list[Leftover]:
    marker = f"{RUN_MARKER_ENV}=".encode()
    found: dict[int, str] = dict(processes_in_namespaces(list_namespaces()))
    for pid in all_pids():
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(e.startswith(marker) for e in env):
            found.setdefault(pid, "host")
    mine = protected_pids()
    return [Leftover("process", f"{pid} [{where}] {_cmdline(pid)[:120]}")
            for pid, where in sorted(found.items()) if pid not in mine]


def _files() -> list[Leftover]:
    tmp = tempfile.gettempdir()
    state = default_state_dir()
    lock = clear_lock_path()
    paths = [p for p in sorted(state.glob("*")) if p != lock] if state.is_dir() else []
    for pattern in (f"{tmp}/{PREFIX}-*", f"{tmp}/testbed-run-*", f"{tmp}/testbed-cell-*"):
        paths += [Path(p) for p in sorted(glob.glob(pattern))]
    home = Path(os.path.expanduser("~"))
    paths += [home / f for f in BOOTSTRAP_FILES if (home / f).exists()]
    return [Leftover("file", str(p)) for p in paths]


def find_leftovers() -> list[Leftover]:
    """Everything of the project's still on this machine (see the module docstring)."""
    return [*_network(), *_cgroups_and_gpus(), *_processes(), *_files()]
