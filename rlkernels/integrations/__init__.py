"""Adapters for trainers and model libraries (Hugging Face transformers, TRL, verl). Each submodule imports
its framework lazily: installing rlkernels never requires them."""
