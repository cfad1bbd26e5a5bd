"""One run, executed on one rank: the training loop, the worker entry point, checkpoints, records and clocks."""
