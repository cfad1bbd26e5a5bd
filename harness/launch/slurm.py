"""The SLURM launcher: a suite's runs as submitit job arrays, site command names, and requeue after preemption."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from submitit.core import core, utils
from submitit.slurm.slurm import SlurmExecutor, SlurmInfoWatcher, SlurmJob

from harness.launch.failures import describe_failure, error_time
from harness.launch.sites import Commands, Site
from harness.run.records import utc_now, write_json, write_status
from harness.run.worker import ERROR_FILE
from harness.suite.spec import RunSpec, rank_threads

JOBS_FILE = "jobs.json"  # in <out>/<suite>/slurm/: run id -> job id, and the site's command names


# -- submitit with a site's command names --------------------------------------------------------------------------
def job_class(commands: Commands) -> type[SlurmJob]:
    """A SlurmJob whose state queries (sacct), cancel and interrupt use the site's command names."""

    class Watcher(SlurmInfoWatcher):
        def _make_command(self) -> list[str] | None:
            command = super()._make_command()
            return None if command is None else [commands.sacct, *command[1:]]

    class SiteJob(SlurmJob):
        _cancel_command = commands.scancel
        watcher = Watcher(delay_s=600)

        def _interrupt(self, timeout: bool = False) -> None:
            """Preemption (SIGTERM then USR2) or a time-out (USR2 alone), as submitit's helper sends them."""
            command = [commands.scancel, self.job_id, "--signal"]
            if not timeout:
                subprocess.check_call([*command, "SIGTERM"])
            subprocess.check_call([*command, "USR2"])

    return SiteJob


class SiteExecutor(SlurmExecutor):
    """submitit's SlurmExecutor with the site's command names for sbatch, srun, sacct and scancel.

    submitit writes `srun` into the batch script and calls `sbatch`; here the batch script's srun line starts with
    commands.srun, submission runs commands.sbatch, and job arrays are submitted by this class (submitit's own array
    path builds a plain SlurmExecutor).
    """

    def __init__(self, folder: str | Path, commands: Commands, max_num_timeout: int = 3, python: str | None = None,
                 check: bool = True):
        self.commands = commands
        self.job_class = job_class(commands)
        if check and shutil.which(commands.srun) is None:
            raise RuntimeError(f"{commands.srun!r} is not on PATH: submit from a node of the cluster, or name the "
                               "site's commands in the site file's [commands] table")
        super().__init__(folder, max_num_timeout=max_num_timeout, python=python)

    @classmethod
    def affinity(cls) -> int:
        return 2  # __init__ checks for the site's srun instead of submitit's plain one

    def _make_submission_command(self, submission_file_path: Path) -> list[str]:
        return [self.commands.sbatch, str(submission_file_path)]

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        text = super()._make_submission_file_text(command, uid)
        lines = text.split("\n")
        runs = [i for i, line in enumerate(lines) if line.startswith("srun ")]
        if len(runs) != 1:  # pragma: no cover - submitit writes exactly one srun line
            raise RuntimeError(f"expected one srun line in submitit's batch script, found {len(runs)}")
        lines[runs[0]] = shlex.quote(self.commands.srun) + lines[runs[0]][len("srun"):]
        return "\n".join(lines)

    def _internal_process_submissions(self, delayed_submissions: list[utils.DelayedSubmission]) -> list[core.Job]:
        if len(delayed_submissions) == 1:
            return super()._internal_process_submissions(delayed_submissions)
        # One array: as submitit's SlurmExecutor does it, with this class's commands.
        folder = utils.JobPaths.get_first_id_independent_folder(self.folder)
        folder.mkdir(parents=True, exist_ok=True)
        timeout_min = self.parameters.get("time", 5)
        pickle_paths = []
        for delayed in delayed_submissions:
            pickle_path = folder / f"{uuid.uuid4().hex}.pkl"
            delayed.set_timeout(timeout_min, self.max_num_timeout)
            delayed.dump(pickle_path)
            pickle_paths.append(pickle_path)
        array = SiteExecutor(self.folder, self.commands, self.max_num_timeout, self.python, check=False)
        array.update_parameters(**self.parameters)
        array.parameters["map_count"] = len(delayed_submissions)
        self._throttle()
        first = array._submit_command(self._submitit_command_str)
        tasks = list(range(first.num_tasks))
        jobs = [self.job_class(folder=self.folder, job_id=f"{first.job_id}_{i}", tasks=tasks)
                for i in range(len(delayed_submissions))]
        for job, pickle_path in zip(jobs, pickle_paths, strict=True):
            job.paths.move_temporary_file(pickle_path, "submitted_pickle")
        return jobs


