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
from harness.memory.profile import Footprint, LossBlock, chain_saved_bytes, footprints
from harness.memory.saved import FirstSteps, SavedTensors, saved_bytes

__all__ = ["KINDS", "MEASURED_STEPS", "DoesNotFit", "FirstSteps", "Footprint", "LossBlock", "MemoryBytes",
           "SavedTensors", "chain_saved_bytes", "footprints", "gradient_bytes", "optimizer_state_bytes",
           "planned_optimizer_bytes", "refusal", "saved_bytes", "state_tensors", "storages", "tensor_bytes",
           "weight_bytes"]
