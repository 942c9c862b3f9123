"""The shared cluster itself, end to end (tests/e2e_cluster.py): reached by its address like a
real one, a run with a link down SIGKILLed mid-run, engines killed mid-run, and nothing left
behind once `testbed cluster down` has run. Slow."""

import json

import pytest

pytest.importorskip("vllm", reason="vLLM's CPU build is not installed (the README's install command installs it)")
pytest.importorskip("ray", reason="Ray is not installed (the README's install command installs it)")

from core.records import read_meta, read_table  # noqa: E402
from e2e_cluster import HEAD_POD, KILL_FAULT_S  # noqa: E402
from e2e_death import DEATH_REPEAT, DEATH_REQUESTS  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.e2e]  # the shared cluster (tests/e2e_cluster.py)


def test_the_cluster_is_reached_by_its_address_like_a_real_one(testbed_runs):
    """ray up brought it up; status shows its nodes and pods; a spec bigger than it is refused in one
    line naming what was found; faults clear acts on every node and is idempotent."""
    out, _, _, _, cli = testbed_runs
    status = " ".join(cli["status"].stdout.split())
    assert cli["status"].returncode == 0, cli["status"].stderr
    for pod in ("pod0", "pod1", "pod2", "pod3", f"pod{HEAD_POD}"):
        assert pod in status
    assert "eth0" in status
    too_big = cli["too_big"]
    assert too_big.returncode != 0
    assert (f"topology: {HEAD_POD + 2} pods, but the cluster's alive nodes have pod0@" in too_big.stderr
            and f"missing pod{HEAD_POD + 1}" in too_big.stderr), too_big.stderr
    assert not (out / "too_big").exists() or not list((out / "too_big").rglob("requests.parquet"))
    for key in ("clear", "clear_again"):
        assert cli[key].returncode == 0, cli[key].stdout + cli[key].stderr
        assert len([l for l in cli[key].stdout.splitlines() if l.startswith("10.")]) == 5  # head + 4 pods
    meta = json.loads((out / "e2e_policies" / "testbed.json").read_text())
    assert meta["mode"] == "cluster" and meta["kv_path"]["crossed"], meta.get("kv_path")


def test_the_nodes_ray_up_started_run_with_a_real_nodes_environment_only(testbed_runs):
    """Every node's raylet has what cluster.yaml's start commands give a real node and the ssh
    session's environment, nothing of the process that planned the cluster and no UCX setting:
    the engines that served every job here set their KV transport themselves, as on a real node."""
    from e2e_cluster import PLANNER_ONLY_ENV
    from testbed.cluster.raynodes import NODE_ENV

    envs = testbed_runs[4]["node_env"]
    assert len(envs) == 5, envs.keys()  # head + 4 pods
    for env in envs.values():
        assert PLANNER_ONLY_ENV not in env
        assert not [k for k in env if k.startswith(("UCX_", "VLLM_", "NIXL_"))], sorted(env)
        assert NODE_ENV.items() <= env.items()
        assert "SSH_CONNECTION" in env  # started by the ssh session `ray up` opened, as on a real node


def test_a_kv_only_fault_throttles_the_kv_path_and_leaves_rays_own_traffic_at_its_rate(testbed_runs):
    """On pod 0's uplink (tests/kv_isolation_probe.py): a kv_only fault brings a stream on a KV port
    down to the fault's rate while Ray's fetch of an object from pod 0 keeps its time; the same fault
    on the whole link slows that fetch to the fault's rate (the control: the measurement sees it)."""
    iso = testbed_runs[4]["kv_isolation"]
    assert iso["rc"] == 0 and iso["result"], iso["stderr"]
    r = iso["result"]
    fault, bits = r["fault_bps"], r["blob_bytes"] * 8
    assert r["none"]["kv_bps"] > 10 * fault, r  # unfaulted, the KV port runs far above the fault's rate
    assert r["kv_only"]["kv_bps"] < 1.5 * fault, r  # the KV path is throttled to it
    assert r["whole"]["kv_bps"] < 1.5 * fault, r
    # Ray's fetch under kv_only: far above the fault's rate, within a few times its own unfaulted time
    assert r["kv_only"]["ray_bps"] > 10 * fault, r
    assert min(r["kv_only"]["ray_fetch_s"]) < 4 * max(r["none"]["ray_fetch_s"]) + 0.05, r
    # and the control: the whole link at the fault's rate holds the fetch to about that rate
    assert r["whole"]["ray_fetch_s"][0] > 0.5 * bits / fault, r


