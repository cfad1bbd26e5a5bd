"""Run states for `dtbench status` and `dtbench wait`: status.json, joined with the scheduler's view of SLURM jobs."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from submitit.slurm.slurm import read_job_id

from harness.launch.sites import Commands

#: States after which nothing more happens to a run without a new `dtbench run`.
FINAL = frozenset({"completed", "failed", "diverged", "preempted", "does_not_fit"})
ACTIVE_JOB = {"RUNNING": "running", "COMPLETING": "running", "CONFIGURING": "running", "SUSPENDED": "running",
              "STOPPED": "running", "RESIZING": "running", "SIGNALING": "running", "STAGE_OUT": "running",
              "PENDING": "pending", "REQUEUED": "requeued", "REQUEUE_HOLD": "requeued", "REQUEUE_FED": "requeued",
              "RESV_DEL_HOLD": "pending"}


@dataclass
class RunState:
    run_id: str
    state: str
    job_id: str | None
    detail: str
    job_state: str | None = None  # the scheduler's, when it knows the job

    @property
    def settled(self) -> bool:
        """Nothing more will happen: a final state, and no job of the run still queued or running."""
        return self.state in FINAL and ACTIVE_JOB.get(self.job_state or "") is None


def parse_sacct(text: str) -> dict[str, str]:
    """`sacct -n -P -X -o JobID,State` output -> {job id: STATE}; arrays expand (12_[0-2] -> 12_0, 12_1, 12_2)."""
    states: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 2 or not parts[0] or "." in parts[0]:
            continue
        state = parts[1].split()[0] if parts[1].split() else ""
        for ids in read_job_id(parts[0]):
            if len(ids) == 1:
                states[ids[0]] = state
            elif len(ids) == 2:
                states[f"{ids[0]}_{ids[1]}"] = state
            else:
                for index in range(int(ids[1]), int(ids[2]) + 1):
                    states[f"{ids[0]}_{index}"] = state
    return states


def scheduler_states(job_ids: list[str], commands: Commands) -> dict[str, str]:
    """Each job's scheduler state: the queue (squeue) for live jobs, accounting (sacct) for the others.
    Jobs neither knows (no accounting, purged) are left out."""
    wanted = set(job_ids)
    states: dict[str, str] = {}
    try:
        out = subprocess.run([commands.squeue, "-h", "-r", "-o", "%i|%T"], capture_output=True, text=True,
                             timeout=60).stdout
        states.update({k: v for k, v in parse_sacct(out).items() if k in wanted})
    except (OSError, subprocess.SubprocessError):
        pass
    rest = sorted({j.split("_")[0] for j in wanted - states.keys()})
    if rest:
        try:
            command = [commands.sacct, "-n", "-P", "-X", "-o", "JobID,State", *(a for j in rest for a in ("-j", j))]
            out = subprocess.run(command, capture_output=True, text=True, timeout=60).stdout
            states.update({k: v for k, v in parse_sacct(out).items() if k in wanted and k not in states})
        except (OSError, subprocess.SubprocessError):
            pass
    return states


def combine(status: dict, job_state: str | None) -> tuple[str, str]:
    """(state, detail) of a run from its status.json and its job's scheduler state (None: unknown or local)."""
    state = str(status.get("state") or "unknown")
    error = (status.get("error") or {}).get("message")
    note = status.get("note")
    final = status.get("final") or {}
    detail = error or note or (f"step {final['steps']}" if "steps" in final else "")
    if job_state is None:
        return state, detail
    active = ACTIVE_JOB.get(job_state)
    if state in ("completed", "diverged", "failed", "does_not_fit") and active is None:
        return state, detail
    if active == "pending" and (state == "preempted" or status.get("restarts")):
        return "requeued", detail
    if active is not None:
        return (state if state == "completed" else active), detail
    if state == "preempted":
        return state, detail
    return "failed", error or f"the job ended {job_state} before the run finished"


def suite_states(suite_dir: Path) -> list[RunState]:
    """One RunState per run folder of suite_dir (folders holding spec.json), in run id order."""
    jobs_file = suite_dir / "slurm" / "jobs.json"
    try:
        jobs = json.loads(jobs_file.read_text())
    except (OSError, ValueError):
        jobs = {"runs": {}}
    statuses: dict[str, dict] = {}
    for spec in sorted(suite_dir.glob("*/spec.json")):
        try:
            statuses[spec.parent.name] = json.loads((spec.parent / "status.json").read_text())
        except (OSError, ValueError):
            statuses[spec.parent.name] = {"state": "unknown"}
    job_ids = {run: (status.get("slurm_job_id") or jobs["runs"].get(run, {}).get("job_id"))
               for run, status in statuses.items()}
    known = [j for j in job_ids.values() if j]
    scheduler = scheduler_states(known, Commands(**jobs.get("commands", {}))) if known else {}
    rows = []
    for run, status in statuses.items():
        job = job_ids[run]
        job_state = scheduler.get(job) if job else None
        state, detail = combine(status, job_state)
        rows.append(RunState(run, state, job, detail, job_state))
    return rows


def format_table(rows: list[RunState]) -> str:
    if not rows:
        return "no runs"
    width = max(len(r.run_id) for r in rows)
    lines = [f"{'run':<{width}}  {'state':<9}  {'job':<10}  detail"]
    lines += [f"{r.run_id:<{width}}  {r.state:<9}  {r.job_id or '-':<10}  {r.detail}" for r in rows]
    return "\n".join(lines)


def format_suites(suites: dict[str, list[RunState]]) -> str:
    """One line per suite: its run count and how many runs are in each state."""
    width = max(len(name) for name in suites)
    lines = [f"{'suite':<{width}}  {'runs':>4}  states"]
    for name, rows in suites.items():
        counts: dict[str, int] = {}
        for row in rows:
            counts[row.state] = counts.get(row.state, 0) + 1
        states = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
        lines.append(f"{name:<{width}}  {len(rows):>4}  {states}")
    return "\n".join(lines)
