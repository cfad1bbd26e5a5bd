"""Q-FB's bounded policy: a window's forwards and backwards on the weights one version behind (2BW's delay)."""

from __future__ import annotations

from torch import nn

from methods.pipeline.core.versions import WeightPolicy, Weights


class OneVersionBehind(WeightPolicy):
    """`sync = "bounded"`: the forwards of window t run on a copy of the weights taken when the window opens, before
    the update of window t-1 is applied, i.e. version t-1 (version k = after k updates); the backwards of window t
    differentiate that copy and their gradient updates the live weights. So W(t+1) = W(t) - lr · g(W(t-1)), the
    delay of PipeDream-2BW (Narayanan et al., ICML 2021), with W(-1) = W(0). At most two copies are held: the open
    window's and the one whose backwards still run."""

    def __init__(self, module: nn.Module):
        super().__init__(module)
        self.copies: dict[int, tuple[int, Weights]] = {}  # window -> (version, weights)
        self.current = -1

    def open_window(self, window: int) -> None:
        """Copy the live weights for the forwards of `window`; drop the copies windows before window-1 used."""
        self.copies[window] = (self.version, self.snapshot())
        self.current = window
        for old in [w for w in self.copies if w < window - 1]:
            del self.copies[old]

    def forward(self, mb: int) -> tuple[int, Weights | None]:
        return self.copies[self.current]

    def held(self) -> int:
        return len(self.copies)

    def planned_versions(self, in_flight: int) -> int:
        return 2

    def needs_stash(self) -> bool:
        return True
