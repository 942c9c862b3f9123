"""The emulated cluster brought up the way a real one is: ``ray up`` on a local-provider cluster file.

Each node of the fabric (``netns``) runs its own sshd, inside the node's network namespace, listening
on the node's address only and accepting one key made for the run.
Then ``ray up`` runs in the head's namespace on a cluster file generated for the run, exactly as a
user runs it against ``cluster.yaml``: Ray's local provider sshes into the head, starts it, and the
head's autoscaler sshes into every worker and starts it. Verified with Ray 2.60 (docs/verified.md
"ray up with the local provider"): ``ray up`` returns in about 8 s and the workers join within about 20 s; only with
``RAY_UP_enable_autoscaler_v2=0`` (under v2 only one of two workers ever started).

What differs from a real cluster, and why:

* the nodes share one filesystem, so there are no ``file_mounts`` or setup commands; ``ray up``
  leaves ``~/ray_bootstrap_config.yaml`` and ``~/ray_bootstrap_key.pem`` in root's home as on a
  real head node (OpenSSH expands ``-i ~/...`` from the password database, not ``HOME``, so they
  cannot be moved), and :func:`remove_bootstrap_files` takes them away again at ``down``. So one
  emulated cluster at a time is brought up this way on a machine: the head's autoscaler reads the
  config again and again, and one that another ``ray up`` replaced terminated its cluster's nodes
  (seen with two clusters up at once, 2026-12-02: "Terminated by autoscaler"), so
  :func:`bootstrap_owner` finds the cluster that holds it, and a second ``ray up`` is refused;
* a worker finds its own start command by its address (:func:`start_node`), since the local
  provider gives every worker the same ``worker_start_ray_commands``;
* no ``ray stop`` in the start commands: it would kill every Ray process it can see, every other
  node's too, since the nodes share the host's PID namespace (see :func:`sshd_argv`).

``ray down`` stops the head only (its worker raylets stay alive, seen here and in the issue), so
:meth:`EmulatedCluster.down` calls it and then removes every process left in the run's namespaces.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from testbed.machine.netns import PREFIX, Fabric, NodeLink, list_namespaces, run_prefix

SSHD = "/usr/sbin/sshd"
TOOLS = {"sshd": SSHD, "rsync": "rsync", "ssh": "ssh", "ssh-keygen": "ssh-keygen"}
# Ray 2.60's v2 autoscaler started only one of two local-provider workers (docs/verified.md "ray up with the local provider"): use v1.
RAY_UP_ENV = {"RAY_UP_enable_autoscaler_v2": "0"}
CLUSTER_FILE = "cluster.yaml"
NODES_DIR = "nodes"  # <temp_root>/nodes/<node>.json: the node's ray start argv and environment
KEY = "ssh/id_ed25519"
BOOTSTRAP_FILES = ("ray_bootstrap_config.yaml", "ray_bootstrap_key.pem")
SSH_USER = "root"  # namespaces and shaping need root on every node anyway


def missing_tools() -> str | None:
    """None when this machine can run ``ray up`` against namespaces, else what is missing."""
    missing = [name for name, path in TOOLS.items() if shutil.which(path) is None]
    if missing:
        return (f"ray up needs {', '.join(missing)} (Debian: openssh-server openssh-client rsync; "
                "./install.sh installs them when run as root)")
    return None


def make_keys(temp_root: Path, fabric: Fabric) -> None:
    """The run's client key (authorized on every node) and one host key per node."""
    ssh = temp_root / "ssh"
    ssh.mkdir(parents=True, exist_ok=True)
    os.chmod(ssh, 0o700)
    for path in [temp_root / KEY, *(ssh / f"host_{n.name}" for n in fabric.nodes)]:
        if not path.exists():
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"testbed-{fabric.run_id}",
                            "-f", str(path)], check=True, capture_output=True)
    (ssh / "authorized_keys").write_text((temp_root / f"{KEY}.pub").read_text())
    os.chmod(ssh / "authorized_keys", 0o600)


