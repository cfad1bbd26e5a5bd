"""Synchronous pipelines with a flush every minibatch: GPipe, 1F1B and interleaved 1F1B."""
