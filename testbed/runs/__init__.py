"""A testbed run's two halves: the launcher in the user's namespace (``launch``: model, emulated
cluster, driver, teardown) and the driver in the head's namespace (``driver``: engines, router,
one run directory per policy and seed), and the jobs the one hands the other (``jobs``: each spec
validated once, each seed's workload generated once)."""
