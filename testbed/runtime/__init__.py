"""Real-cluster runtime: vLLM engines (and, around them, the Ray actors).

`model` builds the tiny random-weight Llama that the CPU testbed serves;
`engine` wraps one vLLM `AsyncLLM` with NIXL KV transfer as a plain object, so
that a Ray actor (or a test's subprocess) is only a thin adapter around it.
Neither module imports Ray; `engine` imports vLLM only when an engine starts.
"""
