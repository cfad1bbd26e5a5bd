"""GPipe (Huang et al., NeurIPS 2019): all forwards, then all backwards, then one synchronous update."""

from __future__ import annotations

from methods.pipeline.flushed import schedules as schedule
from methods.pipeline.flushed.base import ExchangedPipeline


class GPipe(ExchangedPipeline):
    """for each minibatch, cut into M microbatches:
        stage s: forward(0..M-1) (receiving from s-1, sending to s+1)
                 backward(0..M-1) (receiving from s+1, sending to s-1), gradients accumulated
                 update: the flush
    Bubble: (S-1)/(M+S-1) of each stage's time is idle."""

    name = "gpipe"
    summary = "GPipe: synchronous pipeline, M microbatches, all forwards then all backwards (Huang et al. 2019)"
    make_schedule = staticmethod(schedule.gpipe)
