"""Paper claims as checks: a claim file's schema, and PASS / FAIL / INCONCLUSIVE verdicts on a suite's results."""