def test_the_twin_runs_on_the_cluster_by_its_address_and_its_records_come_back(testbed_runs):
    """`testbed twin SPEC --address` on the cluster `ray up` started: the testbed's side (and its
    repeat) on the cluster's pods, the simulator's, the comparison; then `ray rsync-down` on the
    cluster file brings the run directories from the head as docs/cluster.md says."""
    import pandas as pd

    from e2e_cluster import TWIN_DIR, TWIN_SPEC

    out, *_, cli = testbed_runs
    twin = cli["twin"]
    assert twin.returncode == 0, twin.stdout[-3000:] + twin.stderr[-3000:]
    root = out / TWIN_DIR
    tb = root / "testbed" / TWIN_SPEC / "LC" / "seed-0"
    for d in (tb, root / "testbed-repeat" / TWIN_SPEC / "LC" / "seed-0", root / "sim" / TWIN_SPEC / "LC" / "seed-0"):
        assert read_meta(d)["status"] == "finished", d
        assert len(read_table(d, "requests")) == 8, d
    assert json.loads((root / "testbed" / TWIN_SPEC / "testbed.json").read_text())["mode"] == "cluster"
    checks = pd.read_csv(root / "fidelity" / "fidelity.csv")
    assert len(checks) and set(checks.verdict) <= {"pass", "fail", "undecided"}, checks
    back = cli["rsync_down"]
    assert back.returncode == 0, back.stdout[-2000:] + back.stderr[-2000:]
    copied = out / f"{TWIN_DIR}-back" / "testbed" / TWIN_SPEC / "LC" / "seed-0"
    assert read_table(copied, "requests").equals(read_table(tb, "requests"))
    assert read_meta(copied) == read_meta(tb)


def test_a_link_down_on_the_testbed_stalls_every_pull_across_it(testbed_runs):
    """residual_bw 0 (kv_only) on pod 0: not one request whose KV leaves pod 0 gets a first
    token, while pulls from the other prefill pod go on. How they fail differs from the
    simulator's dead link: the first pulls hang until their deadline (timeouts in kv_transfer),
    then UCX gives the connection up and later pulls fail at once (NIXL's failed transfers,
    errors); see the session note."""
    *_, cli = testbed_runs
    d = cli["killed"]["run_dir"]
    req = read_table(d, "requests")
    faults = read_table(d, "faults")
    applied_s = faults[(faults.event == "apply") & (faults.kind == "link")].time_s.min()
    link = faults[(faults.event == "apply") & (faults.kind == "link")]
    assert (link.severity == 0.0).all() and (link.measured_bps == 0.0).all(), link  # the probe got nothing through
    across = req[(req.prefill_pod == 0) & (req.kv_start_s > applied_s)]
    assert len(across) > 0, req
    assert across.first_token_s.isna().all() and (across.outcome != "ok").all(), across  # not one got through
    assert set(across.outcome) <= {"timeout", "error"}
    timed_out = across[across.outcome == "timeout"]
    assert len(timed_out) > 0
    # a pull that hung (timeout) or that NIXL gave up on (error): either way it failed in kv_transfer
    assert (across.failed_stage == "kv_transfer").all(), across
    elsewhere = req[(req.prefill_pod != 0) & (req.outcome == "ok")]
    assert len(elsewhere) > 0, req


