"""PipeDream: asynchronous 1F1B with weight stashing and replicated stages."""
