"""benchmarks/gpu_check.py on a machine without a GPU: every part says it is missing and why,
none claims a check, and the run ends 0 with its table and JSON. On a GPU machine the script's
own output is the result (docs/cluster.md "Checking a GPU machine"), so this test skips there."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.machine.gpu import gpu_available

REPO = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.background,
              pytest.mark.skipif(gpu_available() is None, reason="a GPU machine: run the script itself")]


def test_without_a_gpu_every_part_is_missing_with_its_reason(tmp_path):
    out = tmp_path / "gpu.json"
    r = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--json", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(out.read_text())
    assert list(res) == ["nvml", "cuda", "uuid", "vllm", "nixl-vram", "engines"]
    assert {p: v["status"] for p, v in res.items()} == dict.fromkeys(res, "missing"), res
    assert "NVML" in res["nvml"]["detail"] or "nvidia-smi" in res["nvml"]["detail"]
    assert "no CUDA" in res["cuda"]["detail"] and "no CUDA" in res["engines"]["detail"]
    assert "CPU build" in res["vllm"]["detail"] or "not installed" in res["vllm"]["detail"]
    for part in res:
        assert part in r.stdout  # the table names each part