def sshd_config(temp_root: Path, node: NodeLink) -> Path:
    """The node's sshd configuration: its address only, the run's key only."""
    ssh = temp_root / "ssh"
    path = ssh / f"sshd_{node.name}.conf"
    path.write_text("\n".join([
        f"ListenAddress {node.address}",
        f"HostKey {ssh / f'host_{node.name}'}",
        f"PidFile {ssh / f'sshd_{node.name}.pid'}",
        f"AuthorizedKeysFile {ssh / 'authorized_keys'}",
        "PermitRootLogin prohibit-password",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "StrictModes no",  # the run's files live under a temp dir, not a home with sshd's modes
        "PrintMotd no",
        "",
    ]))
    return path


# sshd's privilege separation directory (compiled in; Debian's path). Its service's start script
# creates it at boot (it lives on the /run tmpfs); without that service, as on a fresh container
# with openssh-server installed but never started, sshd exits at once: "Missing privilege
# separation directory: /run/sshd".
PRIVSEP_DIR = Path("/run/sshd")


def ensure_privsep_dir(path: Path = PRIVSEP_DIR) -> bool:
    """Create sshd's privilege separation directory as its service would (root's, mode 0755) if it
    is missing; True when it was created. It is the system's, not the run's: it stays."""
    if path.is_dir():
        return False
    path.mkdir(mode=0o755, parents=True)
    os.chmod(path, 0o755)
    return True


def sshd_argv(config: Path) -> list[str]:
    """sshd in the foreground. In the host's PID namespace, not one of its own: a process's PID
    then means the same on the node and on the host, which the host-side tools rely on (status,
    teardown, tests that signal an agent by the PID it reports); nothing here runs `ray stop`,
    the one reason to hide the nodes' processes from each other."""
    return [SSHD, "-D", "-e", "-f", str(config)]


# What belongs to the ssh session on the node, not to the process that planned the node: HOME
# above all (Ray expands ``~/ray_bootstrap_config.yaml`` with it).
SESSION_ENV = ("HOME", "PWD", "OLDPWD", "SHLVL", "_", "USER", "LOGNAME", "MAIL", "TERM")


def write_node_commands(temp_root: Path, commands: Mapping[str, tuple[Sequence[str], Mapping[str, str]]]) -> None:
    """Each node's ray start argv and environment (readable by root only: it is the planning
    process's environment), for :func:`start_node` to run on the node."""
    d = temp_root / NODES_DIR
    d.mkdir(parents=True, exist_ok=True)
    for name, (argv, env) in commands.items():
        keep = {k: v for k, v in env.items() if k not in SESSION_ENV and not k.startswith("SSH_")}
        path = d / f"{name}.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"argv": list(argv), "env": keep}, f)


def cluster_name(run_id: str) -> str:
    """The name ``ray up`` knows the run's cluster by (its cluster file's, the bootstrap config's)."""
    return f"{PREFIX}-{run_id}"


def cluster_file(fabric: Fabric, temp_root: Path, python: str = sys.executable) -> dict[str, Any]:
    """The local-provider cluster file of the run (what ``ray up`` reads)."""
    start = f"{python} -m testbed.cluster.rayup start-node {temp_root}"
    return {
        "cluster_name": cluster_name(fabric.run_id),
        "provider": {"type": "local", "head_ip": fabric.head.address, "worker_ips": [p.address for p in fabric.pods]},
        "auth": {"ssh_user": SSH_USER, "ssh_private_key": str(temp_root / KEY)},
        "max_workers": len(fabric.pods),
        "upscaling_speed": 1.0,
        # The emulated cluster is torn down by `testbed cluster down`, never scaled down while in use.
        "idle_timeout_minutes": 60,
        "file_mounts": {},  # one filesystem: the project is already where every node runs it
        "initialization_commands": [],
        "setup_commands": [],
        "head_setup_commands": [],
        "worker_setup_commands": [],
        "head_start_ray_commands": [f"{start} --autoscaling-config=~/ray_bootstrap_config.yaml"],
        "worker_start_ray_commands": [start],
    }


def write_cluster_file(fabric: Fabric, temp_root: Path) -> Path:
    path = temp_root / CLUSTER_FILE
    path.write_text("# Generated by `testbed cluster up` for run " + fabric.run_id + "; ray up reads it.\n"
                    + yaml.safe_dump(cluster_file(fabric, temp_root), sort_keys=False))
    return path


