"""dtbench's harness: the suite spec, the runner, launchers, communication, networks, data, registry and reports."""
