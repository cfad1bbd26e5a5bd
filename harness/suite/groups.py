"""Suite groups: every run of a suite file in file order, a [[group]]'s runs as the [[run]]s they stand for."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.suite.files import FileError

if TYPE_CHECKING:
    from harness.budget import Budget
    from harness.suite.schema import GroupEntry, RunEntry, SuiteFile


@dataclass(frozen=True)
class PlacedRun:
    """One run where the suite file puts it.

    `where` names it in errors (`run[2]`, `group[0].run[1]`). `entry` is the equivalent top-level [[run]]: a group's
    workload, and its workload_options, defaults and budget under the run's own, folded into the run's
    workload_options, params and budget, so that a group expands as those runs written out one by one would (run
    ids and labels included). `own` is the run as written. `group` names its [[group]] (`group[0]`) and
    `group_entry` is it; both are None for a top-level [[run]].
    """

    where: str
    entry: RunEntry
    own: RunEntry
    group: str | None = None
    group_entry: GroupEntry | None = None

    def param_field(self, key: str, suite_defaults: dict[str, Any], fallback: str | None = None) -> str:
        """The field that set parameter `key`: the run's params, its group's defaults, or the suite's [defaults];
        `fallback` (the run's params unless given) when none did (the workload's or the method's default)."""
        if key in self.own.params:
            return f"{self.where}.params"
        if self.group_entry is not None and key in self.group_entry.defaults:
            return f"{self.group}.defaults"
        if key in suite_defaults:
            return "defaults"
        return fallback or f"{self.where}.params"

    def option_field(self, key: str) -> str:
        """The field that set workload option `key`: the run's own workload_options, else its group's (a top-level
        run's are named by the run, as the suite's workload_options always were)."""
        if self.group is not None and key not in self.own.workload_options:
            return f"{self.group}.workload_options"
        return f"{self.where}.workload_options"

    @property
    def options_field(self) -> str:
        """The field that gave the run its workload options as a whole: its own, else its group's or the suite's."""
        if self.own.workload_options:
            return f"{self.where}.workload_options"
        return f"{self.group}.workload_options" if self.group is not None else "workload_options"

    @property
    def workload_field(self) -> str:
        """The field that named the run's workload: its own, its group's, or the suite's."""
        if self.group is not None:
            return f"{self.group}.workload"
        return f"{self.where}.workload" if self.own.workload else "workload"


def placed_runs(path: Path, suite: SuiteFile) -> list[PlacedRun]:
    """Every run of the suite in file order: the top-level [[run]]s first, then each [[group]]'s runs in order.

    Raises FileError (one line naming the file and the field) when a group's run names a workload (its group's is
    its workload), or when the suite has no run at all.
    """
    placed = [PlacedRun(f"run[{i}]", entry, entry) for i, entry in enumerate(suite.run)]
    for g, group in enumerate(suite.group):
        for j, own in enumerate(group.run):
            where = f"group[{g}].run[{j}]"
            if own.workload is not None:
                raise FileError(f"{path}: {where}.workload: a group's runs take its workload ({group.workload!r}); "
                                "give the run a [[group]] of its own workload, or make it a top-level [[run]]")
            entry = own.model_copy(update={
                "workload": group.workload,
                "workload_options": {**group.workload_options, **own.workload_options},
                "params": {**group.defaults, **own.params},
                "budget": _over(own.budget, group.budget),
            })
            placed.append(PlacedRun(where, entry, own, f"group[{g}]", group))
    if not placed:
        raise FileError(f"{path}: run: required key is missing: the suite has no runs; give at least one [[run]], "
                        "or a [[group]] with its [[group.run]]s")
    return placed


def _over(mine: Budget | None, base: Budget | None) -> Budget | None:
    """`mine` over `base` (Budget.over), either of which may be unset."""
    if mine is None or base is None:
        return base if mine is None else mine
    return mine.over(base)


def check_baseline(path: Path, field: str, baseline: str | None, runs: list[tuple[str, str, set[str]]]) -> None:
    """Check that `baseline` (the value of `field`: `baseline` or `group[i].baseline`) names one of `runs`, each
    (label, method, the names it answers to: its label and its method's names). Raises FileError listing the labels
    and methods otherwise."""
    if baseline is None or any(baseline in names for _label, _method, names in runs):
        return
    whose = "no run of this group" if field.startswith("group") else "no top-level [[run]]"
    labels = ", ".join(dict.fromkeys(label for label, _method, _names in runs)) or "none"
    methods = ", ".join(dict.fromkeys(method for _label, method, _names in runs)) or "none"
    raise FileError(f"{path}: {field}: {whose} has the label or method {baseline!r} (labels: {labels}; "
                    f"methods: {methods})")
