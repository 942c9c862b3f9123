"""The world-independent core: what the simulator and the real testbed share.

Spec (``spec``, ``metrics_spec``), cluster shape (``topology``), records and the run
directory (``records``), the stages of a request and the blame rule (``stages``), the
request ticket (``ticket``), what a policy sees (``view``), the policies, the risk price
(``risk``), the router (``routing``), the router's limits on a request (``limits``) and the run
context both worlds open (``run``).

It imports the pure fault and workload models, and neither world: the simulator and
``testbed`` import it, and only the CLI imports both of them.
"""

from core.compiled import install as _install_compiled_finder

_install_compiled_finder()  # before any compiled module is imported (core/compiled.py)
