"""cluster.yaml, checked by Ray's own cluster launcher (Ray pinned: 2.60.0), and the module its
start commands call on the nodes (testbed/cluster/clusterfile.py).

* every shipped cluster file, placeholders filled with test values, passes Ray's
  ``commands._bootstrap_config`` (schema validation, the local provider's preparation);
* unfilled, it stops ``ray up`` in Ray's YAML loader within seconds, and
  ``python -m testbed.cluster.clusterfile check`` names every placeholder in one line;
* a dry ``ray up``: Ray's ``get_or_create_head_node`` with the real local provider and a
  recording process runner instead of ssh/rsync, then a worker updated as the head's
  autoscaler would; the recorded start commands then run here against a stub ``ray``, so
  each node's ``ray start`` line (address, pod resource, environment) is the one a node
  would run.

Nothing reaches beyond loopback and nothing is left behind: the local provider's state
(``RAY_TMPDIR``), Ray's config cache and bootstrap files (``tempfile.tempdir``) live in
tmp_path, ssh's control directory is not created, and the only processes started are the
test's own, all ended.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

pytest.importorskip("ray.autoscaler", reason="needs Ray (./install.sh)")

import ray  # noqa: E402
from ray.autoscaler._private import command_runner, commands  # noqa: E402
from ray.autoscaler._private.local.config import LOCAL_CLUSTER_NODE_TYPE  # noqa: E402
from ray.autoscaler._private.local.node_provider import LocalNodeProvider  # noqa: E402
from ray.autoscaler._private.updater import NodeUpdaterThread  # noqa: E402
from ray.autoscaler._private.util import prepare_config, validate_config, with_head_node_ip  # noqa: E402
from ray.autoscaler.tags import (  # noqa: E402
    NODE_KIND_WORKER,
    STATUS_UNINITIALIZED,
    TAG_RAY_NODE_KIND,
    TAG_RAY_NODE_STATUS,
    TAG_RAY_USER_NODE_TYPE,
)

from testbed.cluster import clusterfile as cf  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MOUNT = "~/pd-reliability-testbed"  # where cluster.yaml's file_mounts put the project
HEAD_IP, WORKER_IPS = "10.0.0.1", ["10.0.0.11", "10.0.0.12"]
VALUES = {  # a test value for every placeholder of the shipped files (the key's is a path in tmp_path)
    "@FILL_IN_HEAD_IP@": HEAD_IP,
    "@FILL_IN_POD0_IP@": WORKER_IPS[0],
    "@FILL_IN_POD1_IP@": WORKER_IPS[1],
    "@FILL_IN_SSH_USER@": "tester",
    "@FILL_IN_GPU_AMI@": "ami-0123456789abcdef0",
}


def test_ray_is_the_pinned_version():
    pins = re.findall(r'"ray==([0-9.]+)"', (ROOT / "pyproject.toml").read_text())
    assert pins and set(pins) == {ray.__version__} == {"2.60.0"}


def _cluster_files() -> list[Path]:
    """Every shipped Ray cluster file: a YAML file with a top-level `provider:` key."""
    candidates = sorted(ROOT.glob("*.yaml")) + sorted((ROOT / "experiments").rglob("*.yaml"))
    return [p for p in candidates if re.search(r"^provider:", p.read_text(), re.M)]


CLUSTER_FILES = _cluster_files()


def test_the_cluster_file_is_shipped():
    assert ROOT / "cluster.yaml" in CLUSTER_FILES


def _fill(text: str, key: Path) -> str:
    values = VALUES | {"@FILL_IN_SSH_PRIVATE_KEY@": str(key)}
    out = cf.PLACEHOLDER.sub(lambda m: values[m.group(0)], text)
    assert not cf.PLACEHOLDER.search(out)
    return out


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """Ray's launcher confined to tmp_path: provider state, config cache, bootstrap files."""
    monkeypatch.setenv("RAY_UP_enable_autoscaler_v2", "0")
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "raytmp"))  # LocalNodeProvider's cluster-<name>.state/.lock
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # ray-config-<hash>, ray-bootstrap-*
    # ssh never runs; don't create its control directory (/tmp/ray_ssh_*, fixed by Ray)
    monkeypatch.setattr(command_runner.SSHCommandRunner, "_ensure_ssh_control_path", lambda self: None)
    key = tmp_path / "id_test"
    key.write_text("not a key\n")
    return tmp_path, key


