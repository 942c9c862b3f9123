"""SimPy model of a PD-disaggregated LLM serving cluster (fat-tree network, workers, faults)."""
