"""Training methods, one module per method; `methods.registry` maps names to them."""
