"""`testbed run --serve` on the end-to-end cluster (tests/e2e_cluster.py): the OpenAI-compatible
ingress queried as a user would, vLLM's serve benchmark against it, and a process group stopped
the way a user stops it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from testbed.cluster.raynodes import free_ports

REPO = Path(__file__).resolve().parents[1]


def serve_and_query(base: dict, addr: str, out: Path) -> dict:
    """`testbed run --serve` on the cluster, as a user starts it, on the engines kept up since the
    shared jobs (--keep-engines); the `openai` client on the host (through the forwarder into the head's namespace)
    sends a completion and a streamed chat, then Ctrl-C (SIGINT) stops it. Returns what the clients
    and the command saw."""
    import httpx
    import openai

    port = free_ports(1)[0]
    spec_file = out / "e2e_serve.yaml"
    spec_file.write_text(json.dumps({**base, "name": "e2e_serve", "testbed": {**base["testbed"], "ingress_port": port}}))
    proc = subprocess.Popen([sys.executable, "-m", "cli", "run", str(spec_file), "--serve", "--address", addr,
                             "--keep-engines",
                             "--policies", "LC", "--seeds", "0", "--out", str(out)],
                            stderr=subprocess.PIPE, text=True, env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"},
                            # as from a terminal: a test run in the background inherits SIGINT ignored
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        for line in proc.stderr:
            lines.append(line)
            if line.startswith("serving "):
                ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    seen: dict = {}
    try:
        assert ready.wait(600) or proc.poll() is not None, "".join(lines)
        assert proc.poll() is None, "".join(lines)
        base_url = f"http://127.0.0.1:{port}"
        seen["health"] = httpx.get(f"{base_url}/health", timeout=30).json()
        c = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=120)
        seen["models"] = [m.id for m in c.models.list().data]
        r = c.completions.with_raw_response.create(model=seen["models"][0], prompt="The router sends this prompt",
                                                   max_tokens=8, temperature=0.0, extra_body={"ignore_eos": True})
        seen["completion"], seen["completion_id"] = r.parse(), int(r.headers["x-testbed-request-id"])
        seen["chunks"] = list(c.chat.completions.create(
            model=seen["models"][0], messages=[{"role": "user", "content": "Hello, testbed"}], max_tokens=8,
            stream=True, extra_body={"ignore_eos": True}))
        # the router's metrics on the host too, while it serves (forwarded like the ingress)
        seen["host_metrics"] = httpx.get(f"http://127.0.0.1:{base['testbed']['metrics_port']}/metrics", timeout=30).text
        seen["bench"] = _vllm_bench(base_url, seen["models"][0], out / "bench")
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            seen["rc"] = proc.wait(300)
        except subprocess.TimeoutExpired:
            proc.kill()
            seen["rc"] = proc.wait()
        reader.join(10)
        seen["stderr"] = "".join(lines)
    return seen


BENCH_PROMPTS = 10  # vLLM's serve benchmark against the ingress: this many prompts at 1 request/s


def _vllm_bench(base_url: str, model: str, out: Path) -> dict:
    """vLLM's own serve benchmark, as docs/tools.md tells a user to start it, against the served
    testbed: BENCH_PROMPTS random prompts of 400 tokens, 16 out, 1 request/s. Returns its command's
    exit status and output, and its saved report."""
    from testbed.machine.cache_dirs import model_cache_dir

    # the served name is the model folder's name; the benchmark tokenizes its prompts with the folder's tokenizer
    argv = [sys.executable, "-m", "cli.vllm_cli", "bench", "serve", "--backend", "openai", "--base-url", base_url,
            "--model", model, "--tokenizer", str(model_cache_dir()), "--dataset-name", "random", "--random-input-len", "400", "--random-output-len", "16",
            "--num-prompts", str(BENCH_PROMPTS), "--request-rate", "1", "--ignore-eos", "--seed", "0",
            "--disable-tqdm", "--save-result", "--result-dir", str(out), "--result-filename", "bench.json"]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=REPO,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"})
    report = out / "bench.json"
    return {"rc": res.returncode, "output": res.stdout + res.stderr,
            "report": json.loads(report.read_text()) if report.exists() else None}


def end_group(proc: subprocess.Popen) -> None:
    """SIGKILL a `testbed run` started in a session of its own (it and its driver), if still running."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


# The kill, this long after the run's start (run.json's started_at, which the run's clock starts at
# or after): past the deadline (8 s) of the first requests whose KV had to cross the link, so the
# run holds requests timed out in kv_transfer (the testbed's records are flushed every second), and
# nothing more is waited for. (At 65 s, until 2026-11-28, the kill came after UCX had given the
# link's connections up, ~47 s: no test reads what happens then.) Timed from the run's start, not
# from when the test reads the faults applied: their rows are written once the probes measured
# them, then flushed, then polled, 4-5 s after the faults in a fresh clone's suite at bc853e7,
# where a kill timed from that read came at the faults' end and the driver had cleared them itself.
