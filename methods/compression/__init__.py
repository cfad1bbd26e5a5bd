"""The gradient compression core, split as GRACE splits it: compressor, error-feedback memory, and the DDP hook."""
