"""One pipeline stage's numerics: forward and backward of a microbatch under a weight-version policy and a backward
mode, the update, the replicas' gradient sync, and the memory it holds."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn
from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight
from torch.func import functional_call

from harness.memory import optimizer_state_bytes, saved_bytes, tensor_bytes
from harness.optim import clip_gradients
from methods.pipeline.core.versions import WeightPolicy

#: graph: differentiate the graph the forward built, with the weights the forward used (live, stashed or predicted).
#: stashed: the same, and the forward must have used a stashed version (PipeDream's weight stashing).
#: saved: differentiate the graph the forward built (its activations, ReLU masks, normalisation statistics) with the
#:     weights current at backward time in place of the forward's copy (Pipelined Backpropagation as its paper runs
#:     it: the weight gradient from the forward's activations, the input gradient through the current weights).
#: current: the forward keeps only its input; the backward recomputes the stage with the weights current at backward
#:     time and differentiates that (the weight inconsistency at the price of an extra forward; activations, masks
#:     and statistics then come from weights the forward never saw).
BackwardMode = Literal["graph", "stashed", "saved", "current"]
Key = tuple[int, int]  # (iteration, microbatch)


@dataclass
class _Saved:
    inputs: torch.Tensor
    output: torch.Tensor | None  # the stage output, or the scaled loss on the last stage (None in `current` mode)
    version: int
    weights: dict[str, torch.Tensor] | None
    activation_bytes: int
    buffer_bytes: int = 0  # the received input and the output sent on, kept until the backward (MemoryBytes.buffers)
    targets: torch.Tensor | None = None
    scale: float = 1.0
    cells: list[weakref.ref[_Cell]] | None = None  # what the saved-tensor hooks packed (_SavedBytes)


class _Cell:
    """One saved tensor, as the hook packed it."""

    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: torch.Tensor):
        self.tensor: torch.Tensor | None = tensor


class _SavedBytes:
    """saved_tensors_hooks that add up the storage bytes autograd keeps for a backward, parameters excluded. Each
    saved tensor is packed in a cell that only autograd holds (the stage keeps a weak reference), so it is freed
    as the backward releases the node that saved it, as without the hooks; the stage empties the cells still alive
    once the microbatch's backward is done (`drop`): a node that saves its own output (ReLU) holds it through the
    hook's value, a cycle through autograd's C++ nodes that Python's collector cannot see, which a graph kept by
    `retain_graph` (zero-bubble's B) would never free."""

    def __init__(self, exclude: set[int]):
        self.exclude, self.seen = exclude, {}
        self.cells: list[weakref.ref[_Cell]] = []

    @property
    def total(self) -> int:
        return sum(self.seen.values())

    def pack(self, tensor: torch.Tensor) -> _Cell:
        pointer = tensor.untyped_storage().data_ptr()
        if pointer not in self.exclude and pointer not in self.seen:
            self.seen[pointer] = saved_bytes(tensor)
        cell = _Cell(tensor)
        self.cells.append(weakref.ref(cell))
        return cell

    @staticmethod
    def unpack(cell: _Cell) -> torch.Tensor:
        if cell.tensor is None:
            raise RuntimeError("a saved tensor was used after its microbatch's backward was done")
        return cell.tensor


def drop(cells: list[weakref.ref[_Cell]] | None) -> None:
    """Let go of the tensors a microbatch's graph saved that autograd still holds (its backward is done: nothing
    will unpack them)."""
    for ref in cells or ():
        cell = ref()
        if cell is not None:
            cell.tensor = None


@dataclass
class HeldBytes:
    """What a stage held at its peak since the last reset: activation bytes kept for backwards (autograd's saved
    tensors besides the stage's input and output), microbatches in flight, weight bytes of versions held besides the
    live weights (stashes, predictions), and buffer bytes: the received inputs (the stored inputs in `current` mode)
    and the outputs sent on that the stage keeps for its backwards (the plan's buffers: the messages' tensors)."""

    activation_bytes: int = 0
    microbatches: int = 0
    weight_bytes: int = 0
    buffer_bytes: int = 0

    def peak(self, other: HeldBytes) -> HeldBytes:
        """Each field's larger value."""
        return HeldBytes(max(self.activation_bytes, other.activation_bytes),
                         max(self.microbatches, other.microbatches), max(self.weight_bytes, other.weight_bytes),
                         max(self.buffer_bytes, other.buffer_bytes))


class Stage:
    """Blocks [start, end) of the model, with their optimizer, weight-version policy and backward mode.

    The last stage turns outputs into the loss: loss_fn(output, y) * scale, where `scale` is the microbatch's share
    of the minibatch (its size over the minibatch size), so the gradients summed over the microbatches are those of
    the minibatch's mean loss, as single-process SGD computes them.
    """

    def __init__(self, index: int, stages: int, module: nn.Module, optimizer: torch.optim.Optimizer,
                 policy: WeightPolicy, loss_fn: Callable[..., torch.Tensor], backward_mode: BackwardMode = "graph"):
        self.index, self.stages, self.module = index, stages, module
        self.optimizer, self.policy, self.loss_fn = optimizer, policy, loss_fn
        self.backward_mode = backward_mode
        self.first, self.last = index == 0, index == stages - 1
        self._params = dict(module.named_parameters())
        self.clip_norm: float | None = None  # grad_clip, where the stage clips its own gradient (PipelineMethod)
        self.param_bytes = sum(p.numel() * p.element_size() for p in self._params.values())
        self._saved: dict[Key, _Saved] = {}
        # B done, W not yet: its graph's state, its activation and buffer bytes, its saved tensors' cells
        self._weight_pending: dict[Key, tuple[list, int, int, list | None]] = {}
        self.loss_sum = 0.0  # the loss accumulated by the last stage since the last `take_loss`
        self.backwards_since_update = 0
        self.peak = HeldBytes()  # since the last take_peak (a step's)
        self.run_peak = HeldBytes()  # over the run
        self.gradient_bytes = self.optimizer_bytes = 0  # the most gradient and optimizer-state bytes seen at updates

    # -- forward and backward -------------------------------------------------------------------------------------
    def forward(self, key: Key, x: torch.Tensor, y: torch.Tensor | None = None, scale: float = 1.0) -> torch.Tensor:
        """Run the forward of microbatch `key` = (iteration, mb); returns the output to send on (the loss on the last
        stage). The policy chooses the weights by mb."""
        version, weights = self.policy.forward(key[1])
        if self.backward_mode in ("stashed", "saved") and weights is None and self.policy.needs_stash():
            raise RuntimeError(f"stage {self.index}: backward mode {self.backward_mode!r} but the policy gave the "
                               f"live weights")
        if self.backward_mode == "current":
            with torch.no_grad():
                out = self._run(x, weights, y, scale)
            self._saved[key] = _Saved(x, None, version, None, 0, 0 if self.first else tensor_bytes([x]), y, scale)
        else:
            if not self.first:
                x = x.detach().requires_grad_(True)
            # the weights are held anyway, the input as the received message (or the batch), the output as the sent
            exclude = {p.untyped_storage().data_ptr() for p in self._params.values()} | {x.untyped_storage().data_ptr()}
            if weights is not None:
                exclude |= {w.untyped_storage().data_ptr() for w in weights.values()}
            counter = _SavedBytes(exclude)
            with torch.autograd.graph.saved_tensors_hooks(counter.pack, counter.unpack):
                out = self._run(x, weights, y, scale)
            if not self.last:
                counter.seen.pop(out.untyped_storage().data_ptr(), None)
            kept = (0 if self.first else tensor_bytes([x])) + (0 if self.last else tensor_bytes([out]))
            self._saved[key] = _Saved(x, out, version, weights, counter.total, kept, cells=counter.cells)
        if self.last:
            self.loss_sum += out.item()
        self._note_memory()
        return out

    def _run(self, x: torch.Tensor, weights: dict[str, torch.Tensor] | None, y: torch.Tensor | None,
             scale: float) -> torch.Tensor:
        out = self.module(x) if weights is None else functional_call(self.module, weights, (x,))
        return self.loss_fn(out, y) * scale if self.last else out

    def backward(self, key: Key, grad_output: torch.Tensor | None = None) -> torch.Tensor | None:
        """Run the backward of microbatch `key`; the parameter gradient is added to the live parameters' .grad.
        Returns the gradient w.r.t. the stage input (None on the first stage)."""
        saved = self._saved.pop(key)
        x = saved.inputs
        buffers = None
        if self.backward_mode == "current":  # recompute with the live weights; buffers (BN statistics) restored below
            buffers = {name: b.clone() for name, b in self.module.named_buffers()}
            if not self.first:
                x = x.detach().requires_grad_(True)
            with torch.enable_grad():
                output = self._run(x, None, saved.targets, saved.scale)
            weights = None
        else:
            output, weights = saved.output, saved.weights
            if self.backward_mode == "saved" and weights is not None:
                # The forward's copy takes the current values without a version bump (autograd saved it and would
                # refuse an in-place change): its graph's activations stay the forward's, its weights are now's.
                for name, w in weights.items():
                    w.data.copy_(self._params[name].data)
        if weights is None:  # the live weights: autograd accumulates into their .grad, as loss.backward() does
            wrt = list(self._params.values())
        else:  # a stash or a prediction: its leaves collect the gradient, which then moves to the live parameters
            wrt = [weights[name] for name in self._params]
        torch.autograd.backward(output, grad_output, inputs=wrt if self.first else [*wrt, x])
        drop(saved.cells)
        if buffers is not None:  # the recompute counted the microbatch in the running statistics again: undo it
            with torch.no_grad():
                for name, b in self.module.named_buffers():
                    b.copy_(buffers[name])
        if weights is not None:
            for p, w in zip(self._params.values(), wrt, strict=True):
                if w.grad is None:
                    continue
                if p.grad is None:
                    p.grad = w.grad
                else:
                    p.grad.add_(w.grad)
                w.grad = None  # a stash can serve several minibatches (stashed once per version)
        self.policy.backward_done(key[1])
        self.backwards_since_update += 1
        return None if self.first else x.grad

    def backward_input(self, key: Key, grad_output: torch.Tensor | None = None) -> torch.Tensor | None:
        """Zero-bubble B: the gradient w.r.t. the stage input only, returned to send back; what the weight gradient
        needs (the gradients arriving at the weights' graph nodes) is kept for `backward_weight`. autograd's own
        split, as torch.distributed.pipelining's stage does it (stage_backward_input). The first stage has no input
        gradient: its B is the whole backward and its W does nothing. Live weights and the `graph` mode only (the
        flushed pipelines)."""
        if self.backward_mode != "graph":
            raise RuntimeError(f"stage {self.index}: a split backward needs backward mode 'graph', not "
                               f"{self.backward_mode!r}")
        if self.first:
            self.backward(key, grad_output)
            return None
        saved = self._saved.pop(key)
        if saved.weights is not None:
            raise RuntimeError(f"stage {self.index}: a split backward differentiates the live weights only")
        grads, groups = stage_backward_input([saved.output], None if grad_output is None else [grad_output],
                                             [saved.inputs], iter(self._params.values()))
        self._weight_pending[key] = (groups, saved.activation_bytes, saved.buffer_bytes, saved.cells)
        return grads[0]

    def backward_weight(self, key: Key) -> None:
        """Zero-bubble W: the weight gradient of microbatch `key`, from what its B kept, added to the parameters'
        .grad (stage_backward_weight); nothing on the first stage (its B did it)."""
        if self.first:
            return
        groups, _, _, cells = self._weight_pending.pop(key)
        stage_backward_weight(iter(self._params.values()), groups)
        drop(cells)
        self.policy.backward_done(key[1])
        self.backwards_since_update += 1
        self._note_memory()

    def version_of(self, key: Key) -> int:
        """The weight version the forward of `key` used."""
        return self._saved[key].version

    def backward_version_of(self, key: Key) -> int:
        """The weight version the backward of `key` will differentiate: the forward's, or in `saved` and `current`
        modes the live one (the updates since the forward are its delay)."""
        return self.policy.version if self.backward_mode in ("current", "saved") else self._saved[key].version

    # -- update and the replicas' gradient sync ----------------------------------------------------------------------
    def flat_gradients(self) -> torch.Tensor:
        """Every parameter's gradient (zeros where none) in one flat fp32 tensor, in parameter order."""
        return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                          for p in self._params.values()])

    def set_gradients(self, flat: torch.Tensor) -> None:
        """The inverse of flat_gradients: write `flat` into the parameters' .grad."""
        offset = 0
        for p in self._params.values():
            n = p.numel()
            if p.grad is None:
                p.grad = flat[offset:offset + n].view_as(p).clone()
            else:
                p.grad.copy_(flat[offset:offset + n].view_as(p))
            offset += n

    def update(self, squared_norm: torch.Tensor | None = None) -> None:
        """The optimizer step on the accumulated gradients, then clear them: the next weight version. With clip_norm
        set the gradients are first clipped to it: by the global norm when `squared_norm` (the sum of squares over
        every stage) is given, else by this stage's own."""
        if self.clip_norm is not None:
            clip_gradients(self._params.values(), self.clip_norm, squared_norm)
        self.policy.before_update()
        self.gradient_bytes = max(self.gradient_bytes, tensor_bytes(p.grad for p in self._params.values()))
        self.optimizer.step()
        self.optimizer_bytes = max(self.optimizer_bytes, optimizer_state_bytes(self.optimizer))
        self.optimizer.zero_grad(set_to_none=True)
        self.policy.updated()
        self.backwards_since_update = 0
        self._note_memory()

    # -- loss and memory --------------------------------------------------------------------------------------------
    def take_loss(self) -> float:
        loss, self.loss_sum = self.loss_sum, 0.0
        return loss

    def in_flight(self) -> int:
        return len(self._saved)

    def held(self) -> HeldBytes:
        """What the stage holds now for backwards still to come (a snapshot of the saved microbatches, taken in one
        step, so that another thread may add or remove one meanwhile)."""
        saved = list(self._saved.values())
        pending = list(self._weight_pending.values())  # a W still to run holds its graph, its input and output
        weights = {id(s.weights) for s in saved if s.weights is not None}
        versions = max(len(weights), self.policy.held())
        return HeldBytes(sum(s.activation_bytes for s in saved) + sum(p[1] for p in pending),
                         len(saved) + len(pending), versions * self.param_bytes,
                         sum(s.buffer_bytes for s in saved) + sum(p[2] for p in pending))

    def _note_memory(self) -> None:
        now = self.held()
        self.peak, self.run_peak = now.peak(self.peak), now.peak(self.run_peak)

    def take_peak(self) -> HeldBytes:
        """The peak since the last call (the current holding starts the next period)."""
        peak, self.peak = self.peak, self.held()
        return peak
