"""What the verbs share: the exit-code epilog, the --network option, the one-line error, and the closing summary."""

from __future__ import annotations

import argparse
import sys

EPILOG = "Exit codes: 0 every run completed; 1 some run failed or diverged; 2 bad input (nothing written)."
NETWORK_HELP = ("emulate a network: every rank in its own network namespace, its link limited to RATE each way by tc "
                "tbf, and an optional one-way LATENCY between ranks added by a userspace relay. Form: "
                "RATE[,latency=TIME], e.g. 1gbit, 100mbit, 'unlimited', '100mbit,latency=1ms' (rates in bit, kbit, "
                "mbit, gbit; times in us, ms, s). Needs root and iproute2. See docs/network.md")


def network_arg(text: str):
    """argparse type of --network: the parsed NetworkSpec, or argparse's one-line error."""
    from harness.net.spec import parse_network

    try:
        return parse_network(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def fail(message: str) -> int:
    """Print one error line and return exit code 2 (bad input; nothing written)."""
    print(f"dtbench: error: {message}", file=sys.stderr)
    return 2


def finish(outcomes) -> int:
    """The closing lines of a run of runs: how many completed, then every other run with its message. Exit 0 when
    every run completed or did not fit its memory_per_rank (a budget's verdict, refused before its first step, not
    a failure), else 1."""
    refused = [o for o in outcomes if o.state == "does_not_fit"]
    bad = [o for o in outcomes if o.state not in ("completed", "does_not_fit")]
    done = len(outcomes) - len(bad) - len(refused)
    print(f"{done}/{len(outcomes)} runs completed." + (f" {len(refused)} did not fit memory_per_rank." if refused
                                                       else ""))
    for o in refused + bad:
        message = (o.error or {}).get("message") or "no error message"
        print(f"  {o.state}: {o.spec.run_id}: {message}")
    return 1 if bad else 0


def network_problem(specs) -> str | None:
    """Why the emulated networks of these runs cannot be built here, or None (also when no run has one)."""
    from harness.net.emulation import requirements_problem

    for spec in specs:
        if spec.network is not None:
            problem = requirements_problem(spec.network)
            if problem:
                return problem
    return None
