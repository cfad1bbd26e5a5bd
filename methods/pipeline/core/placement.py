"""Where stages run: each stage's replicas as ranks, which replica owns a microbatch, and a stage schedule placed."""

from __future__ import annotations

from dataclasses import dataclass

from harness.comm.communicator import Communicator
from harness.schedule.ir import Action, Op, Schedule


@dataclass(frozen=True)
class Placement:
    """stage_ranks[s]: the ranks holding a replica of stage s (one rank each without replication). A rank may hold
    several stages (interleaved schedules) or a replica of one. Microbatch (or minibatch) mb of stage s runs on
    replica mb mod r_s: PipeDream's round robin (1F1B-RR), the same for every iteration."""

    stage_ranks: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        if not self.stage_ranks or any(not group for group in self.stage_ranks):
            raise ValueError("every stage needs at least one rank")
        if any(len(set(group)) != len(group) for group in self.stage_ranks):
            raise ValueError(f"a rank may not hold two replicas of one stage: {self.stage_ranks}")
        if {r for group in self.stage_ranks for r in group} != set(range(self.world_size)):
            raise ValueError(f"ranks must be 0..W-1, each holding some stage: {self.stage_ranks}")

    @classmethod
    def one_per_rank(cls, stages: int) -> Placement:
        return cls(tuple((s,) for s in range(stages)))

    @classmethod
    def replicated(cls, replicas: list[int]) -> Placement:
        """Stage s on r_s consecutive ranks, stages in order: [2, 1] -> stage 0 on ranks 0, 1; stage 1 on rank 2."""
        groups, start = [], 0
        for r in replicas:
            if r < 1:
                raise ValueError(f"replica counts must be at least 1, got {replicas}")
            groups.append(tuple(range(start, start + r)))
            start += r
        return cls(tuple(groups))

    @classmethod
    def interleaved(cls, ranks: int, chunks: int) -> Placement:
        """Stage s on rank s mod p: rank r holds stages r, r + p, ..., r + (v-1)p (torch's 'loop' style)."""
        return cls(tuple((s % ranks,) for s in range(ranks * chunks)))

    @property
    def num_stages(self) -> int:
        return len(self.stage_ranks)

    @property
    def world_size(self) -> int:
        return 1 + max(r for group in self.stage_ranks for r in group)

    def replicas(self, stage: int) -> int:
        return len(self.stage_ranks[stage])

    def owner(self, stage: int, mb: int) -> int:
        """The rank that runs microbatch (or minibatch) `mb` at `stage`."""
        group = self.stage_ranks[stage]
        return group[mb % len(group)]

    def stages_of(self, rank: int) -> list[int]:
        """The stages a rank holds (a replica of each), in order."""
        return [s for s, group in enumerate(self.stage_ranks) if rank in group]

    def ranks_of(self, stage: int) -> tuple[int, ...]:
        return self.stage_ranks[stage]


def place(stage_schedule: Schedule, placement: Placement) -> Schedule:
    """A schedule given per stage (worker = stage) -> one list per rank, for placements with one stage per rank
    (replicated or not). Each replica keeps the actions of the microbatches it owns; SYNC_GRADS and UPDATE go to every
    replica. At a replicated stage a schedule's UPDATE without a SYNC_GRADS before it gets one (round = the number of
    updates before it), so that the replicas' gradients are summed before every update."""
    if len(stage_schedule) != placement.num_stages:
        raise ValueError(f"schedule has {len(stage_schedule)} stages, the placement {placement.num_stages}")
    out: Schedule = [[] for _ in range(placement.world_size)]
    for s, actions in enumerate(stage_schedule):
        group = placement.ranks_of(s)
        if any(len(placement.stages_of(r)) > 1 for r in group):
            raise ValueError("place() needs one stage per rank; schedules with several stages per rank are made "
                             "per rank (e.g. interleaved_1f1b)")
        updates = 0
        for i, a in enumerate(actions):
            if a.op in (Op.SYNC_GRADS, Op.UPDATE):
                if a.op is Op.UPDATE and len(group) > 1 and (i == 0 or actions[i - 1].op is not Op.SYNC_GRADS):
                    for r in group:
                        out[r].append(Action(Op.SYNC_GRADS, s, updates, a.iteration))
                for r in group:
                    out[r].append(a)
                updates += a.op is Op.UPDATE
            else:
                out[placement.owner(s, a.mb)].append(a)
    return out


def replica_comms(comm: Communicator, placement: Placement) -> dict[int, Communicator]:
    """A communicator per replicated stage, over its replicas (collective: every rank creates every group)."""
    comms = {}
    for s in range(placement.num_stages):
        group = list(placement.ranks_of(s))
        if len(group) > 1:
            sub = comm.subgroup(group)
            if sub is not None:
                comms[s] = sub
    return comms
