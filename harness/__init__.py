"""dtbench's harness: config, workloads, data, the shared runner, launchers, communication accounting and reports."""