# -- (a) every shipped cluster file, filled in, passes Ray's own bootstrap

@pytest.mark.parametrize("path", CLUSTER_FILES, ids=lambda p: p.name)
def test_filled_cluster_file_passes_rays_bootstrap(path, sandbox):
    tmp_path, key = sandbox
    config = yaml.safe_load(_fill(path.read_text(), key))
    resolved = commands._bootstrap_config(config)  # prepare_local, the schema, bootstrap_local; caches in tmp
    assert list((tmp_path / "tmp").glob("ray-config-*")), "Ray's config cache went elsewhere"
    n = len(config["provider"]["worker_ips"])
    node_type = resolved["available_node_types"][LOCAL_CLUSTER_NODE_TYPE]
    assert resolved["head_node_type"] == LOCAL_CLUSTER_NODE_TYPE
    assert node_type["min_workers"] == node_type["max_workers"] == resolved["max_workers"] == n  # every pod kept
    commands_run = [c for k in ("initialization_commands", "setup_commands", "head_setup_commands",
                                "worker_setup_commands", "head_start_ray_commands", "worker_start_ray_commands")
                    for c in resolved[k]]
    assert not [c for c in commands_run if re.search(r"\bray stop\b", c)], "ray stop kills every Ray on a node"
    assert any("install.sh --gpu" in c for c in resolved["setup_commands"])
    assert any("ray start" in c and "--autoscaling-config" in c for c in resolved["head_start_ray_commands"])
    # the project is mounted from where `ray up` runs, and the start commands read cluster.yaml there
    assert resolved["file_mounts"] == {MOUNT: "."}
    assert all(f"cd {MOUNT}" in c for c in resolved["head_start_ray_commands"] + resolved["worker_start_ray_commands"])


def test_cloud_variant_in_comments_passes_rays_schema(sandbox):
    """The commented AWS variant, uncommented into the filled file, validates against Ray's
    schema (Ray's AWS bootstrap itself needs credentials: not run)."""
    _, key = sandbox
    text = (ROOT / "cluster.yaml").read_text()
    block = text.split("# --- Cloud variant", 1)[1].split("\n", 1)[1]
    body = "\n".join(line[2:] if line.startswith("# ") else line[1:] for line in block.splitlines()
                     if line.startswith("#") and re.match(r"#( [a-z_]+:| {2,}|$)", line))
    variant = yaml.safe_load(_fill(body, key))
    assert variant["provider"]["type"] == "aws"
    config = yaml.safe_load(_fill(text, key))
    config.update(variant)
    prepared = prepare_config(config)
    validate_config(prepared)
    pods = {k: v for k, v in prepared["available_node_types"].items() if k != prepared["head_node_type"]}
    assert {k: v["resources"] for k, v in pods.items()} == {cf.pod_name(i): {cf.pod_name(i): 1} for i in range(2)}
    assert all(v["min_workers"] == v["max_workers"] == 1 for v in pods.values())


# -- (b) unfilled: a fast, clear error

def test_every_placeholder_has_a_test_value():
    _, found = cf.parse((ROOT / "cluster.yaml").read_text())
    assert {p.placeholder for p in found} | {"@FILL_IN_GPU_AMI@"} == set(VALUES) | {"@FILL_IN_SSH_PRIVATE_KEY@"}


