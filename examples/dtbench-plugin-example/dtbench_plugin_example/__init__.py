"""An example dtbench plug-in: a method (SGD with gradient-norm clipping) and a workload (Gaussian blobs)."""
