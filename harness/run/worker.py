"""The per-rank entry point every launcher calls: process setup, torch.distributed, the run, and its files."""

from __future__ import annotations

import datetime
import json
import os
import random
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harness.run.heartbeat import Heartbeat
    from harness.suite.spec import RunSpec

ERROR_FILE = "error-rank{rank}.json"


@dataclass(frozen=True)
class Rendezvous:
    """How ranks find each other. `store_is_external`: a launcher already serves a TCPStore at addr:port
    (the local launcher); otherwise rank 0 hosts it (SLURM, where every task is a peer), listening on `listen_addr`
    only (default: master_addr's address; harness/net/listen.py)."""

    master_addr: str
    master_port: int
    store_is_external: bool = True
    timeout_s: float = 120.0
    listen_addr: str | None = None


def _redirect_output(run_dir: Path, rank: int) -> None:
    """Send this process's stdout and stderr (file descriptors, so C++ logs too) to logs/rank<r>.log."""
    logs = run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    fd = os.open(logs / f"rank{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _init_distributed(rank: int, world_size: int, rdzv: Rendezvous, backend: str):
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=rdzv.timeout_s)
    if rank == 0 and not rdzv.store_is_external:  # on the one address it must serve, never on every interface
        from harness.net.listen import hosted_store

        store = hosted_store(rdzv.listen_addr or rdzv.master_addr, world_size, rdzv.master_port, rdzv.timeout_s)
    else:
        store = dist.TCPStore(rdzv.master_addr, rdzv.master_port, world_size, is_master=False, timeout=timeout,
                              wait_for_workers=False)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
    return dist.group.WORLD


class StartupClock:
    """Seconds of each start-up phase of a rank, in order: `mark(name)` ends the phase `name` (begun at the last
    mark, or at the rank's entry). With `launched_at` (the launcher's time.time() when it started the process), the
    first phase, `process`, is the process start itself: fork or interpreter, and the imports before the entry."""

    def __init__(self, launched_at: float | None = None):
        self.phases: dict[str, float] = {}
        if launched_at is not None:
            self.phases["process"] = round(max(0.0, time.time() - launched_at), 6)
        self._last = time.perf_counter()

    def mark(self, name: str) -> None:
        now = time.perf_counter()
        self.phases[name] = round(now - self._last, 6)
        self._last = now


def run_rank(spec: RunSpec, rank: int, rdzv: Rendezvous, run_dir: str, launcher: str = "local",
             redirect: bool = True, argv: list[str] | None = None, resume: bool = False,
             network: dict | None = None, launched_at: float | None = None,
             heartbeat: Heartbeat | None = None) -> int:
    """Run one rank of a run to the end. Returns the process exit code (0: the run ended, completed, diverged or
    preempted; status.json says which). `spec` is the run as the launcher has it, its params the method's Params
    as they were validated before the run (RunSpec): the rank does not validate them again.

    With `resume`, the newest valid checkpoint in `run_dir` (checkpoint.pt, else checkpoint.prev.pt; see
    _load_checkpoint) is continued from (metrics.jsonl is cut back to it first); without one the run starts at step
    0. `network`: the emulated network the launcher built (Topology.describe()), recorded
    in manifest.json. `launched_at`: the launcher's time.time() when it started this process, for the `startup`
    record. `heartbeat`: this rank's harness.run.heartbeat.Heartbeat (started by the launcher), which the loop
    tells where each step begins and ends, for the hang watch. On an exception the traceback goes to the rank's log
    and its first line to error-rank<r>.json, which the launcher reads to name the failing rank in status.json.
    """
    startup = StartupClock(launched_at)
    run_path = Path(run_dir)
    if redirect:
        _redirect_output(run_path, rank)
    try:
        return _run(spec, rank, rdzv, run_path, launcher, argv, resume, network, startup, heartbeat)
    except BaseException as exc:  # noqa: BLE001 - everything a rank dies of is reported
        traceback.print_exc()
        message = f"{type(exc).__name__}: {exc}".splitlines()[0][:2000]
        (run_path / ERROR_FILE.format(rank=rank)).write_text(json.dumps({"rank": rank, "message": message}))
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def _load_checkpoint(spec, run_dir: Path, rank: int, comm) -> tuple[dict | None, dict | None]:
    """(the checkpoint to continue from or None, the `resume` record or None when there was no checkpoint file).

    Rank 0 verifies the files (sha256 and spec hash, newest first: harness/run/checkpoint_files.py), renames the
    rejected ones aside, cuts metrics.jsonl back to the chosen checkpoint (to nothing when none is valid: the run
    starts over) and says which in its log; the other ranks load the file it chose, checked against the sha256 it
    verified. Collective.
    """
    from harness.comm.states import broadcast_state
    from harness.run import checkpoint, checkpoint_files

    shared: list = [None, None, None]  # file, sha256, record
    choice = None
    if rank == 0:
        choice = checkpoint_files.choose(run_dir, checkpoint_files.spec_hash(spec.model_dump_json()), load=True)
        checkpoint_files.quarantine(run_dir, choice)
        checkpoint.truncate_metrics(run_dir / "metrics.jsonl", choice.saved["metrics_bytes"] if choice.saved else 0)
        if choice.found_files:
            print(f"dtbench: --resume: {choice.describe()}", flush=True)
        shared = [choice.file, choice.sha256, choice.record() if choice.found_files else None]
    if comm.world_size > 1:  # around the Communicator, like the checkpoint's own traffic; no pickle (states.py)
        shared = broadcast_state(shared, src=0, group=comm.group)
    name, sha256, record = shared
    if choice is not None:
        saved = choice.saved
    else:
        saved = checkpoint_files.load_verified(run_dir / name, sha256) if name else None
        if record is not None:
            print(f"dtbench: --resume: {'from ' + name if name else 'no valid checkpoint, from step 0'} "
                  f"(rank 0's choice)", flush=True)
    comm.barrier()  # no rank writes a record before the file is cut back
    return saved, record


