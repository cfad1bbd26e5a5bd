"""The pipeline core: the schedule IR, executors, stages, weight-version policies, codecs, placement and planning."""
