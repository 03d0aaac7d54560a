"""ElasticBSP: every round, ZipLine picks the barrier with the least waiting within a lookahead."""
from __future__ import annotations

import numpy as np
import numpy.typing as npt

from horovod_hetero.rules.zipline import predict_ends, zipline
from horovod_hetero.strategies.planned import RoundPlanned
from horovod_hetero.validation import check_int


class ElasticBSP(RoundPlanned):
    """ElasticBSP: each rank runs the local steps that put the next barrier where waiting is least.

    Zhao et al., "Elastic Bulk Synchronous Parallel Model for Distributed Deep Learning" (ZipLine,
    ``rules.zipline``). The paper's parameter server predicts each worker's next R iteration end
    times from the interval between its two latest pushes and picks, per worker, the iteration
    after which the barrier minimises the total waiting. On Horovod the barrier is the averaging
    round (one fused allreduce of the model): it carries every rank's mean step time since the
    previous round, so after it every rank predicts the same end times (every rank leaves the
    round together, so rank p's i-th iteration ends at ``i * step_s[p]``; the round's own cost
    delays every rank alike and leaves the choice unchanged), runs ZipLine on the same inputs and
    gets the same plan; no server and no extra message. Each rank then runs its chosen number of
    local steps and enters the next round. Ties go to the earliest barrier. At a job's start
    the first two rounds come after one step each (the first step is start-up, not speed); after
    ``sync_model()`` the first round is planned from the speeds measured before it; the plan
    follows a change of speed from the next round on.

    Args:
        lookahead: R, an int >= 1: iterations predicted per rank (the most local steps per round).

    Example:
        >>> s = ElasticBSP(lookahead=15)
        >>> s.plan_steps(np.array([0.1, 0.1, 0.1, 0.4]))
        [4, 4, 4, 1]

    With Horovod::

        opt = hh.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                      strategy=hh.ElasticBSP(lookahead=15))
    """

    def __init__(self, lookahead: int = 15) -> None:
        super().__init__()
        self.lookahead = check_int("lookahead", lookahead, 1)

    def plan_steps(self, step_s: npt.NDArray[np.float64]) -> list[int]:
        return zipline(predict_ends(np.zeros(len(step_s)), step_s, self.lookahead)).steps.tolist()

    @property
    def label(self) -> str:
        return f"ElasticBSP(R={self.lookahead})"

    def __repr__(self) -> str:
        return f"ElasticBSP(lookahead={self.lookahead})"