def executor_parameters(spec: RunSpec, site: Site) -> dict[str, Any]:
    """submitit parameters of one run's job: nodes x tasks per node = world size, and the site's limits."""
    tasks_per_node = spec.world_size // spec.nodes
    threads = max(rank_threads(spec.threads_per_rank, r) for r in range(spec.world_size))
    params: dict[str, Any] = {
        "job_name": f"dtbench-{spec.suite}", "nodes": spec.nodes, "ntasks_per_node": tasks_per_node,
        "cpus_per_task": site.cpus_per_task or threads, "time": site.time_min,
        "signal_delay_s": site.signal_delay_s, "setup": list(site.setup), "stderr_to_stdout": True,
    }
    for name in ("partition", "account", "qos"):
        if getattr(site, name) is not None:
            params[name] = getattr(site, name)
    if site.mem_per_task_gb is not None:
        params["mem"] = f"{max(1, round(site.mem_per_task_gb * tasks_per_node * 1024))}M"
    if site.sbatch:
        params["additional_parameters"] = dict(site.sbatch)
    return params


# -- what every task of a job runs ---------------------------------------------------------------------------------
@dataclass
class SlurmRun:
    """One run as a submitit job: every task is one rank. Picklable; submitit calls it on each task.

    USR2 (SLURM's warning before the time limit, or a preemption sent as submitit does) and SIGTERM (a requeue or
    a cancel by the scheduler) make the ranks checkpoint after the same step and stop. After USR2, rank 0 asks
    SLURM to requeue the job (up to max_requeues times); after SIGTERM the scheduler decides. A requeued job
    resumes from the run's checkpoint. A run whose ranks make no progress for the spec's hang_timeout_s is failed
    and its job killed by the ranks' own hang watch (harness/launch/slurm_watch.py).
    """

    spec: RunSpec  # pickled into the job as it is: the ranks get its typed params without validating them again
    run_dir: str
    argv: list[str]
    commands: dict[str, str] = field(default_factory=dict)
    max_requeues: int = 3
    interface: str | None = None

    def __call__(self) -> str:
        import submitit

        from harness.launch.slurm_watch import StoreWatch
        from harness.net.listen import LOOPBACK, cluster_addresses, loopback_interface
        from harness.run.checkpoint import STOP
        from harness.run.heartbeat import Heartbeat, beat_interval
        from harness.run.worker import Rendezvous, run_rank

        STOP.install(requeue_on=(signal.SIGUSR2,), stop_on=(signal.SIGTERM,))
        dist_env = submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
        job = submitit.JobEnvironment()
        run_dir = Path(self.run_dir)
        restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
        if dist_env.rank == 0:
            write_status(run_dir, "running", slurm_job_id=job.job_id, restarts=restarts, hosts=job.hostnames)
        # The store listens on the one address the tasks dial (loopback when the job has one host), and gloo's
        # connections go over the site's interface, or loopback (harness/net/listen.py).
        dial, listen = cluster_addresses(dist_env.master_addr, list(job.hostnames), self.interface)
        if self.interface and dial != LOOPBACK:
            os.environ["GLOO_SOCKET_IFNAME"] = self.interface
        elif dial == LOOPBACK:
            os.environ["GLOO_SOCKET_IFNAME"] = loopback_interface()
        rdzv = Rendezvous(dial, dist_env.master_port, store_is_external=False, listen_addr=listen)
        timeout_s = self.spec.hang_timeout_s
        scancel = self.commands.get("scancel", "scancel")
        watch = StoreWatch(dist_env.rank, dist_env.world_size, rdzv.master_addr, rdzv.master_port, timeout_s,
                           lambda error: _end_hung_job(run_dir, job.job_id, restarts, scancel, error),
                           connect_timeout_s=rdzv.timeout_s)
        heartbeat = Heartbeat(watch.publish, beat_interval(timeout_s)).start()
        code = run_rank(self.spec, dist_env.rank, rdzv, self.run_dir, "slurm", True, self.argv, resume=True,
                        heartbeat=heartbeat)
        heartbeat.stop()
        watch.ended(failed=code != 0)
        if code != 0:
            error = _first_failure(run_dir, dist_env.world_size)
            write_status(run_dir, "failed", error=error, slurm_job_id=job.job_id, restarts=restarts)
            raise RuntimeError(error["message"])
        state = _state(run_dir)
        if state != "preempted":
            return state
        if dist_env.rank == 0 and STOP.requeue:
            if restarts < self.max_requeues:
                scontrol = self.commands.get("scontrol", "scontrol")
                subprocess.run([scontrol, "requeue", job.job_id], check=True, timeout=60)
            else:
                _add_note(run_dir, f"not requeued: {restarts} requeues already (max_requeues)")
        # No result for submitit: the job is requeued, or it ends by the scheduler's hand.
        sys.exit(0)

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """submitit's preemption hook (used only if USR2 comes before the ranks install their own handler): the
        same run again; it resumes from the run's last checkpoint."""
        import submitit

        return submitit.helpers.DelayedSubmission(self)


