"""Workloads: a name bound to a dataset, a model, a loss, a budget and hyperparameters (workload.py), and the
built-in ones (builtin.py, lm.py)."""
