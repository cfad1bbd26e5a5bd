"""PipeDream's weight stashing (Narayanan et al., SOSP 2019): a forward's weights kept for its backward."""

from __future__ import annotations

from torch import nn

from methods.pipeline.core.versions import WeightPolicy, Weights


class Stashed(WeightPolicy):
    """PipeDream's weight stashing (Narayanan et al., SOSP 2019, section 3.3).

    The forward of minibatch t uses the newest weights and stashes them; the backward of t differentiates the stash,
    and the resulting gradient updates the live weights. Stage s of S thus keeps up to S-s versions (one per
    minibatch in flight). A stash is a detached copy made only when an update will come before the backward (at
    `delay` > 0), and shared by consecutive forwards of the same version.

    Vertical sync (optional): every stage runs the forward of minibatch t with version max(0, t - (S-1)), the version
    stage 0 used, so a minibatch sees one consistent set of weights across stages. The stage must then keep the
    versions it made in its last s updates as well.
    """

    def __init__(self, module: nn.Module, delay: int, stage: int = 0, stages: int = 1, vertical_sync: bool = False):
        super().__init__(module)
        self.delay, self.stage, self.stages, self.vertical_sync = delay, stage, stages, vertical_sync
        self._versions: dict[int, Weights] = {}
        self._users: dict[int, set[int]] = {}  # version -> minibatches whose backward still needs it
        self._of: dict[int, int] = {}  # minibatch -> version
        if vertical_sync:
            self._versions[0] = self.snapshot()

    def wanted_version(self, mb: int) -> int:
        lag = self.stages - 1 if self.vertical_sync else self.delay
        return max(0, mb - lag)

    def forward(self, mb: int) -> tuple[int, Weights | None]:
        if not self.vertical_sync:
            if self.delay == 0:  # the backward comes before the next update: the live weights are the stash
                return self.version, None
            if self.version not in self._versions:
                self._versions[self.version] = self.snapshot()
            version = self.version
        else:
            version = self.wanted_version(mb)
            if version not in self._versions:
                raise RuntimeError(f"stage {self.stage}: version {version} for minibatch {mb} was not kept "
                                   f"(live version {self.version})")
        self._users.setdefault(version, set()).add(mb)
        self._of[mb] = version
        return version, self._versions[version]

    def backward_done(self, mb: int) -> None:
        version = self._of.pop(mb, None)
        if version is None:
            return
        self._users[version].discard(mb)
        self._prune()

    def updated(self) -> None:
        super().updated()
        if self.vertical_sync:
            self._versions[self.version] = self.snapshot()
        self._prune()

    def _prune(self) -> None:
        if self.vertical_sync:
            # The next forwards want versions >= (live - s): older ones without pending backwards can go.
            oldest_wanted = max(0, self.version - self.stage)
            keep = lambda v: v >= oldest_wanted or self._users.get(v)  # noqa: E731
        else:
            keep = lambda v: v == self.version or self._users.get(v)  # noqa: E731
        for v in [v for v in self._versions if not keep(v)]:
            del self._versions[v]
            self._users.pop(v, None)

    def held(self) -> int:
        return len(self._versions)

    def planned_versions(self, in_flight: int) -> int:
        """A stash per minibatch in flight (each made under its own version); with vertical sync also the versions
        of the last s updates."""
        if self.vertical_sync:
            return in_flight + self.stage + 1
        return in_flight if self.delay > 0 else 0

    def needs_stash(self) -> bool:
        return self.vertical_sync or self.delay > 0
