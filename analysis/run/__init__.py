"""One run's metrics: a run directory read, its reliability and serving metrics, summaries over
seeds, its report and plots."""
