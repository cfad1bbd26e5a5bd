"""Each workload's baseline: the label its other labels are compared against, or none where nothing compares."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from harness.report.network import method_label
from harness.results import RunResult

#: The method whose first label is a workload's baseline when neither --baseline nor the suite names one.
DEFAULT_METHOD = "ddp"


@dataclass(frozen=True)
class Baseline:
    """A workload's baseline `label` (without its network; None: the workload has one label, nothing to compare)
    and `how` it was chosen, in words."""

    label: str | None
    how: str


def workload_baselines(table: pd.DataFrame, runs: Sequence[RunResult] = (), requested: str | None = None
                       ) -> dict[str, Baseline]:
    """summary (runs x columns), the runs (their spec.json's `baseline`, a suite group's) -> {workload: Baseline}.

    For each workload, in this order: none when it has a single label (nothing to compare); `requested`
    (--baseline) where that label ran on the workload; the suite's baseline for the workload (spec.json
    `baseline`: a label, or a method name whose first label is taken); the first label of a `ddp` run there,
    whatever its label; else the workload's first label.
    """
    networks = table["network"].fillna("").astype(str) if "network" in table else pd.Series("", index=table.index)
    labels = pd.Series([method_label(str(label), net) for label, net in zip(table["label"], networks, strict=True)],
                       index=table.index)
    named = {str(run.spec.get("workload")): run.spec.get("baseline") for run in runs
             if isinstance(run.spec.get("baseline"), str)}
    workloads = table["workload"].astype(str).to_numpy()
    all_labels, all_methods = labels.to_numpy(), table["method"].astype(str).to_numpy()
    out = {}
    for workload in dict.fromkeys(workloads):
        here = workloads == workload
        labels_here, methods_here = all_labels[here], all_methods[here]
        mine = list(dict.fromkeys(labels_here))
        suite_choice = named.get(workload)
        if len(mine) <= 1:
            out[workload] = Baseline(None, f"only {mine[0] if mine else 'one label'} ran here: nothing to compare")
        elif requested is not None and requested in mine:
            out[workload] = Baseline(requested, "--baseline")
        elif suite_choice is not None and (suite_choice in mine or (methods_here == suite_choice).any()):
            label = suite_choice if suite_choice in mine else str(labels_here[methods_here == suite_choice][0])
            out[workload] = Baseline(label, "the suite's baseline")
        elif (methods_here == DEFAULT_METHOD).any():
            out[workload] = Baseline(str(labels_here[methods_here == DEFAULT_METHOD][0]),
                                     f"default: the first {DEFAULT_METHOD} run")
        else:
            out[workload] = Baseline(str(mine[0]), f"default: no {DEFAULT_METHOD} run, so the first label")
    return out


def baselines_text(baselines: dict[str, Baseline]) -> str:
    """'digits-mlp: ddp x2 (default: the first ddp run); shakespeare-gpt: none (only sgd ran here: ...)'."""
    return "; ".join(f"{workload}: {b.label} ({b.how})" if b.label else f"{workload}: none ({b.how})"
                     for workload, b in baselines.items())
