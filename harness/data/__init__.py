"""Data: tensors and the shared data order, datasets, models, and the workloads that bind them."""