def test_a_pod_on_the_heads_node_is_probed_over_its_own_interface_from_another_node(testbed_runs):
    """tests/head_pod_probe.py: the probe of the pod on the head comes from another pod's node through
    the head's eth0 (not from the head's own agent, over loopback) and reads the kv_only limit set
    there, both directions at once; with every pod faulted no node can measure: one line."""
    res = testbed_runs[4]["head_pod"]
    assert res["rc"] == 0, res["stderr"]
    out = res["result"]
    path = out["path"]
    assert path["pod_ip"] == out["head_ip"] and path["peer"] >= 0 and path["peer_ip"] != out["head_ip"], out
    for side, factor in zip(("uplink", "downlink"), out["factor"]):
        assert abs(factor / out["r"] - 1) < 0.10, (side, out)  # the load crossed what the fault shaped
    refused = out["refused"]
    assert "\n" not in refused and refused.startswith("pod0's link fault cannot be measured"), refused
    assert "head's node carries a link fault of the run" in refused, refused


def test_doctor_passes_on_every_node_of_the_cluster_ray_up_started(testbed_runs):
    """`testbed doctor --address`: the preflight runs in the head's namespace, a task on every node; on
    the default emulated cluster every check passes or does not apply, and each pod's node finds the
    cgroups a compute fault needs (inside the namespace shim) and moves KV over UCX tcp on eth0."""
    doctor = testbed_runs[4]["doctor"]
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    text = doctor.stdout
    assert "0 FAIL: the testbed can run here" in " ".join(text.split()), text
    nodes = text.split("\nnode ")[1:]
    pods = [n for n in nodes if "; pod" in n.splitlines()[0]]
    assert len(nodes) == 5 and len(pods) == 4, text
    for node in pods:
        lines = {line.split()[1]: line.split()[0] for line in node.splitlines()[1:] if line.startswith("  ")}
        assert lines.get("cgroups") == "ok" and lines.get("interfaces") == "ok", node
        assert "tcp/eth0" in node, node


def test_a_killed_driver_leaves_its_faults_to_their_ttl_and_nothing_after_cluster_down(testbed_runs):
    """SIGKILLed mid-run: the run directory keeps what was flushed (status still "running": nobody
    closed it), the agents still hold the faults (the cluster is up), their time to live removes
    them, and `testbed cluster down` leaves nothing at all, by the project's own inventory."""
    *_, cli = testbed_runs
    k = cli["killed"]
    assert read_meta(k["run_dir"])["status"] == "running"
    # the driver was killed before the faults' end (it would have cleared them itself), and the look
    # came before their time to live could end: the run's clock starts at or after started_at
    assert k["killed_after_start_s"] < KILL_FAULT_S, k["killed_after_start_s"]
    assert k["looked_after_start_s"] < k["ttl_end_after_start_s"], k
    # the kept engines outlive the driver that used them, each the same process
    assert k["engines_before_kill"] and k["engines_after_kill"] == k["engines_before_kill"], k
    right_after = "\n".join(k["right_after"])
    assert "qdisc" in right_after and "cgroup" in right_after, right_after  # held by the live agents
    assert not [x for x in k["after_ttl"] if x.startswith(("qdisc", "cgroup", "link"))], k["after_ttl"]
    assert _new_leftovers(cli) == [], cli["leftovers"].stdout
    assert cli["run_id"] not in cli["leftovers"].stdout
    if cli["leftovers_before"].returncode == 0:  # a clean machine before: a clean one after
        assert cli["leftovers"].returncode == 0, cli["leftovers"].stdout
        assert "nothing of the project's is left" in cli["leftovers"].stdout


def _death_run(out, repeat=False):
    return (out / DEATH_REPEAT if repeat else out) / "e2e_engine_death" / "LC" / "seed-0"


