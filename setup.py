"""Compiles the simulator's hot modules with Cython (pyproject.toml holds everything else).

Which modules and why: core/compiled.py. They are compiled unchanged, as optional extensions:
where no C compiler exists the install still succeeds and they run as Python. Each extension
gets the SHA-256 of its source beside it, so an edited module runs as Python until it is
rebuilt instead of running stale compiled code.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from core.compiled import COMPILED_MODULES, DIGEST_SUFFIX, source_digest  # noqa: E402


def _source(module: str) -> Path:
    return ROOT / (module.replace(".", "/") + ".py")


class BuildExtWithDigests(build_ext):
    """build_ext in parallel, writing each extension's source digest beside it once built."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if self.parallel is None:
            self.parallel = os.cpu_count() or 1

    def build_extension(self, ext: Extension) -> None:
        super().build_extension(ext)  # raises on failure: no digest for an extension not built
        Path(self.get_ext_fullpath(ext.name) + DIGEST_SUFFIX).write_text(source_digest(_source(ext.name)) + "\n")

    def run(self) -> None:
        super().run()
        if self.inplace:  # editable installs: setuptools copied each built extension beside its source
            for ext in self.extensions:
                digest = Path(self.build_lib, self.get_ext_filename(ext.name) + DIGEST_SUFFIX)
                placed = self.get_ext_fullpath(ext.name)  # inplace again: the path beside the source
                if digest.exists() and os.path.exists(placed):
                    self.copy_file(str(digest), str(placed) + DIGEST_SUFFIX, level=self.verbose)

    def get_outputs(self) -> list[str]:
        outputs = super().get_outputs()
        return outputs + [o + DIGEST_SUFFIX for o in outputs]


def _extensions() -> list[Extension]:
    try:
        from Cython.Build import cythonize
    except ImportError:  # pip installs Cython for the build (pyproject.toml); a bare setup.py call may lack it
        return []
    extensions = [Extension(m, [str(_source(m).relative_to(ROOT))], optional=True) for m in COMPILED_MODULES]
    # annotation_typing off: the type hints are documentation, and a NamedTuple passed where a
    # hint says tuple must stay legal, as in Python.
    return cythonize(extensions, build_dir="build/cython", nthreads=os.cpu_count() or 1, quiet=True,
                     compiler_directives={"language_level": 3, "annotation_typing": False})


setup(ext_modules=_extensions(), cmdclass={"build_ext": BuildExtWithDigests})