def _end_hung_job(run_dir: Path, job_id: str, restarts: int, scancel: str, error: dict) -> None:
    """The hang watch's verdict (harness/launch/slurm_watch.py): the run is failed naming the stalled rank, and
    every task of the job is killed (SIGKILL ends a stopped process too; no handler runs, so no rank writes a
    status after this one). Runs on a rank's heartbeat thread; this process ends here. A run that already failed
    keeps its own error (a rank that raised, then ended, looks stalled to the peers still waiting for it)."""
    if _failed_with_error(run_dir):
        error = None
    else:
        write_status(run_dir, "failed", error=error, slurm_job_id=job_id, restarts=restarts)
    message = error["message"] if error else "the run failed; its peers stalled"
    print(f"dtbench: {message}: killing job {job_id}", file=sys.stderr, flush=True)
    try:
        subprocess.run([scancel, "--signal=KILL", job_id], timeout=60, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"dtbench: {scancel} failed ({exc}); this rank exits, the stalled one lingers until the time limit",
              file=sys.stderr, flush=True)
    os._exit(1)


def _failed_with_error(run_dir: Path) -> bool:
    try:
        status = json.loads((run_dir / "status.json").read_text())
    except (OSError, ValueError):
        return False
    return status.get("state") == "failed" and bool((status.get("error") or {}).get("message"))


def _state(run_dir: Path) -> str:
    try:
        return json.loads((run_dir / "status.json").read_text()).get("state", "failed")
    except (OSError, ValueError):
        return "failed"


def _add_note(run_dir: Path, note: str) -> None:
    status = json.loads((run_dir / "status.json").read_text())
    status["note"] = f"{status.get('note') or ''}; {note}".lstrip("; ")
    write_json(run_dir / "status.json", status)


def _first_failure(run_dir: Path, world_size: int, settle_s: float = 2.0) -> dict:
    """The failing rank that failed first (by its error file), after a moment for peers' files to land."""
    time.sleep(settle_s)
    failed = [r for r in range(world_size) if (run_dir / ERROR_FILE.format(rank=r)).exists()]
    if not failed:
        return {"message": "a rank exited with an error (see logs/)", "rank": None}
    rank = min(failed, key=lambda r: (error_time(run_dir, r), r))
    return describe_failure(rank, 1, run_dir)


# -- submission ----------------------------------------------------------------------------------------------------
@dataclass
class Submitted:
    spec: RunSpec
    run_dir: Path
    job_id: str


def submit(runs: list[tuple[RunSpec, Path]], suite_dir: Path, site: Site, argv: list[str]) -> list[Submitted]:
    """Submit each (spec, prepared run folder) as a task of a job array; returns at once with the job ids.

    Runs with the same shape (nodes, tasks per node) go out as one array, so a suite whose runs share a shape is
    one array. Every run folder gets status.json `pending` with its job id, and suite_dir/slurm/jobs.json maps
    run ids to job ids for `dtbench status` and `dtbench wait`.
    """
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    folder = suite_dir / "slurm" / f"{stamp}-{uuid.uuid4().hex[:6]}"  # fresh: job ids can repeat across clusters
    shapes: dict[tuple[int, int], list[tuple[RunSpec, Path]]] = {}
    for spec, run_dir in runs:
        shapes.setdefault((spec.nodes, spec.world_size // spec.nodes), []).append((spec, run_dir))
    submitted: list[Submitted] = []
    for group in shapes.values():
        executor = SiteExecutor(folder, site.commands, python=site.python)
        executor.update_parameters(**executor_parameters(group[0][0], site))
        with executor.batch():
            jobs = [executor.submit(SlurmRun(spec, str(run_dir.resolve()), argv,
                                             site.commands.model_dump(), site.max_requeues, site.interface))
                    for spec, run_dir in group]
        for (spec, run_dir), job in zip(group, jobs, strict=True):
            write_status(run_dir, "pending", slurm_job_id=job.job_id, submitted=utc_now())
            submitted.append(Submitted(spec, run_dir, job.job_id))
    record_jobs(suite_dir, submitted, site, folder)
    return submitted


def record_jobs(suite_dir: Path, submitted: list[Submitted], site: Site, folder: Path) -> None:
    """suite_dir/slurm/jobs.json: the latest job id of every run (earlier submissions' entries are kept)."""
    path = suite_dir / "slurm" / JOBS_FILE
    try:
        jobs = json.loads(path.read_text())
    except (OSError, ValueError):
        jobs = {"runs": {}}
    jobs["commands"] = site.commands.model_dump()
    for item in submitted:
        jobs["runs"][item.spec.run_id] = {"job_id": item.job_id, "folder": str(folder)}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, jobs)
