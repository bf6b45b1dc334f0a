"""Workflows: the paths that load models and datasets, fit, and score, above compress, finetune and evaluate."""
