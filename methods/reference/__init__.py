"""The reference methods: single-process SGD and DistributedDataParallel."""