def ray_cli_argv(action: str, path: Path) -> list[str]:
    """``ray up`` / ``ray down`` on the run's cluster file, non-interactive."""
    extra = ["--no-config-cache"] if action == "up" else []
    return [sys.executable, "-m", "ray.scripts.scripts", action, "-y", *extra, str(path)]


def ssh_home() -> Path:
    """Where ``ray up`` leaves its bootstrap files: the ssh user's home from the password database,
    as sshd gives it to the sessions."""
    import pwd

    return Path(pwd.getpwnam(SSH_USER).pw_dir)


def bootstrap_cluster(home: Path | None = None) -> str | None:
    """The cluster name in the ``ray up`` config in ``home`` (default :func:`ssh_home`); None where
    there is none or it cannot be read."""
    try:
        name = json.loads(((home or ssh_home()) / BOOTSTRAP_FILES[0]).read_text()).get("cluster_name")
    except (OSError, ValueError, AttributeError):
        return None
    return name if isinstance(name, str) else None


def bootstrap_owner(home: Path | None = None) -> str | None:
    """The run id of the emulated cluster whose ``ray up`` config is in ``home`` (default
    :func:`ssh_home`) while any of that run's namespaces exists (its head's autoscaler reads the
    file as long as it runs); None when there is none, or it is a crashed run's leftover."""
    name, prefix = bootstrap_cluster(home) or "", cluster_name("")
    run_id = name[len(prefix):] if name.startswith(prefix) else ""
    try:
        return run_id if run_id and list_namespaces(run_prefix(run_id)) else None
    except ValueError:  # not a run id of ours: another tool's ray up, not ours to judge
        return None


def remove_bootstrap_files(fabric: Fabric, temp_root: Path, home: Path | None = None) -> list[str]:
    """Remove what ``ray up`` left in root's home for this run (its cluster's config, the run's key)."""
    home = home if home is not None else ssh_home()
    removed = []
    config, key = (home / f for f in BOOTSTRAP_FILES)
    if bootstrap_cluster(home) == cluster_name(fabric.run_id):
        config.unlink(missing_ok=True)
        removed.append(str(config))
    try:
        if key.read_bytes() == (temp_root / KEY).read_bytes():
            key.unlink()
            removed.append(str(key))
    except OSError:
        pass
    return removed


def remove_ssh_control_dir(fabric: Fabric) -> bool:
    """Ray's ssh control sockets for the run's cluster live in a fixed place under /tmp
    (ray/autoscaler/_private/command_runner.py); remove the cluster's folder once it is empty."""
    from getpass import getuser

    digest = lambda text: hashlib.sha256(text.encode()).hexdigest()[:10]  # noqa: E731 (Ray's HASH_MAX_LENGTH)
    path = Path("/tmp") / f"ray_ssh_{digest(getuser())}" / digest(cluster_name(fabric.run_id))
    try:
        path.rmdir()
    except OSError:
        return False
    try:
        path.parent.rmdir()  # only when no other cluster's folder is left
    except OSError:
        pass
    return True


def _own_address(fabric_nodes: Sequence[dict[str, Any]]) -> str | None:
    """The fabric node whose address this network namespace holds (binding works only there)."""
    for n in fabric_nodes:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                s.bind((n["address"], 0))
            except OSError:
                continue
            return n["name"]
    return None


def start_node(temp_root: Path, extra: Sequence[str] = ()) -> int:
    """Run on a node by ray up's start commands: exec this node's recorded ``ray start``."""
    state = json.loads((temp_root / "fabric.json").read_text())
    name = _own_address(state["nodes"])
    if name is None:
        sys.stderr.write(f"testbed start-node: this host holds none of the run's addresses "
                         f"({', '.join(n['address'] for n in state['nodes'])})\n")
        return 2
    cmd = json.loads((temp_root / NODES_DIR / f"{name}.json").read_text())
    env = {**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, **cmd["env"]}
    argv = [*cmd["argv"], *extra]
    os.execvpe(argv[0], argv, env)
    return 127  # not reached


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) >= 2 and args[0] == "start-node":
        return start_node(Path(args[1]), args[2:])
    sys.stderr.write("usage: python -m testbed.cluster.rayup start-node TEMP_ROOT [ray start options]\n")
    return 2


if __name__ == "__main__":
    sys.exit(main())
