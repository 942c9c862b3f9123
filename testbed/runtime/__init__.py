"""The real world: vLLM engines as Ray actors, the router actor, faults acting on the host.

`model` builds the tiny random-weight Llama that the CPU testbed serves;
`engine` wraps one vLLM `AsyncLLM` with NIXL KV transfer (and the scheduler's
stage log) as a plain object, so that a Ray actor (or a test's subprocess) is
only a thin adapter around it. Neither module imports Ray; `engine` imports
vLLM only when an engine starts. `serve` is the router actor's request flow,
`injector` the fault timeline on the wall clock, `injection/` what changes the
host. Like the simulator, this package imports only `core`, `faults` and
`workloads`; the CLI (`testbed.cli`) is the one place that imports both worlds.
"""
