"""Q-FB's prototype reading (sync = "ahead"): each forward runs on the weight version its place in the stream fixes."""

from __future__ import annotations

import threading

from torch import nn

from methods.pipeline.core.versions import WeightPolicy, Weights
from methods.pipeline.qfb.schedule import ahead_version


class AheadVersions(WeightPolicy):
    """The weights of a stage whose forward lane runs `lead` microbatches ahead of its backward lane, with an update
    after every M backwards (methods/pipeline/qfb/schedule.py, qfb_ahead_tick).

    The forward of microbatch n (n = window·M + mb, counted over the run) uses version v(n) = ahead_version(n, lead,
    M), the updates that come before it in the stage's list, whichever lane runs first: the forward waits until v(n)
    exists, and reads a copy of it when a later update may already have been applied (two lanes) or will come before
    its backward (v(n) < n // M), so the run is the same with one lane or two, from run to run. Its backward
    differentiates those weights (the forward's graph), and the gradient joins the update after the window's last
    backward: a delay of n // M - v(n) ≤ ceil((lead - 1) / M) updates. With lead 1 (every forward after the backward
    before it) nothing is copied and the run is sgd's. At most ceil(lead / M) + 1 copies are held."""

    #: Seconds a forward waits for its version before it gives up (a lost backward would otherwise hang the lane).
    wait_s = 600.0

    def __init__(self, module: nn.Module, lead: int, microbatches: int):
        super().__init__(module)
        self.lead, self.microbatches = lead, microbatches
        self.window = 0
        self.copies: dict[int, Weights] = {0: self.snapshot()} if lead > 1 else {}
        self.changed = threading.Condition()
        self.failed: str | None = None

    def open_window(self, window: int) -> None:
        """The runner step whose forwards run next (microbatch mb of it is n = window·M + mb)."""
        self.window = window

    def forward(self, mb: int) -> tuple[int, Weights | None]:
        n = self.window * self.microbatches + mb
        version = ahead_version(n, self.lead, self.microbatches)
        with self.changed:
            if not self.changed.wait_for(lambda: self.version >= version or self.failed is not None, self.wait_s):
                raise RuntimeError(f"the forward of microbatch {n} waited {self.wait_s:.0f} s for weight version "
                                   f"{version}")
            if self.failed is not None:
                raise RuntimeError(self.failed)
            if self.lead == 1:  # v(n) = n // M: no update can come before its backward, nor during this forward
                return version, None
            for old in [v for v in self.copies if v < version]:
                del self.copies[old]
            return version, self.copies[version]

    def updated(self) -> None:
        with self.changed:
            super().updated()
            if self.lead > 1:
                self.copies[self.version] = self.snapshot()
            self.changed.notify_all()

    def abort(self, reason: str) -> None:
        with self.changed:
            self.failed = reason
            self.changed.notify_all()

    def held(self) -> int:
        return len(self.copies)

    def planned_versions(self, in_flight: int) -> int:
        return -(-self.lead // self.microbatches) + 1 if self.lead > 1 else 0

    def needs_stash(self) -> bool:
        return self.lead > 1
