"""APapo: the layer-graph partition over measured ranks, and its multi-iteration asynchronous schedule."""
