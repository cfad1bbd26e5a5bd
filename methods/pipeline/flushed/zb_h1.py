"""ZB-H1 (Qi et al., ICLR 2024): 1F1B with each backward split into B and W, W deferred into the bubble."""

from __future__ import annotations

from methods.pipeline.flushed import schedules as schedule
from methods.pipeline.flushed.base import ExchangedPipeline


class ZBH1(ExchangedPipeline):
    """for each minibatch, cut into M microbatches:
        stage s: min(S-1-s, M) warm-up forwards
                 then one forward and one B (input gradient, sent back at once) in turn, each W (weight
                 gradient) run up to s B passes later
                 then the remaining B passes, and the deferred W passes
                 update: the flush
    B and W come from autograd (torch.distributed.pipelining's stage_backward_input / stage_backward_weight: B keeps
    the gradients of the graph's weight-adjacent nodes, W differentiates the weights from them), so B + W is one
    backward's work and the step is 1F1B's SGD step. Bubble (S-1)(T_F + T_B - T_W) against 1F1B's
    (S-1)(T_F + T_B + T_W), at 1F1B's peak memory."""

    name = "zb-h1"
    summary = "ZB-H1 zero-bubble pipeline: 1F1B with split backward, W deferred (Qi et al. 2024)"
    make_schedule = staticmethod(schedule.zb_h1)
    backward_split = True