def _refuse(run_dir: Path, rank: int, comm, writer, message: str, planned, budget: int | None) -> int:
    """End a run that does not fit its memory_per_rank before its first step: status `does_not_fit` with the one
    line (rank 0 writes it), nothing trained, the group closed cleanly."""
    import torch.distributed as dist

    from harness.run import memory_gate
    from harness.run.records import write_status

    if rank == 0:
        print(f"dtbench: {message}", flush=True)
        write_status(run_dir, "does_not_fit", error={"message": message, "rank": None},
                     final={"steps": 0, "planned_memory_bytes": memory_gate.peak(planned), "memory_per_rank": budget})
    writer.close()
    comm.barrier()
    dist.destroy_process_group()
    return 0


def _run(spec: RunSpec, rank: int, rdzv: Rendezvous, run_dir: Path, launcher: str, argv: list[str] | None,
         resume: bool = False, network: dict | None = None, startup: StartupClock | None = None,
         heartbeat: Heartbeat | None = None) -> int:
    import numpy as np
    import torch
    import torch.distributed as dist

    from harness import registry
    from harness.comm.communicator import Communicator
    from harness.memory import DoesNotFit, refusal
    from harness.memory.peak import AllocatorPeak
    from harness.method import RunContext
    from harness.run import allocator, manifest, memory_gate
    from harness.run.clock import TrainClock
    from harness.run.loop import Loop
    from harness.run.records import MetricsWriter, write_json, write_status
    from harness.suite.spec import rank_threads

    malloc = allocator.configure(spec.allocator)  # before the model and data allocate anything big
    if spec.cpus_per_rank is not None:  # a heterogeneous set-up: this rank confined to its CPUs
        os.sched_setaffinity(0, spec.cpus_per_rank[rank])
    torch.set_num_threads(rank_threads(spec.threads_per_rank, rank))
    if spec.deterministic:
        torch.use_deterministic_algorithms(True)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", rank % torch.cuda.device_count()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    startup = startup or StartupClock()
    startup.mark("setup")
    group = _init_distributed(rank, spec.world_size, rdzv, "nccl" if cuda else "gloo")
    comm = Communicator(rank, spec.world_size, group)
    startup.mark("rendezvous")

    saved, resume_record = _load_checkpoint(spec, run_dir, rank, comm) if resume else (None, None)
    clock = TrainClock(*((saved["train_time_s"], saved["wall_time_s"]) if saved else ()))
    writer = MetricsWriter(run_dir / "metrics.jsonl", rank, clock)
    if rank == 0:
        info = manifest.build(spec.seed, launcher, run_dir, spec.threads_per_rank, argv,
                              network or (spec.network.model_dump() if spec.network else None))
        info["allocator"] = malloc
        if saved:
            info["resumed_from_step"] = saved["step"]
        if resume_record is not None:
            info["resume"] = resume_record
        write_json(run_dir / "manifest.json", info)
    startup.mark("files")

    # Same seed on every rank: identical initial weights, and identical across methods for the same workload.
    random.seed(spec.seed)
    np.random.seed(spec.seed)
    torch.manual_seed(spec.seed)
    instance = registry.WORKLOADS.get(spec.workload).instantiate(spec.workload_options, spec.data_root)
    if rank == 0 and instance.provenance:  # where the data came from (a corpus's hashes), next to the code's
        info["data"] = instance.provenance
        write_json(run_dir / "manifest.json", info)
    startup.mark("workload")
    method_cls = registry.METHODS.get(spec.method)
    ctx = RunContext(rank=rank, world_size=spec.world_size, device=device, workload=instance, params=spec.params,
                     comm=comm, seed=spec.seed, run_dir=run_dir, log=writer.write, memory_per_rank=spec.memory_per_rank)
    torch.manual_seed(spec.seed)
    # From here: the data set is not in it, everything the method makes is; measured from the method's steady state.
    meter = AllocatorPeak(device, first=method_cls.steady_from(spec.world_size, spec.params))
    meter.start()
    try:
        method = method_cls(ctx)
    except DoesNotFit as exc:  # a planner found nothing that fits memory_per_rank
        meter.stop()
        return _refuse(run_dir, rank, comm, writer, str(exc), None, spec.memory_per_rank)
    plan = method.memory_plan()  # before the per-rank RNG: a plan may profile (inside the watch: it is the method's)
    meter.pause()  # the plan's gather across ranks and the records below are the runner's, not the method's
    planned = memory_gate.gather(plan, comm, device)
    torch.manual_seed(spec.seed + 1 + rank)  # per-rank stream for stochastic methods (compression, dropout)
    if rank == 0:
        writer.write("memory", when="planned", memory_per_rank=spec.memory_per_rank,
                     per_rank=memory_gate.record(planned))
    if spec.memory_per_rank is not None:
        problem = (f"does not fit: method {spec.method!r} plans no memory, so memory_per_rank cannot be checked"
                   if planned is None else refusal(planned, spec.memory_per_rank))
        if problem:
            meter.stop()
            method.finish()
            return _refuse(run_dir, rank, comm, writer, problem, planned, spec.memory_per_rank)
    startup.mark("method")

    loop = Loop(spec, method, instance.train, instance.test, comm, writer, clock, run_dir, heartbeat, meter)
    if spec.checkpoint_every_steps and not loop.checkpointable and rank == 0:
        print(f"dtbench: method {spec.method!r} does not support checkpoints: checkpoint_every_steps is ignored "
              "and a preempted run starts over", flush=True)
    if saved:
        loop.restore(saved)
    outcome = loop.run()
    meter.stop()  # a run shorter than the window ends it here
    held = memory_gate.gather(method.memory_held(), comm, device)
    peaks = memory_gate.gather_peaks(meter.peak, comm, device)
    if rank == 0:
        writer.write("memory", when="held", memory_per_rank=spec.memory_per_rank, per_rank=memory_gate.record(held))
        writer.write("memory", when="allocator", steps=meter.measured, first_step=meter.first,
                     per_rank={str(r): b for r, b in sorted(peaks.items())} if peaks else None)
    method.finish()
    writer.write("comm", bytes_by_category=comm.ledger.by_category(), seconds_by_category=dict(comm.ledger.seconds),
                 calls_by_category=dict(comm.ledger.calls))
    writer.write("startup", seconds_by_phase=startup.phases)
    if rank == 0:
        sent, recv = comm.ledger.training_bytes()
        final = {"steps": outcome.steps, "epoch": outcome.epoch, "samples": outcome.samples,
                 "train_time_s": clock.train(), "wall_time_s": clock.wall(),
                 "rank0_bytes_sent": sent, "rank0_bytes_recv": recv, "planned_memory_bytes": memory_gate.peak(planned),
                 "held_memory_bytes": memory_gate.peak(held),
                 "allocator_peak_bytes": max(peaks.values()) if peaks else None,
                 "memory_per_rank": spec.memory_per_rank}
        if outcome.last_eval:
            final.update({k: outcome.last_eval[k] for k in ("test_accuracy", "test_loss") if k in outcome.last_eval})
        extra = {"slurm_job_id": manifest.slurm_job_id()} if launcher == "slurm" else {}
        if resume_record is not None:
            extra["resume"] = resume_record
        if outcome.state == "preempted":  # not an error: the run goes on when it is resumed
            write_status(run_dir, outcome.state, final=final, note=outcome.message, **extra)
        else:
            error = {"message": outcome.message, "rank": None} if outcome.message else None
            write_status(run_dir, outcome.state, error=error, final=final, **extra)
    writer.close()
    comm.barrier()
    dist.destroy_process_group()
    return 0