@pytest.mark.parametrize("repeat", [False, True])
def test_engines_an_engine_fault_kills_fail_their_requests_and_are_never_chosen_again(testbed_runs, repeat):
    """The spec's engine fault, on the shared engines: pod 2's decode engine core SIGKILLed
    mid-decode, then pod 0's prefill engine actor, by their pods' fault agents; the run goes on with
    pods 1 and 3. Twice: the repeat ran on engines the driver restarted for it (the first run left
    two dead), so each run starts on the whole set, as in the simulator."""
    out = testbed_runs[0]
    d = _death_run(out, repeat)
    meta = read_meta(d)
    assert meta["status"] == "finished"
    if repeat:  # the check before the run found the dead engines and restarted them all
        kv = meta["start"]["kv_paths"]
        assert kv.get("restart") and kv["after_restart"]["ok"] and not kv["after_restart"]["down"], kv
    # the dead engines' errors reached the router as plain EngineErrors: it never imported vLLM
    # (and torch), which held its event loop for 7-10 s (testbed/engines/engine.py EngineError)
    assert meta["router_imported"] == [], meta["router_imported"]
    req = read_table(d, "requests")
    eng = read_table(d, "engines").set_index("pod")
    dec = read_table(d, "decisions")
    faults = read_table(d, "faults").set_index("pod")
    # each kill acted on its schedule, one row per engine, and was seen from the engines' own state
    # (worker = pod here: one engine per pod), in the order they were killed, after its kill
    assert set(faults.index) == {0, 2} and (faults.kind == "engine").all() and (faults.measured == 0.0).all()
    assert faults.loc[2, "target"] == "pod2:pod2-decode/core" and faults.loc[0, "target"] == "pod0:pod0-prefill/actor"
    assert set(eng.index) == {0, 2}, eng
    assert eng.loc[2, "role"] == "decode" and eng.loc[0, "role"] == "prefill"
    for pod in (0, 2):  # seen at a failed call or the liveness check (every 10 s) after the kill
        assert faults.loc[pod, "time_s"] <= eng.loc[pod, "time_s"] <= faults.loc[pod, "time_s"] + 10.5, (faults, eng)
    # every request has its record; each error is a dead engine's, in a stage that depends on it
    # (the blame rule: a KV pull from pod 0's dead prefill engine fails in kv_transfer too)
    assert len(req) == DEATH_REQUESTS and set(req.outcome) <= {"ok", "error"}, req.outcome.value_counts()
    errors = req[req.outcome == "error"]
    from core.stages import BLAMED_ENDS

    for r in errors.itertuples():
        ends = BLAMED_ENDS[r.failed_stage]
        assert ("prefill" in ends and r.prefill_pod == 0) or ("decode" in ends and r.decode_pod == 2), errors
    assert ((errors.decode_pod == 2) & (errors.routed_s < eng.loc[2, "time_s"])).sum() >= 1, errors
    for pod in (2, 0):  # and no request is routed to a dead engine once it is down
        assert (dec[dec.time_s > eng.loc[pod, "time_s"]][["prefill_pod", "decode_pod"]] != pod).all().all()
    # the dead engines' host samples were collected while they lived (every HOST_FETCH_S), not lost
    # with them: pod 0's prefill engine, killed 16 s after pod 2's, has rows up to shortly before
    from testbed.router.actor import HOST_FETCH_S

    host = read_table(d, "host")
    for pod in (0, 2):
        mine = host[host.pod == pod]
        assert len(mine) and mine.time_s.max() > faults.loc[pod, "time_s"] - HOST_FETCH_S - 4.0, (pod, mine.time_s.max())
    # the run went on with pods 1 and 3: requests routed after both deaths were served there
    after = req[req.routed_s > eng.time_s.max()]
    assert len(after) > 0 and (after.prefill_pod == 1).all() and (after.decode_pod == 3).all()
    assert (after.outcome == "ok").mean() >= 0.9, after.outcome.value_counts()
    # a decode engine's death did not stall prefill elsewhere: pods 0 and 1 kept prefilling after it
    # (routed after pod 2's death was seen and at least 4 s before pod 0's kill)
    between = req[(req.routed_s > eng.loc[2, "time_s"]) & (req.routed_s < faults.loc[0, "time_s"] - 4.0)]
    assert len(between) > 0 and between.prefill_end_s.notna().all(), between
    # A router frozen by the death (7-10 s when it imported vLLM) delays every request in the window,
    # hence the median. One answer can still come late: from a fresh clone (2026-11-23) pod 1's prefill
    # answer took 5.8 s, its engine idle, while pod 3's pull from pod 0 took 5.6 s and pod 0's engine
    # held KV for dead pod 2 (lease: EngineConfig) with the host at PSI 0.78; not explained yet.
    assert (between.prefill_end_s - between.routed_s).median() < 5.0, between
    # and the reverse: decode on pod 3 went on as pod 0's prefill engine died
    around = req[(req.routed_s > faults.loc[0, "time_s"] - 4.0) & (req.routed_s < eng.loc[0, "time_s"] + 10.0)
                 & (req.decode_pod == 3) & (req.outcome == "ok")]
    assert len(around) > 0 and (around.first_token_s - around.prefill_end_s).max() < 5.0, around