def test_unfilled_file_gives_one_line_error():
    with pytest.raises(cf.ClusterFileError) as e:
        cf.load(ROOT / "cluster.yaml")
    msg = str(e.value)
    assert "\n" not in msg
    for field, placeholder in [("provider.head_ip", "@FILL_IN_HEAD_IP@"),
                               ("provider.worker_ips[0]", "@FILL_IN_POD0_IP@"),
                               ("provider.worker_ips[1]", "@FILL_IN_POD1_IP@"),
                               ("auth.ssh_user", "@FILL_IN_SSH_USER@"),
                               ("auth.ssh_private_key", "@FILL_IN_SSH_PRIVATE_KEY@")]:
        assert f"{field} ({placeholder})" in msg
    r = subprocess.run([sys.executable, "-m", "testbed.cluster.clusterfile", "check", str(ROOT / "cluster.yaml")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and "provider.head_ip (@FILL_IN_HEAD_IP@)" in r.stderr


def test_each_placeholder_alone_stops_rays_loader(tmp_path):
    """However many are filled, one left makes the file invalid YAML at its own line, so
    Ray's loader (``yaml.safe_load``, as in ``create_or_update_cluster``) stops there."""
    text = (ROOT / "cluster.yaml").read_text()
    for placeholder in re.findall(r"^[^#\n]*?(@FILL_IN_\w+@)", text, re.M):
        values = VALUES | {"@FILL_IN_SSH_PRIVATE_KEY@": str(tmp_path / "key")}
        one_left = cf.PLACEHOLDER.sub(lambda m: m.group(0) if m.group(0) == placeholder else values[m.group(0)], text)
        with pytest.raises(yaml.scanner.ScannerError) as e:
            yaml.safe_load(one_left)
        assert placeholder in one_left.splitlines()[e.value.problem_mark.line]
        with pytest.raises(cf.ClusterFileError, match=re.escape(placeholder)):
            cf.check(*cf.parse(one_left))


def test_ray_up_with_placeholders_fails_fast(tmp_path):
    """The real `ray up`: fails within seconds, naming the line, before any provider state or ssh."""
    env = os.environ | {"RAY_UP_enable_autoscaler_v2": "0", "RAY_TMPDIR": str(tmp_path / "raytmp"),
                        "TMPDIR": str(tmp_path), "RAY_USAGE_STATS_ENABLED": "0"}
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "up", "-y", str(ROOT / "cluster.yaml")],
                       capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    elapsed = time.monotonic() - t0
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert elapsed < 30, f"ray up took {elapsed:.0f} s to fail"
    assert "Cluster config invalid" in out and "head_ip: @FILL_IN_HEAD_IP@" in out, out
    assert not (tmp_path / "raytmp").exists()  # stopped before the local provider wrote its state


# -- (c) a dry `ray up`

class RecordingRunner:
    """Stands in for the ``subprocess`` module that Ray's command runners call: records each
    command (ssh, rsync) and succeeds. Keeps the content of files rsync'd from this machine."""

    DEVNULL = subprocess.DEVNULL

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.files: dict[str, str] = {}

    def check_call(self, cmd, **kwargs):
        self.calls.append(list(cmd))
        if cmd[0] == "rsync" and os.path.isfile(cmd[-2]):
            self.files[cmd[-1]] = Path(cmd[-2]).read_text()
        return 0

    def check_output(self, cmd, **kwargs):
        self.calls.append(list(cmd))
        return b""

    def shell_commands(self) -> list[str]:
        """The shell command of each ssh call, as the node's bash gets it (the ssh target's
        ``bash --login -c -i '<this>'``)."""
        return [shlex.split(c[-1])[0] for c in self.calls if c[0] == "ssh"]

    def rsyncs(self) -> list[list[str]]:
        return [c for c in self.calls if c[0] == "rsync"]


def _inner(shell_command: str) -> str:
    """The command itself, without Ray's ``source ~/.bashrc; export ... && ( ... )`` wrapping."""
    m = re.fullmatch(r"source ~/\.bashrc; export OMP_NUM_THREADS=1 PYTHONWARNINGS=ignore && \((.*)\)", shell_command,
                     re.S)
    assert m, shell_command
    return m.group(1)


@pytest.fixture
def node_home(tmp_path):
    """A node's home: the project mounted at ~/pd-reliability-testbed (the filled cluster.yaml,
    the package), a stub `ray` that records its arguments and environment, `python` = this one."""
    home = tmp_path / "home"
    proj = tmp_path / "proj"  # what `ray up` runs in: the repository root
    home.mkdir()
    proj.mkdir()
    (home / ".bashrc").write_text("")
    (home / "pd-reliability-testbed").symlink_to(proj)
    (proj / "testbed").symlink_to(ROOT / "testbed")
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "python").symlink_to(sys.executable)
    (bin_ / "ray").write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        "with open(os.environ['RAY_STUB_LOG'], 'a') as f:\n"
        "    f.write(json.dumps({'argv': sys.argv[1:], 'env': {k: v for k, v in os.environ.items()\n"
        "                        if k.startswith(('RAY_', 'TESTBED_'))}}) + '\\n')\n")
    (bin_ / "ray").chmod(0o755)
    return home, proj, bin_


