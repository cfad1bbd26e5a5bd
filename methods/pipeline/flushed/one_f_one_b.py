"""1F1B with a flush (PipeDream-Flush, Narayanan et al., ICML 2021): one forward, one backward, a synchronous update."""

from __future__ import annotations

from methods.pipeline.flushed import schedules as schedule
from methods.pipeline.flushed.base import ExchangedPipeline


class OneFOneB(ExchangedPipeline):
    """for each minibatch, cut into M microbatches:
        stage s: min(S-1-s, M) warm-up forwards
                 then one forward and one backward in turn
                 then the remaining backwards (cool-down), gradients accumulated
                 update: the flush
    The same bubble as GPipe, (S-1)/(M+S-1), but at most S-s microbatches' activations held at stage s (GPipe: M)."""

    name = "1f1b"
    summary = "1F1B with a flush (PipeDream-Flush): synchronous pipeline, bounded activation memory"
    make_schedule = staticmethod(schedule.one_f_one_b)
