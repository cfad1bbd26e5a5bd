"""The base of methods that hold the whole model on every rank (sgd, ddp, compressed ddps): step, evaluation, state."""

from __future__ import annotations

import abc
from typing import Any

import torch
from torch import nn

from harness.data.tensors import Batch, TensorData
from harness.evaluation import evaluate_classifier
from harness.memory import (
    FirstSteps,
    LossBlock,
    MemoryBytes,
    chain_saved_bytes,
    footprints,
    gradient_bytes,
    optimizer_state_bytes,
    planned_optimizer_bytes,
    weight_bytes,
)
from harness.memory.passes import pass_peak
from harness.memory.step import batch_bytes, step_plan
from harness.memory.update import clip_temporaries, optimizer_step_temporaries
from harness.method import EvalResult, Method, RunContext, StepStats
from harness.optim import clip_gradients


class WholeModelMethod(Method):
    """for each step: (x, y) = the samples this rank trains on; g = grad L(w; x, y); g <- g · min(1, c / |g|) when
    grad_clip = c; w <- optimizer(w, g).

    Subclasses build `self.model` (what runs the forward: the network itself, or its DistributedDataParallel
    wrapper) and `self.optimizer`, and say which samples a rank takes (`local_batch`). The plain network is
    `self.network`; evaluation, checkpoints and tests read it.
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer
    #: Whether the step clips the gradient the optimizer sees to grad_clip (its global norm: after DDP's all-reduce
    #: every rank holds the same averaged gradient, so the same norm). DGC clips each rank's own gradient instead.
    clips_update: bool = True

    @property
    def network(self) -> nn.Module:
        """The plain model (unwrapped from DistributedDataParallel where it is wrapped)."""
        return getattr(self.model, "module", self.model)

    @abc.abstractmethod
    def local_batch(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, labels) this rank trains on at this step."""

    def __init__(self, ctx: RunContext):
        super().__init__(ctx)
        self.first_steps = FirstSteps()  # the held bytes measured on the first steps

    def local_samples(self) -> int:
        """Samples this rank trains on per step (the global batch; a data-parallel rank its shard)."""
        return self.ctx.params.batch_size

    def activation_samples(self) -> int:
        """Samples of the largest forward whose activations are held at once (this rank's samples; ddp with
        gradient accumulation: its largest microbatch). The memory plan prices the activations of this many."""
        return self.local_samples()

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The step's forward and backward on this rank's samples, leaving the gradient in the parameters'
        .grad; returns the loss on them (ddp with gradient accumulation runs it per microbatch)."""
        loss = self.ctx.workload.loss(self.model(x), y)
        loss.backward()
        return loss

    def train_step(self, batch: Batch) -> StepStats:
        x, y = self.local_batch(batch)
        x, y = x.to(self.ctx.device), y.to(self.ctx.device)
        self.optimizer.zero_grad(set_to_none=True)
        with self.first_steps.watch([self.network]):
            loss = self.forward_backward(x, y)
        if self.clips_update:
            clip_gradients(self.model.parameters(), self.ctx.params.grad_clip)
        self.first_steps.record(self.network.parameters())
        self.optimizer.step()
        return StepStats(loss=loss.item())

    # -- memory: planned before the first step, measured on the first steps --------------------------------------

    def planned_buffer_bytes(self) -> int:
        """Communication and compression state this rank will hold (none: one process)."""
        return 0

    def held_buffer_bytes(self) -> int:
        """The same, measured now."""
        return 0

    def planned_hook_bytes(self) -> int:
        """What the communication hook allocates and frees while it runs, at its most, beyond the buffers (none:
        one process). It runs once the backward has made every gradient of its bucket."""
        return 0

    def memory_plan(self) -> dict[int, MemoryBytes]:
        """Held throughout: weights, the optimizer's state, the buffers and this rank's (x, y). On top of them, the
        step's largest phase (harness/memory/step.py): the forward and backward of one forward's samples (of its
        largest microbatch under gradient accumulation, where a later one adds into the gradients the first made),
        profiled with the allocator on the model before the first step (gradients, saved activations, backward's
        transients); the communication hook's payloads beside every gradient (and the loss with its seed gradient,
        alive until backward returns); clipping's and the optimizer step's
        temporaries beside every gradient (harness/memory/update.py). Activations are also counted alone, as the
        saved bytes of that forward (footprints), for the breakdown."""
        train, device, loss_fn = self.ctx.workload.train, self.ctx.device, self.ctx.workload.loss
        index = torch.arange(min(len(train), self.activation_samples()))
        x, y = train.inputs(index).to(device), train.targets(index).to(device)
        prints = footprints([*self.network, LossBlock(loss_fn, y)], x)
        net = [self.network]
        gradients = gradient_bytes(net)
        passes = pass_peak(lambda: loss_fn(self.network(x), y).backward(), net, device)
        if self.activation_samples() < self.local_samples():  # a later microbatch adds into the gradients
            passes = max(passes, gradients + pass_peak(lambda: loss_fn(self.network(x), y).backward(), net, device,
                                                       accumulate=True))
        clip = clip_temporaries(self.network.parameters()) if self.clips_update and self.ctx.params.grad_clip else 0
        held = MemoryBytes(weights=weight_bytes(net), gradients=gradients,
                           optimizer=planned_optimizer_bytes(self.optimizer),
                           activations=chain_saved_bytes(prints, 0, len(prints)), buffers=self.planned_buffer_bytes(),
                           inputs=batch_bytes(train, self.local_samples()))
        # the hook runs inside the backward, beside the loss and the seed gradient backward started from (0-dim)
        root = 2 * torch.empty((), dtype=torch.get_default_dtype()).element_size()
        phases = {"forward and backward": passes, "communication": gradients + root + self.planned_hook_bytes(),
                  "clipping": gradients + clip, "update": gradients + optimizer_step_temporaries(self.optimizer)}
        return {self.ctx.rank: step_plan(held, phases)}

    def memory_held(self) -> dict[int, MemoryBytes]:
        now = MemoryBytes(weights=weight_bytes([self.network]), optimizer=optimizer_state_bytes(self.optimizer),
                          buffers=self.held_buffer_bytes())
        return {self.ctx.rank: self.first_steps.held.peak(now)}

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.optimizer]

    def evaluate(self, test: TensorData) -> EvalResult:
        return evaluate_classifier(self.network, test, self.ctx.workload.loss, self.ctx.comm,
                                   self.ctx.params.eval_batch_size, self.ctx.device)

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.network.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.network.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