def test_engine_death_in_the_simulator_ends_the_same_requests_the_same_way_and_the_comparison_passes(
        testbed_runs, tmp_path):
    """The engine fault's spec in the calibrated simulator, compared with `testbed compare --repeat`:
    every quantity both worlds measured (engine_down_s, the failure rate, the composition by stage)
    is judged by the rule (analysis/compare/engine_death.py), undecided on one seed, and lies within its
    margin of the testbed's two runs; and each dead core's notice lies in the fitted prediction interval or
    is reported outside it."""
    import pandas as pd
    from analysis.rule.verdict import ONE_SEED
    from e2e_cluster import _cli

    out = testbed_runs[0]
    spec = out / "e2e_engine_death.yaml"
    sim = _cli("sim", str(spec), "--calibration", str(out / "calibration.json"), "--out", str(tmp_path / "sim"))
    assert sim.returncode == 0, sim.stderr
    fid = tmp_path / "fidelity"
    cmp = _cli("compare", str(tmp_path / "sim" / "e2e_engine_death"), str(out / "e2e_engine_death"),
               "--repeat", str(out / DEATH_REPEAT / "e2e_engine_death"), "--out", str(fid))
    assert cmp.returncode == 0, cmp.stderr
    table = pd.read_csv(fid / "fidelity_engines.csv").set_index("metric")
    # both worlds saw both deaths and failed requests for them
    assert table.loc["engine_down_s", ["sim", "testbed", "repeat"]].notna().all(), table
    assert (table.loc["failure_rate", ["sim", "testbed", "repeat"]] > 0).all(), table
    judged = table[table[["sim", "testbed"]].notna().all(axis=1)]
    assert {"engine_down_s", "failure_rate"} <= set(judged.index)
    # one seed decides nothing (analysis/rule/verdict.py): each quantity undecided for that reason, and the
    # simulator inside the margin that matters of what the testbed itself measured in its two runs. Not of
    # the first run alone: a share of 4 failed requests moves by 0.25, past its 0.20 margin, when one
    # request fails in another stage, and the testbed's repeat did so against its first run on a CPU
    # without AVX-512 (CI, 2026-11-30: decode-queue share 0.50 and 0.25, the simulator's 0.25).
    assert (judged.verdict == "undecided").all() and (judged.why == ONE_SEED).all(), judged.to_string()
    runs = judged[["testbed", "repeat"]]
    outside = judged[(judged.sim < runs.min(axis=1) - judged.margin - 1e-12)
                     | (judged.sim > runs.max(axis=1) + judged.margin + 1e-12)]
    assert outside.empty, f"outside:\n{judged.to_string()}\n{cmp.stdout[-3000:]}"
    # the core killed with a decode on it gave a notice in each testbed run, judged against the fit:
    # "pass" exactly where the notice lies inside the fit's prediction interval
    notices = pd.read_csv(fid / "fidelity_notices.csv")
    assert len(notices) >= 1 and (notices.notice_s > 0).all()
    assert ((notices.verdict == "pass") == notices.notice_s.between(notices.low, notices.high)).all(), notices


