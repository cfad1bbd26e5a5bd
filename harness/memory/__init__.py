"""Emulated device memory: what a rank holds by kind, planned and measured, the budget check, and the allocator's
peak as the ground truth both are judged against. The names below are re-exported from the modules that define them."""

from harness.memory.budget import DoesNotFit, refusal
from harness.memory.count import (
    gradient_bytes,
    optimizer_state_bytes,
    planned_optimizer_bytes,
    state_tensors,
    storages,
    tensor_bytes,
    weight_bytes,
)
from harness.memory.kinds import KINDS, MEASURED_STEPS, MemoryBytes
from harness.memory.passes import pass_peak
from harness.memory.peak import peak_of
from harness.memory.profile import Footprint, LossBlock, as_they_were, chain_saved_bytes, footprints
from harness.memory.saved import FirstSteps, SavedTensors, saved_bytes
from harness.memory.step import batch_bytes, step_plan
from harness.memory.update import SCALAR_OPERANDS, clip_temporaries, optimizer_path, optimizer_step_temporaries

__all__ = ["KINDS", "MEASURED_STEPS", "SCALAR_OPERANDS", "DoesNotFit", "FirstSteps", "Footprint", "LossBlock",
           "MemoryBytes", "SavedTensors", "as_they_were", "batch_bytes", "chain_saved_bytes", "clip_temporaries",
           "footprints",
           "gradient_bytes", "optimizer_path", "optimizer_state_bytes", "optimizer_step_temporaries", "pass_peak",
           "peak_of", "planned_optimizer_bytes", "refusal", "saved_bytes", "state_tensors", "step_plan", "storages",
           "tensor_bytes", "weight_bytes"]
