"""Real vLLM engines: one engine as a plain object (``engine``; its counters in ``stats``) and its
Ray actor (``actor``), the tiny random-weight model the CPU testbed serves (``model``), the hooks
vLLM loads into its own processes by path (``vllm_hooks``, with ``shm_wakeups``; the stage log they
write, read back in ``stagelog``), and the CPU an engine got (``hoststats``)."""
