"""SimPy model of a PD-disaggregated LLM serving cluster (fat-tree network, workers, faults)."""

from core.compiled import install as _install_compiled_finder

_install_compiled_finder()  # before any compiled module is imported (core/compiled.py)
