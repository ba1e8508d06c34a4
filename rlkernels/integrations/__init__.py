"""Adapters for training stacks. Each submodule imports its framework lazily (installing rlkernels never
requires them): `rlkernels.integrations.transformers` for Hugging Face causal LMs."""
