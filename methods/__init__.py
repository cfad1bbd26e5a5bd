"""Training methods, by family (reference, compression, pipeline, local); harness/registry.py names them."""
