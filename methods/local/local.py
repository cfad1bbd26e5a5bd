"""Local Parallelism (Laskin et al. 2020): chunks trained by local losses, activations flowing forward only."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import torch
from pydantic import Field
from torch import nn

from harness.comm.channel import KEPT_CREDITS, Receiver, Sender
from harness.data.tensors import Batch, TensorData
from harness.memory import (
    FirstSteps,
    LossBlock,
    MemoryBytes,
    chain_saved_bytes,
    footprints,
    gradient_bytes,
    optimizer_state_bytes,
    planned_optimizer_bytes,
    tensor_bytes,
    weight_bytes,
)
from harness.memory.passes import pass_peak
from harness.memory.step import batch_bytes, step_plan
from harness.memory.update import clip_temporaries, optimizer_step_temporaries
from harness.method import EvalResult, Method, RunContext, StepStats, TrainParams
from harness.optim import clip_gradients, make_optimizer
from methods.blocks import SUMS_WIDTH, classifier_sums, default_parts, eval_mode, evaluate_chain, output_shapes, too_few
from methods.local.parts import chunk_ranges, make_head, path_ranges


class LocalParams(TrainParams):
    variant: Literal["chunked", "greedy", "overlapping"] = "chunked"
    chunks: int | None = Field(default=None, ge=1,
                               description="number of chunks; default: the world size (2 in the virtual mode)")
    depth: int = Field(default=4, ge=1, description="activations in flight between two ranks, at most")
    head: Literal["auto", "dgl", "linear", "mlp", "lm"] = "auto"
    head_hidden: int = Field(default=128, ge=1)


class Local(Method):
    """Local parallelism. The block list is cut into chunks c = 1..C; chunk c has an auxiliary head (the last
    chunk ends with the network's own classifier) and its own optimizer. For every global batch (x, y):

        h_0 = x
        for each chunk c (on its own rank, concurrently):
            h_c = f_c(stopgrad(h_{c-1}))              h_{c-1} arrives from rank c-1 with its sample ids
            L_c = CE(head_c(h_c), y[ids])             labels come from the chunk's own data pipeline
            w_c <- opt(w_c, grad L_c)                 no gradient crosses a chunk boundary (grad_clip: clipped
                                                      to the norm of chunk c's own gradient, each chunk a learner)
            send h_c to rank c+1                      returns at once unless `depth` are already in flight

    World size 1 with C > 1 chunks is the virtual mode: all chunks in one process, run in order every step, with the
    same numerics (rank c+1 only ever sees h_c computed from w_c before its update, as here).

    The overlapping variant shares a block between consecutive chunks: chunk c's last block is chunk c+1's first.
    Chunk c hands on the input u of that shared block, and chunk c+1 starts from stopgrad(u), so the shared block is
    trained by both losses and the network path runs every block once. The shared block's output v = shared(u) is
    computed once and feeds both head_c and chunk c+1's next block; each loss's backward accumulates into its own
    chunk's parameters only (autograd's `inputs`), which is the gradient of chunk c+1 recomputing shared(stopgrad(u)).
    It runs in the virtual mode only, since two ranks cannot share one block's weights without synchronising them.
    """

    name = "local"
    family = "local"
    summary = "Local Parallelism: chunks with auxiliary heads, forward-only activations (Laskin et al. 2020)"
    Params = LocalParams

    @classmethod
    def check_world_size(cls, world_size: int, params: LocalParams) -> str | None:
        if world_size > 1 and params.variant == "overlapping":
            return "the overlapping variant runs in the virtual mode only (world_size = 1)"
        if world_size > 1 and params.chunks not in (None, world_size):
            return f"chunks = {params.chunks} but world_size = {world_size}: one chunk per rank (or world_size 1)"
        return super().check_world_size(world_size, params)

    @classmethod
    def check_model(cls, world_size: int, params: LocalParams, model: Callable[[], nn.Sequential]
                    ) -> tuple[str, str] | None:
        """Every chunk needs a block; greedy makes one chunk per block, so on several ranks one rank per block."""
        blocks = len(model())
        if params.variant == "greedy":
            if world_size > 1 and world_size != blocks:
                return "world_size", (f"the greedy variant runs one block per rank: world_size = {world_size}, but "
                                      f"the workload's model has {blocks} blocks")
            return None
        chunks = default_parts(params.chunks, world_size)
        if chunks > blocks:
            return "chunks" if params.chunks is not None or world_size == 1 else "world_size", \
                too_few(chunks, "chunks", blocks)
        return None

    def __init__(self, ctx: RunContext):
        super().__init__(ctx)
        p = ctx.params
        model = ctx.workload.make_model().to(ctx.device)  # built first, so it starts from sgd's initial weights
        self.ranges = chunk_ranges(len(model), default_parts(p.chunks, ctx.world_size), p.variant)
        if ctx.world_size > 1 and len(self.ranges) != ctx.world_size:
            raise ValueError(f"local: the {p.variant} variant cuts the model's {len(model)} blocks into "
                             f"{len(self.ranges)} chunks, but the run has {ctx.world_size} ranks (one chunk per rank)")
        shapes = output_shapes(list(model), ctx.workload.train.inputs(torch.arange(2)).to(ctx.device))
        self.blocks = [model[start:end] for start, end in self.ranges]  # overlapping: neighbours share a module
        self.path = [model[start:end] for start, end in path_ranges(self.ranges)]  # every block once, in order
        self.shared = p.variant == "overlapping"
        self.heads = [make_head(p.head, shapes[end - 1], ctx.workload.classes, p.head_hidden).to(ctx.device)
                      for _, end in self.ranges[:-1]] + [nn.Identity()]
        self.virtual = ctx.world_size == 1
        self.mine = list(range(len(self.ranges))) if self.virtual else [ctx.rank]
        parameters = {id(q): q for c in self.mine for m in (self.blocks[c], self.heads[c]) for q in m.parameters()}
        self.optimizer = make_optimizer(parameters.values(), p)  # shared blocks (overlapping) appear once
        self.sender = self.receiver = None
        if not self.virtual and ctx.rank < ctx.world_size - 1:
            self.sender = Sender(ctx.comm, ctx.rank + 1, p.depth)
        if not self.virtual and ctx.rank > 0:
            self.receiver = Receiver(ctx.comm, ctx.rank - 1, shapes[self.ranges[ctx.rank][0] - 1])
        self.shapes = shapes
        self.first_steps = FirstSteps()  # the held bytes measured on the first steps

    def chunk_parameters(self, c: int) -> list[nn.Parameter]:
        """Chunk c's blocks' and head's parameters (a shared block's with chunk c's: both losses train it)."""
        return [q for m in (self.blocks[c], self.heads[c]) for q in m.parameters()]

    def train_step(self, batch: Batch) -> StepStats:
        device, p = self.ctx.device, self.ctx.params
        if self.receiver is None:
            h, ids = batch.inputs(), batch.indices
        else:
            h, ids = self.receiver.recv(len(batch))
            if not torch.equal(ids, batch.indices):
                raise RuntimeError(f"rank {self.ctx.rank}: activations of step {batch.step} carry other sample ids "
                                   f"than the step's batch: the queue lost its order")
        y = batch.targets(ids).to(device)
        h = h.to(device)
        with self.first_steps.watch(self._modules()):
            h, losses = self._forward(h, y)
            self.optimizer.zero_grad(set_to_none=True)
            self._backward(losses)
        self.first_steps.record(q for m in self._modules() for q in m.parameters())
        if p.grad_clip is not None:
            for c in self.mine:
                clip_gradients(self.chunk_parameters(c), p.grad_clip)
        self.optimizer.step()
        extra: dict[str, Any] = {}
        if self.virtual:
            extra["chunk_losses"] = [loss.item() for loss in losses]
        if self.sender is not None:
            before = self.sender.stats.wait_s
            self.sender.send(h.detach().cpu(), ids)
            extra.update(queue_wait_s=self.sender.stats.wait_s - before, in_flight=self.sender.in_flight())
        return StepStats(loss=losses[-1].item(), extra=extra)

    def _forward(self, h: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """This rank's chunks in order from input h: (the last chunk's output, each chunk's loss)."""
        losses = []
        for c in self.mine:
            # Disjoint chunks start from a detached input. Overlapping ones cannot (u feeds chunk c's own shared
            # block), so there each loss's backward is confined to its chunk's parameters instead.
            h = self.path[c](h if self.shared else h.detach())
            losses.append(self.ctx.workload.loss(self.heads[c](h), y))
        return h, losses

    def _backward(self, losses: list[torch.Tensor]) -> None:
        """Each chunk's loss into its own chunk's gradients."""
        if self.shared:
            for k, (c, loss) in enumerate(zip(self.mine, losses, strict=True)):
                inputs = [q for m in (self.blocks[c], self.heads[c]) for q in m.parameters()]
                if inputs:  # an empty `inputs` would mean every leaf
                    torch.autograd.backward(loss, inputs=inputs, retain_graph=k < len(losses) - 1)
        else:
            torch.stack(losses).sum().backward()  # chunk inputs are detached: each loss reaches its own chunk

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.optimizer]

    # -- memory: planned before the first step, measured on the first steps ----------------------------------------
    def _modules(self) -> list[nn.Module]:
        return [m for c in self.mine for m in (self.blocks[c], self.heads[c])]

    def _built_modules(self) -> list[nn.Module]:
        """Every chunk's blocks and head: each rank builds the whole model and every head (from the same seed, so
        that all start from sgd's weights) and keeps them, training only its own."""
        return [*self.path, *self.heads]

    def memory_plan(self) -> dict[int, MemoryBytes]:
        """This rank's chunks (all of them in the virtual mode), composed from a step's phases (harness/memory/
        step.py). Held throughout: weights (of every chunk: each rank builds them all), the optimizer's state, the
        step's input (the batch's x on the first rank, the activations received on the others, with their ids) and
        y, and the channel's buffers (the sender's `depth` messages in flight: outputs of earlier steps, kept until
        their credit is back; the receiver's last credits). Phases, profiled with the allocator on a batch
        (pass_peak): the forwards, while the last step's gradients are still alive (they are zeroed after the
        forwards); the backward, from no gradients; clipping and the optimizer step beside every gradient and the
        chunk's output (alive until it is sent). Activations are also counted alone, as the saved bytes of the
        forwards (footprints), less the step's input (counted as inputs)."""
        train, device, loss_fn, p = self.ctx.workload.train, self.ctx.device, self.ctx.workload.loss, self.ctx.params
        samples = min(len(train), p.batch_size)
        index = torch.arange(samples)
        h, y = train.inputs(index).to(device), train.targets(index).to(device)
        activations = 0
        for c in range(len(self.ranges)):
            if c == self.mine[0]:
                x = h
            if c in self.mine:
                prints = footprints([*self.path[c], self.heads[c], LossBlock(loss_fn, y)], h.detach())
                activations += chain_saved_bytes(prints, 0, len(prints))
                if c == self.mine[0] and prints[0].saves_input:  # the step's input: counted as inputs
                    activations -= prints[0].input_bytes
            with torch.no_grad(), eval_mode([self.path[c]]):
                h = self.path[c](h)
            if c == self.mine[-1]:
                out = h
        modules = self._modules()
        gradients = gradient_bytes(modules)
        forward = pass_peak(lambda: self._forward(x, y), modules, device)
        passes = pass_peak(lambda: self._backward(self._forward(x, y)[1]), modules, device)
        output = tensor_bytes([out])  # this rank's last chunk's output, alive through the update
        clip = max((clip_temporaries(self.chunk_parameters(c)) for c in self.mine), default=0) \
            if p.grad_clip is not None else 0
        ids = samples * torch.empty((), dtype=torch.int64).element_size()
        step_input = batch_bytes(train, samples, targets=False) if self.receiver is None else tensor_bytes([x]) + ids
        held = MemoryBytes(weights=weight_bytes(self._built_modules()), gradients=gradients,
                           optimizer=planned_optimizer_bytes(self.optimizer), activations=activations,
                           buffers=self._planned_channel_bytes(output, ids),
                           inputs=step_input + batch_bytes(train, samples, inputs=False))
        phases = {"forward": gradients + forward, "backward": passes, "clipping": gradients + output + clip,
                  "update": gradients + output + optimizer_step_temporaries(self.optimizer)}
        return {self.ctx.rank: step_plan(held, phases)}

    def _planned_channel_bytes(self, output: int, ids: int) -> int:
        """The sender's `depth` messages in flight (an output, the int64 credit awaited for it and the ids, where
        this rank received them: on the CPU `.cpu()` sends the output itself) and the receiver's credits:
        KEPT_CREDITS and the newest, sent before it lets go of the oldest."""
        credit = torch.empty((), dtype=torch.int64).element_size()
        # the ids sent on: the batch's own (a view of the data order) on the first rank, received ones after it
        own = ids if self.receiver is not None else 0
        sender = self.ctx.params.depth * (output + own + credit) if self.sender is not None else 0
        return sender + ((KEPT_CREDITS + 1) * credit if self.receiver is not None else 0)

    def memory_held(self) -> dict[int, MemoryBytes]:
        channel = ([] if self.sender is None else self.sender.held(ids=self.receiver is not None)) + \
            ([] if self.receiver is None else self.receiver.held())
        now = MemoryBytes(weights=weight_bytes(self._built_modules()), optimizer=optimizer_state_bytes(self.optimizer),
                          buffers=tensor_bytes(channel))
        return {self.ctx.rank: self.first_steps.held.peak(now)}

    def evaluate(self, test: TensorData) -> EvalResult | None:
        """Every chunk's head on the whole test set, through the chain; the last chunk's is the method's number."""
        loss_fn = self.ctx.workload.loss
        rank_of = [0 if self.virtual else c for c in range(len(self.ranges))]
        input_shapes = [()] + [self.shapes[start - 1] for start, _ in path_ranges(self.ranges)[1:]]
        with eval_mode([m for c in self.mine for m in (self.blocks[c], self.heads[c])]):
            sums = evaluate_chain({c: self.path[c] for c in self.mine}, rank_of, input_shapes, test, self.ctx.comm,
                                  self.ctx.params.eval_batch_size, self.ctx.device,
                                  lambda c, h, y: classifier_sums(self.heads[c](h), y, loss_fn), width=SUMS_WIDTH)
        per_chunk = (sums[:, :2] / sums[:, 2:]).tolist()
        return EvalResult(accuracy=per_chunk[-1][0], loss=per_chunk[-1][1],
                          extra={"head_accuracy": [a for a, _ in per_chunk], "head_loss": [lo for _, lo in per_chunk]})

    def finish(self) -> None:
        if self.sender is not None:
            self.sender.drain()
        if self.receiver is not None:
            self.receiver.drain()

    @property
    def checkpointable(self) -> bool:
        """Only the virtual (one-process) mode: with several ranks, activations in flight on the forward channel
        are part of the state and are not saved."""
        return self.virtual

    def state_dict(self) -> dict[str, Any]:
        return {"blocks": [self.blocks[c].state_dict() for c in self.mine],
                "heads": [self.heads[c].state_dict() for c in self.mine], "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for c, blocks, head in zip(self.mine, state["blocks"], state["heads"], strict=True):
            self.blocks[c].load_state_dict(blocks)
            self.heads[c].load_state_dict(head)
        self.optimizer.load_state_dict(state["optimizer"])
