"""The experiment spec: one YAML file drives both worlds (model.py), with its metrics block,
its study block and the sizes checked before work."""
