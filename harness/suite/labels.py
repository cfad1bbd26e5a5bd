"""Run labels: the method, what sets a run apart from its method's other runs on the workload, and its world size."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from harness.suite.spec import compact

#: The longest default label (the full params sit in each label's tooltip on the report, and in each spec.json).
MAX_LABEL = 40


@dataclass(frozen=True)
class LabelInputs:
    """What a default label is made of, for one run of a suite (seeds aside).

    `settings` are the run's resolved values that may set it apart from its method's other runs on its workload:
    its params (optimizer included), workload options, and the layout and budget fields a suite may vary.
    """

    method: str
    workload: str
    world_size: int
    settings: dict[str, Any] = field(default_factory=dict)


def setting_text(key: str, value: Any) -> str:
    """One part of a label: 'replicas=2+1', 'max_steps=1500'; an optimizer by its name ('adamw')."""
    if key == "optimizer":
        return str(value) if value != "sgd" else "optim=sgd"  # 'sgd' alone would read as the method
    return f"{key}={compact(value)}"


def default_labels(runs: list[LabelInputs], suite_optimizer: str | None = None,
                   max_length: int = MAX_LABEL) -> list[str]:
    """One label per run, in order: '<method> [<optimizer>] [<key=value> ...] x<world size>'.

    Among the runs of one method on one workload (every run given, labelled or not), each setting has a reference
    value: the most common one, the earliest run's on a tie. A run names the settings where it departs from the
    reference (an unset one, None, says nothing), so the run the others vary shows none and each of the others says
    what sets it apart ('qfb x2', 'qfb feedback=0 x2'); expand_suite rejects two runs left with one label. The optimizer
    shows whenever it is not the suite's (`suite_optimizer`: the suite's [defaults] one, else the most common among
    its runs), since it changes what a run is. A label longer than `max_length` keeps its method and world size and
    is cut in the middle with '…' and a 4-hex digest of the whole, so labels that were distinct stay distinct.
    """
    if suite_optimizer is None:
        suite_optimizer = _most_common([run.settings.get("optimizer") for run in runs])
    peers: dict[tuple[str, str], list[LabelInputs]] = {}
    for run in runs:
        peers.setdefault((run.workload, run.method), []).append(run)
    references = {key: _references(group) for key, group in peers.items()}
    labels = []
    for run in runs:
        reference = references[(run.workload, run.method)]
        optimizer = run.settings.get("optimizer")
        parts = []
        departs = "optimizer" in reference and optimizer != reference["optimizer"]
        if optimizer is not None and (optimizer != suite_optimizer or departs):
            parts.append(setting_text("optimizer", optimizer))
        parts += [setting_text(key, run.settings[key]) for key in sorted(reference)  # an unset one says nothing
                  if key != "optimizer" and run.settings.get(key) is not None
                  and repr(run.settings[key]) != repr(reference[key])]
        labels.append(_fit(run.method, parts, f"x{run.world_size}", max_length))
    return labels


def _references(group: list[LabelInputs]) -> dict[str, Any]:
    """{setting: its reference value} for the settings whose values differ within `group` (runs in file order)."""
    keys = dict.fromkeys(key for run in group for key in run.settings)
    out = {}
    for key in keys:
        values = [run.settings.get(key) for run in group]
        if len({repr(v) for v in values}) > 1:
            out[key] = _most_common(values)
    return out


def _most_common(values: list[Any]) -> Any:
    """The value that occurs most often in `values` (compared by repr), the earliest of those on a tie."""
    counts: dict[str, int] = {}
    for value in values:
        counts[repr(value)] = counts.get(repr(value), 0) + 1
    best = max(counts.values(), default=0)
    return next((v for v in values if counts[repr(v)] == best), None)


def _fit(method: str, parts: list[str], size: str, max_length: int) -> str:
    """'<method> <parts> <size>', its middle cut to `max_length` characters with '…' and a digest when longer."""
    whole = " ".join([method, *parts, size])
    if len(whole) <= max_length:
        return whole
    digest = hashlib.sha256(whole.encode()).hexdigest()[:4]
    tail = f"… #{digest} {size}"
    room = max_length - len(tail)
    return (whole[:room].rstrip() if room > 0 else method) + tail
