"""The parameters every pipeline method takes: stages, partition, replicas, the wire codecs, tracing."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from harness.method import TrainParams

#: The names of methods/pipeline/core/codecs.py's CODECS (a test keeps the two equal).
CodecName = Literal["none", "fp16", "int8", "int4"]


class PipelineParams(TrainParams):
    stages: int | None = Field(default=None, ge=1,
                               description="pipeline stages; default: one per rank (2 in the virtual mode)")
    partition: Literal["uniform", "auto"] | list[int] = Field(
        default="uniform", description="'uniform' (equal block counts), 'auto' (profile, then the partitioner), or "
                                       "the first block of every stage after the first, e.g. [2] for 2 stages")
    replicas: list[int] | Literal["auto"] | None = Field(
        default=None, description="replicas of each stage, e.g. [2, 1]: stage 0 on two ranks (its microbatches round "
                                  "robin over them, gradients all-reduced before each update); world size = sum. "
                                  "'auto' (with partition 'auto', where the method plans replication): PipeDream's "
                                  "DP chooses stages and replicas over all ranks (at most `stages` stages if set)")
    bandwidth: float = Field(default=1e9, gt=0, description="bytes/s between stages, for the 'auto' partitioner")
    activation_codec: CodecName = Field(default="none", description="how activations cross stages (none = fp32)")
    gradient_codec: CodecName = Field(default="none", description="how activation gradients cross stages")
    trace_steps: int = Field(default=4, ge=0, description="steps (from step 1) whose full per-action trace is logged")

    @field_validator("partition")
    @classmethod
    def _increasing(cls, v: Any) -> Any:
        if isinstance(v, list) and (any(b < 1 for b in v) or v != sorted(set(v))):
            raise ValueError("stage boundaries must be increasing block indices >= 1")
        return v

    @field_validator("replicas")
    @classmethod
    def _positive(cls, v: list[int] | str | None) -> list[int] | str | None:
        if isinstance(v, list) and (not v or any(r < 1 for r in v)):
            raise ValueError("replicas must list at least one stage, each with at least 1 replica")
        return v