def _new_leftovers(cli: dict) -> list[str]:
    """`testbed leftovers` lines after the cluster's down that were not there before it came up."""
    before = set(cli["leftovers_before"].stdout.splitlines())
    return [x for x in cli["leftovers"].stdout.splitlines() if x not in before]


def test_nothing_is_left_behind(testbed_runs):
    _, before, after, _, cli = testbed_runs
    for key in ("namespaces", "processes", "qdiscs", "bootstrap", "tmp"):
        assert sorted(set(after[key]) - set(before[key])) == [], (before, after)
        assert not [x for x in after[key] if cli["run_id"] in x], after
    if not before["namespaces"]:  # (a machine with another cluster on it lists that one)
        assert "no emulated cluster recorded" in cli["down"].stdout
    assert cli["run_id"] not in cli["down"].stdout


def test_engines_kept_by_one_command_serve_the_next_until_stopped_and_refuse_a_command_without_the_flag(testbed_runs):
    """`--keep-engines`: the shared jobs start their engines and leave them up; the study cell, the twin
    and the served run (specs that make the same engines) reuse them, starting none, and their runs
    start on quiet engines as on new ones; `testbed run` without the flag is refused in one line while
    they hold the pods; the SIGKILLed run and the engine fault reuse them too, and `testbed cluster
    stop-engines` stops the ones alive after them."""
    from e2e_cluster import STUDY_SPEC, TWIN_DIR, TWIN_SPEC

    out, *_, cli = testbed_runs
    started = json.loads((out / "e2e_policies" / "testbed.json").read_text())
    assert started["engines_reused"] is False and all(e["startup_s"] > 0 for e in started["engines"]), started
    names = sorted(e["name"] for e in started["engines"])
    study, = (out / "study" / STUDY_SPEC).rglob("testbed.json")
    for path in (out / "e2e_link_fault" / "testbed.json", study,
                 out / TWIN_DIR / "testbed" / TWIN_SPEC / "testbed.json", out / "e2e_serve" / "testbed.json",
                 out / "e2e_engine_death" / "testbed.json"):
        reused = json.loads(path.read_text())
        assert reused["engines_reused"] is True, (path, reused)
        assert sorted(e["name"] for e in reused["engines"]) == names
        assert all(e["startup_s"] == 0.0 and e["reused"] for e in reused["engines"]), reused["engines"]
        start = reused["reused_start"]
        # quiet, and every pair's KV path working (after the killed run's link down, perhaps only once restarted)
        assert start["quiet"] is True and start["kv_paths"].get("after_restart", start["kv_paths"])["ok"], start
        assert reused["pd_probe"]["ok"], reused["pd_probe"]
    # the killed run (its driver never wrote testbed.json) started on them too: nothing restarted
    assert "restart" not in read_meta(cli["killed"]["run_dir"])["start"]["kv_paths"]
    for run in (out / TWIN_DIR / "testbed" / TWIN_SPEC / "LC" / "seed-0",
                out / TWIN_DIR / "testbed-repeat" / TWIN_SPEC / "LC" / "seed-0"):
        assert read_meta(run)["start"]["quiet"] is True
    refused = cli["refused_beside_kept"]
    assert refused.returncode != 0
    assert "4 engines kept by an earlier --keep-engines command hold the pods" in refused.stderr, refused.stderr[-2000:]
    assert "Traceback" not in refused.stderr and not (out / "refused" / "e2e_serve" / "LC").exists()
    stop = cli["stop_engines"]
    # the engine fault's repeat killed pod 0's prefill engine actor (pod 2's decode engine core, in its live actor)
    assert stop.returncode == 0 and "stopped 3 kept engines" in stop.stdout, stop.stdout + stop.stderr[-2000:]
    assert "pod0-prefill" not in stop.stdout and "pod2-decode" in stop.stdout
