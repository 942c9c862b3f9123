"""Real vLLM engines: one engine as a plain object (``engine``) and its Ray actor (``actor``), the
tiny random-weight model the CPU testbed serves (``model``), the hooks vLLM loads into its own
processes (``vllm_hooks``, ``shm_wakeups``), and the CPU an engine got (``hoststats``)."""
