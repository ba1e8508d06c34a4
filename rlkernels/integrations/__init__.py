"""Adapters for trainers and model libraries (Hugging Face transformers, TRL, verl)."""
