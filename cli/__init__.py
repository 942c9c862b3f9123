"""The ``testbed`` command line of both worlds, one module per command group. It imports
everything and is imported by nothing (tests aside)."""
