"""A pipeline run's partition.json read for the projection: each stage's block range (a partition cut on the
model's layer graph read as block ranges) and its parameter bytes."""

from __future__ import annotations

import re
from collections.abc import Sequence

from harness.project.measured import RunMeasure


def stage_ranges(measure: RunMeasure) -> list[tuple[int, int]]:
    """Each stage's [start, end) blocks, from partition.json; for a partition cut on the model's layer graph
    (APapo's graph_plan), graph_ranges."""
    partition = measure.partition or {}
    if "graph_plan" in partition:
        return graph_ranges(partition["graph_plan"].get("stages") or [])
    return [(int(s["blocks"][0]), int(s["blocks"][1])) for s in partition.get("stages") or []]


def graph_ranges(stages: Sequence[dict]) -> list[tuple[int, int]]:
    """Block ranges for stages cut on a layer graph whose nodes are named '_<block>_<layer>' (and torch.fx's own
    names for functions between them): each block goes to the stage holding most of its named nodes (the earlier
    one on a tie), so a cut inside a block is read as the nearest block boundary. [] when the names say nothing or
    the stages' blocks are not in order."""
    held: dict[int, list[int]] = {}
    for s, stage in enumerate(stages):
        for name in stage.get("node_names") or []:
            match = re.match(r"_(\d+)_", str(name))
            if match:
                held.setdefault(int(match.group(1)), [0] * len(stages))[s] += 1
    if not held or sorted(held) != list(range(len(held))):
        return []
    owner = [max(range(len(stages)), key=lambda s: (held[b][s], -s)) for b in sorted(held)]
    if owner != sorted(owner) or set(owner) != set(range(len(stages))):
        return []
    return [(owner.index(s), len(owner) - owner[::-1].index(s)) for s in range(len(stages))]


def stage_param_bytes(measure: RunMeasure) -> dict[int, float]:
    """Bytes of each stage's parameters (what a sync_grads all-reduces), from partition.json's block profiles."""
    profiles = (measure.partition or {}).get("profiles") or []
    if not profiles:
        return {}
    return {s: float(sum(profiles[b]["param_bytes"] for b in range(a, e)))
            for s, (a, e) in enumerate(stage_ranges(measure))}