def _run_on_node(shell_command: str, node_ip: str, home: Path, bin_: Path, log: Path) -> list[dict]:
    """Run a recorded command as the node's shell would (minus the login shell's profile),
    with this node's address given, and return what the stub `ray` was called with."""
    env = {"HOME": str(home), "PATH": f"{bin_}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(ROOT),
           cf.NODE_IP_ENV: node_ip, "RAY_STUB_LOG": str(log)}
    r = subprocess.run(["bash", "-c", shell_command], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _node_env_expected() -> dict[str, str]:
    """The Ray settings every emulated node runs with, which the real nodes must share."""
    pytest.importorskip("pyroute2", reason="testbed needs pyroute2 (./install.sh)")
    from testbed.cluster.raynodes import NODE_ENV

    return {k: v for k, v in NODE_ENV.items() if k != "RAY_USAGE_STATS_ENABLED"}  # that one: --disable-usage-stats


def test_the_emulated_nodes_get_only_what_a_real_nodes_start_command_gives_them(tmp_path, monkeypatch):
    """The emulated cluster's ray_up launcher records for each node's `ray start` cluster.yaml's
    settings (NODE_ENV, autoscaler v1 on the head) and its own housekeeping, nothing of the
    process that planned it: what that process has (UCX or vLLM settings, anything) would reach
    the engines on the emulated nodes and never on a real one."""
    pytest.importorskip("pyroute2", reason="testbed needs pyroute2 (./install.sh)")
    if os.geteuid() != 0:
        pytest.skip("the netns mode needs root")
    from testbed.cluster import rayup
    from testbed.cluster.emulated import EmulatedCluster
    from testbed.cluster.raynodes import HEAD_ONLY_ENV, HOUSEKEEPING_ENV, NODE_ENV

    if why := rayup.missing_tools():
        pytest.skip(why)
    for k, v in {"UCX_TLS": "rc", "UCX_TCP_PORT_RANGE": "20480-20735", "VLLM_HOST_IP": "10.0.0.9",
                 "TESTBED_ONLY_HERE": "1"}.items():
        monkeypatch.setenv(k, v)
    import tempfile

    allowed = set(NODE_ENV) | set(HEAD_ONLY_ENV) | set(HOUSEKEEPING_ENV)
    with tempfile.TemporaryDirectory(prefix="tbenv") as short:  # Ray's socket paths limit the temp root's length
        c = EmulatedCluster(2, tmp_path / "state", run_id="envcheck01", mode="netns", launcher="ray_up",
                            temp_root=Path(short) / "u")
        for name in ("head", "pod0", "pod1"):
            env = c._node_env(name)
            assert set(env) <= allowed, sorted(set(env) - allowed)
            assert NODE_ENV.items() <= env.items()
            assert (HEAD_ONLY_ENV.items() <= env.items()) == (name == "head")
        # the direct launcher, a process of this machine, inherits this one's environment
        direct = EmulatedCluster(2, tmp_path / "state", run_id="envcheck02", mode="netns", launcher="direct",
                                 temp_root=Path(short) / "d")._node_env("pod0")
    assert direct["TESTBED_ONLY_HERE"] == "1" and direct["UCX_TLS"] == "tcp"


@pytest.mark.parametrize("launcher_v2", ["0", "1"], ids=["autoscaler-v1", "autoscaler-v2-launcher"])
def test_dry_ray_up(sandbox, node_home, monkeypatch, launcher_v2):
    tmp_path, key = sandbox
    home, proj, bin_ = node_home
    monkeypatch.setenv("RAY_UP_enable_autoscaler_v2", launcher_v2)
    text = _fill((ROOT / "cluster.yaml").read_text(), key)
    (proj / "cluster.yaml").write_text(text)
    shipped = yaml.safe_load(text)
    monkeypatch.chdir(proj)  # `ray up` runs in the repository root

    # -- the head, as `ray up` sets it up: Ray's own code from _bootstrap_config on
    config = commands._bootstrap_config(yaml.safe_load(text), no_config_cache=True)
    provider = LocalNodeProvider(config["provider"], config["cluster_name"])
    assert (tmp_path / "raytmp" / "ray" / f"cluster-{config['cluster_name']}.state").is_file()
    head = RecordingRunner()
    commands.get_or_create_head_node(config, "cluster.yaml", no_restart=False, restart_only=False, yes=True,
                                     override_cluster_name=None, _provider=provider, _runner=head)
    assert provider.non_terminated_nodes({}) == [HEAD_IP]
    assert all(f"tester@{HEAD_IP}" in " ".join(c) for c in head.calls)

    # file mounts: the project from the current directory, filtered; the bootstrap config and key
    rsyncs = {c[-1]: c for c in head.rsyncs()}
    project = rsyncs[f"tester@{HEAD_IP}:{MOUNT}/"]
    assert project[-2] == "./"
    assert project[project.index("--exclude") + 1] == ".git"
    assert project[project.index("--filter") + 1] == "dir-merge,- .gitignore"
    assert rsyncs[f"tester@{HEAD_IP}:~/ray_bootstrap_key.pem"][-2] == str(key)
    bootstrap = json.loads(head.files[f"tester@{HEAD_IP}:~/ray_bootstrap_config.yaml"])

    # then the setup commands, then the head's start command, each in the project's copy
    inner = [_inner(c) for c in head.shell_commands()]
    assert inner[0] == "uptime"
    setup = [c for c in inner if c in shipped["setup_commands"]]
    assert setup == shipped["setup_commands"]
    assert "cd ~/pd-reliability-testbed && bash install.sh --gpu" in setup
    start = head.shell_commands()[-1]
    assert shipped["head_start_ray_commands"][0] in start

    # run it (stub `ray`): Ray starts on the head's listed address with the head's resource, autoscaler v1
    calls = _run_on_node(start, HEAD_IP, home, bin_, tmp_path / "head.jsonl")
    assert [c["argv"] for c in calls] == [["start", "--head", "--port=6379", f"--node-ip-address={HEAD_IP}",
                                           '--resources={"head": 1}',
                                           "--autoscaling-config=~/ray_bootstrap_config.yaml",
                                           "--disable-usage-stats"]]
    env = calls[0]["env"]
    assert env["RAY_enable_autoscaler_v2"] == "0"  # even when the launcher asked for v2
    from testbed.cluster.raynodes import HEAD_ONLY_ENV

    assert HEAD_ONLY_ENV.items() <= env.items()  # what the emulated head gets too
    assert Path(env[cf.MARKER_ENV]).resolve() == (proj / "cluster.yaml").resolve()
    assert _node_env_expected().items() <= env.items()

    # -- each worker, as the head's autoscaler (v1) sets it up from ~/ray_bootstrap_config.yaml
    monkeypatch.setenv("HOME", str(home))  # we are the head now: its ~ holds the project and the key
    head_config = prepare_config(bootstrap)
    validate_config(head_config)
    head_provider = LocalNodeProvider(head_config["provider"], head_config["cluster_name"])
    head_provider.create_node({}, {TAG_RAY_NODE_KIND: NODE_KIND_WORKER, TAG_RAY_USER_NODE_TYPE: LOCAL_CLUSTER_NODE_TYPE,
                                   TAG_RAY_NODE_STATUS: STATUS_UNINITIALIZED}, len(WORKER_IPS))
    for pod, ip in enumerate(WORKER_IPS):
        worker = RecordingRunner()
        head_ip = head_provider.internal_ip(HEAD_IP)
        # the arguments of StandardAutoscaler.spawn_updater (Ray 2.60), for a first update
        updater = NodeUpdaterThread(
            node_id=ip, provider_config=head_config["provider"], provider=head_provider,
            auth_config=head_config["auth"], cluster_name=head_config["cluster_name"],
            file_mounts=head_config["file_mounts"],
            initialization_commands=with_head_node_ip(head_config["initialization_commands"], head_ip),
            setup_commands=with_head_node_ip(head_config["worker_setup_commands"], head_ip),
            ray_start_commands=with_head_node_ip(head_config["worker_start_ray_commands"], head_ip),
            runtime_hash="test-runtime-hash", file_mounts_contents_hash="test-contents-hash", is_head_node=False,
            cluster_synced_files=head_config["cluster_synced_files"],
            rsync_options={"rsync_exclude": head_config.get("rsync_exclude"),
                           "rsync_filter": head_config.get("rsync_filter")},
            process_runner=worker, use_internal_ip=True, docker_config=head_config.get("docker"),
            node_resources={}, node_labels={})
        updater.start()
        updater.join()
        assert updater.exitcode == 0
        assert all(f"@{ip}" in " ".join(c) for c in worker.calls)
        (sync,) = [c for c in worker.rsyncs() if c[-1] == f"tester@{ip}:{MOUNT}/"]
        assert sync[-2] == f"{home}/pd-reliability-testbed/"  # the head's copy, onwards
        inner = [_inner(c) for c in worker.shell_commands()]
        assert [c.split("; ", 1)[1] for c in inner if c.split("; ", 1)[-1] in shipped["setup_commands"]] \
            == shipped["setup_commands"]
        calls = _run_on_node(worker.shell_commands()[-1], ip, home, bin_, tmp_path / f"pod{pod}.jsonl")
        assert [c["argv"] for c in calls] == [["start", f"--address={HEAD_IP}:6379", f"--node-ip-address={ip}",
                                               f'--resources={{"pod{pod}": 1}}', "--disable-usage-stats"]]
        assert _node_env_expected().items() <= calls[0]["env"].items()
        assert Path(calls[0]["env"][cf.MARKER_ENV]).resolve() == (proj / "cluster.yaml").resolve()


# -- the module the start commands call

@pytest.fixture
def filled(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text(_fill((ROOT / "cluster.yaml").read_text(), tmp_path / "key"))
    return path


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != cf.NODE_IP_ENV}
    return subprocess.run([sys.executable, "-m", "testbed.cluster.clusterfile", *args], capture_output=True, text=True,
                          timeout=60, env=env)


def test_node_resources_per_address(filled):
    for pod, ip in enumerate(WORKER_IPS):
        r = _cli("node-resources", str(filled), "--ip", ip)
        assert r.returncode == 0 and json.loads(r.stdout) == {f"pod{pod}": 1}
    r = _cli("node-resources", str(filled), "--ip", HEAD_IP)
    assert r.returncode == 0 and json.loads(r.stdout) == {"head": 1}
    r = _cli("node-ip", str(filled), "--ip", WORKER_IPS[1])
    assert r.returncode == 0 and r.stdout.strip() == WORKER_IPS[1]
    r = _cli("node-resources", str(filled), "--ip", "10.0.0.99")
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1
    assert "10.0.0.99" in r.stderr and "provider.worker_ips" in r.stderr
    r = _cli("check", str(filled))
    assert r.returncode == 0 and "pod0, pod1" in r.stdout


def test_resource_names_are_the_runtimes():
    netns = pytest.importorskip("testbed.machine.netns", reason="needs pyroute2 (./install.sh)")
    assert cf.HEAD == netns.HEAD
    assert [cf.pod_name(i) for i in range(4)] == [netns.pod_name(i) for i in range(4)]


def _config(head: str, workers: list[str]) -> dict:
    config = {"provider": {"type": "local", "head_ip": head, "worker_ips": workers}}
    cf.check(config)
    return config


def test_this_node_by_route_interfaces_and_names(monkeypatch):
    monkeypatch.delenv(cf.NODE_IP_ENV, raising=False)
    # found by itself: the route to a loopback head leaves from 127.0.0.1
    assert cf.this_node(_config("127.0.0.1", ["10.0.0.11"])).name == "head"
    # found among its interfaces' addresses (lo is one) when the route says nothing
    assert cf.this_node(_config("10.0.0.1", ["10.0.0.11", "127.0.0.1"])).resources == {"pod1": 1}
    # host names resolve as Ray's local provider resolves them
    node = cf.this_node(_config("10.0.0.1", ["10.0.0.11", "localhost"]), ip="127.0.0.1")
    assert (node.name, node.entry, node.address) == ("pod1", "localhost", "127.0.0.1")
    monkeypatch.setenv(cf.NODE_IP_ENV, "10.0.0.11")
    assert cf.this_node(_config("10.0.0.1", ["10.0.0.11", "10.0.0.12"])).name == "pod0"
    with pytest.raises(cf.ClusterFileError, match="more than once"):
        cf.this_node(_config("10.0.0.1", ["10.0.0.11", "localhost", "127.0.0.1"]), ip="127.0.0.1")


@pytest.mark.parametrize("head,workers,match", [
    ("10.0.0.1", [], "worker_ips"),
    ("10.0.0.1", ["10.0.0.1"], "is the head"),
    ("10.0.0.1", ["10.0.0.2", "10.0.0.2"], "listed twice"),
    ("", ["10.0.0.2"], "head_ip"),
])
def test_bad_node_lists(head, workers, match):
    with pytest.raises(cf.ClusterFileError, match=match):
        _config(head, workers)


def test_stop_ray_stops_only_this_files_ray(tmp_path):
    mine, other = tmp_path / "cluster.yaml", tmp_path / "other.yaml"
    procs = []
    try:
        for marker in (str(mine), str(other), None):
            env = {k: v for k, v in os.environ.items() if k != cf.MARKER_ENV}
            if marker:
                env[cf.MARKER_ENV] = marker
            procs.append(subprocess.Popen(["sleep", "60"], env=env))
        deadline = time.monotonic() + 10
        while cf.ray_processes(mine) != [procs[0].pid] and time.monotonic() < deadline:
            time.sleep(0.05)  # until the exec'd sleep shows its environment
        assert cf.ray_processes(mine) == [procs[0].pid]
        assert cf.stop_ray(mine, timeout_s=5) == [procs[0].pid]
        assert procs[0].wait(timeout=5) == -signal.SIGTERM
        assert procs[1].poll() is None and procs[2].poll() is None
        assert cf.stop_ray(mine) == []
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


# -- the emulated cluster's generated file (testbed/cluster/rayup.py) goes through the same code

def test_the_emulated_clusters_generated_file_passes_rays_bootstrap(sandbox):
    from testbed.cluster import rayup
    from testbed.machine.netns import Fabric

    tmp_path, _ = sandbox
    fabric = Fabric.plan("ab12cd34", 3)
    (tmp_path / "ssh").mkdir()
    (tmp_path / rayup.KEY).write_text("not a key\n")
    config = yaml.safe_load(rayup.write_cluster_file(fabric, tmp_path).read_text())
    resolved = commands._bootstrap_config(config)
    assert resolved["provider"]["head_ip"] == fabric.head.address
    assert resolved["provider"]["worker_ips"] == [p.address for p in fabric.pods]
    node_type = resolved["available_node_types"][LOCAL_CLUSTER_NODE_TYPE]
    assert node_type["min_workers"] == node_type["max_workers"] == 3
    starts = resolved["head_start_ray_commands"] + resolved["worker_start_ray_commands"]
    assert all("testbed.cluster.rayup start-node" in c for c in starts)
    assert not [c for c in starts if re.search(r"\bray stop\b", c)]


def test_a_node_runs_the_start_command_recorded_for_its_own_address(tmp_path):
    """start-node picks the node by the address this namespace holds: 127.0.0.1 stands in for it."""
    from testbed.cluster import rayup

    (tmp_path / "fabric.json").write_text(json.dumps({"run_id": "x", "nodes": [
        {"name": "head", "address": "10.255.255.1"}, {"name": "pod0", "address": "127.0.0.1"}]}))
    out = tmp_path / "out.json"
    rayup.write_node_commands(tmp_path, {
        "head": ([sys.executable, "-c", "raise SystemExit(3)"], {}),
        "pod0": ([sys.executable, "-c", "import json, os, sys; json.dump([sys.argv[1:], os.environ['X'], "
                  "os.environ.get('HOME')], open(os.environ['OUT'], 'w'))"], {"X": "pod0", "OUT": str(out),
                                                                                   "HOME": "/planner/home"})})
    assert oct((tmp_path / "nodes" / "pod0.json").stat().st_mode & 0o777) == "0o600"
    r = subprocess.run([sys.executable, "-m", "testbed.cluster.rayup", "start-node", str(tmp_path), "--extra=1"],
                       env={**os.environ, "HOME": "/session/home"}, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    # the node's own argv and environment, the session's HOME (Ray expands ~ with it)
    assert json.loads(out.read_text()) == [["--extra=1"], "pod0", "/session/home"]


def test_down_removes_only_this_runs_bootstrap_files(tmp_path):
    from testbed.cluster import rayup
    from testbed.machine.netns import Fabric

    fabric, home = Fabric.plan("ab12cd34", 1), tmp_path / "home"
    home.mkdir()
    (tmp_path / "ssh").mkdir()
    (tmp_path / rayup.KEY).write_text("run key\n")
    (home / "ray_bootstrap_config.yaml").write_text(json.dumps({"cluster_name": "tb-other"}))
    (home / "ray_bootstrap_key.pem").write_text("another key\n")
    assert rayup.remove_bootstrap_files(fabric, tmp_path, home) == []
    (home / "ray_bootstrap_config.yaml").write_text(json.dumps({"cluster_name": "tb-ab12cd34"}))
    (home / "ray_bootstrap_key.pem").write_text("run key\n")
    assert len(rayup.remove_bootstrap_files(fabric, tmp_path, home)) == 2 and not list(home.iterdir())


def test_sshds_privilege_separation_directory_is_made_when_missing(tmp_path):
    """A fresh container: openssh-server installed, its service never started, so the directory
    its start script makes at boot is missing and every node's sshd would exit at once."""
    from testbed.cluster import rayup

    d = tmp_path / "run" / "sshd"
    assert rayup.ensure_privsep_dir(d) is True
    assert d.is_dir() and (d.stat().st_mode & 0o777) == 0o755
    assert rayup.ensure_privsep_dir(d) is False  # there already: left as it is


def test_provider_pods_put_pods_on_the_head_and_several_on_one_node(sandbox):
    """provider.pods places pod i on the node listed i-th: the head may hold a pod, a node of
    several GPUs several; Ray's own bootstrap takes the key; a pod on no listed node is refused."""
    tmp_path, key = sandbox
    config = yaml.safe_load(_fill((ROOT / "cluster.yaml").read_text(), key))
    config["provider"]["pods"] = [HEAD_IP, WORKER_IPS[0], WORKER_IPS[0], WORKER_IPS[1]]
    commands._bootstrap_config(config)  # Ray's schema and local provider accept it
    cf.check(config)
    by_ip = {n.address: n for n in cf.nodes(config)}
    assert by_ip[HEAD_IP].resources == {"head": 1, "pod0": 1}
    assert by_ip[WORKER_IPS[0]].resources == {"pod1": 1, "pod2": 1} and by_ip[WORKER_IPS[0]].name == "node0"
    assert by_ip[WORKER_IPS[1]].resources == {"pod3": 1} and by_ip[WORKER_IPS[1]].name == "pod3"
    # one machine of several GPUs: the head alone, holding every pod
    alone = {"provider": {"type": "local", "head_ip": HEAD_IP, "worker_ips": [], "pods": [HEAD_IP, HEAD_IP]}}
    cf.check(alone)
    assert cf.this_node(alone, ip=HEAD_IP).resources == {"head": 1, "pod0": 1, "pod1": 1}
    with pytest.raises(cf.ClusterFileError, match=r"provider.pods\[1\] \(10.9.9.9\) is neither"):
        cf.check({"provider": {**config["provider"], "pods": [HEAD_IP, "10.9.9.9"]}})
    with pytest.raises(cf.ClusterFileError, match="provider.pods: expected a list"):
        cf.check({"provider": {**config["provider"], "pods": []}})
