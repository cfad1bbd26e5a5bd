"""The pipeline core: partitions, schedules as data, executors, weight-version policies and the partitioner."""
