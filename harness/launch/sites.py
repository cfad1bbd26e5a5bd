"""Site profiles: where and how SLURM jobs are submitted on a cluster (partition, limits, setup, command names)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from harness.suite.files import load_toml


class Commands(BaseModel):
    """The scheduler's command names. Tianhe's SLURM is driven with yhbatch, yhrun, yhqueue, yhcancel, yhacct and
    yhcontrol; a site file names them here and dtbench (and submitit under it) runs those."""

    model_config = ConfigDict(extra="forbid")

    sbatch: str = Field(default="sbatch", min_length=1)
    srun: str = Field(default="srun", min_length=1)
    squeue: str = Field(default="squeue", min_length=1)
    scancel: str = Field(default="scancel", min_length=1)
    sacct: str = Field(default="sacct", min_length=1)
    scontrol: str = Field(default="scontrol", min_length=1)


class Site(BaseModel):
    """A site profile (TOML, see docs/slurm.md). Every field is optional: the defaults suit a plain SLURM."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str = "default"
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time_min: int = Field(default=60, ge=1, description="time limit of one job (one attempt), in minutes")
    cpus_per_task: int | None = Field(default=None, ge=1,
                                      description="default: the run's threads_per_rank")
    mem_per_task_gb: float | None = Field(default=None, gt=0)
    setup: list[str] = Field(default_factory=list, description="shell lines run before the ranks start")
    python: str | None = Field(default=None, min_length=1,
                               description="how to start python on the nodes (default: this one)")
    sbatch: dict[str, str | int | bool] = Field(default_factory=dict, description="more #SBATCH flags")
    signal_delay_s: int = Field(default=90, ge=0, description="USR2 this long before the time limit")
    max_requeues: int = Field(default=3, ge=0, description="requeues after preemption or time-out, per run")
    interface: str | None = Field(default=None, min_length=1,
                                  description="multi-node runs: the network interface the ranks reach each other on "
                                              "(gloo's GLOO_SOCKET_IFNAME; the rendezvous store listens on its "
                                              "address where the first node's name resolves to loopback there)")
    commands: Commands = Field(default_factory=Commands)


def load_site(path: str | Path | None) -> Site:
    """The site profile at `path` (None: the defaults). Raises FileError with one line naming file and field."""
    if path is None:
        return Site()
    return load_toml(path, Site, "site file")[0]
