"""Networks: the pure network spec, its emulation (namespaces, tc tbf, a latency relay), and net-check."""
