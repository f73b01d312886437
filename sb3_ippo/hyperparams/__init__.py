"""Hyperparameters as data: rl-zoo style YAML files, a section per env id, and the text notation they are written in."""
