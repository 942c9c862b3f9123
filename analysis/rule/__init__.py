"""The verdict rule both comparisons and the study apply: whether a result holds, whether two worlds
agree and when the data decide nothing (verdict.py), with its priors for the seeds' variance (priors.py)."""
