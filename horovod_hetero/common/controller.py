"""The per-rank driver shared by the torch wrapper and the Keras callbacks.

The adapters only say "a local step happened" and provide the fused averaging collective;
the controller asks the strategy whether to synchronise, runs the round, simulates slowdown
and records telemetry. It imports no framework.
"""
import time

from horovod_hetero.common.rounds import RoundProtocol
from horovod_hetero.common.straggler import Slowdown
from horovod_hetero.common.telemetry import Telemetry


def ring_bytes(payload_bytes, size):
    """Bytes one rank sends in a ring allreduce of ``payload_bytes``: 2(n-1)/n of the payload."""
    return int(2 * (size - 1) * payload_bytes / size) if size > 1 else 0


class HeteroController:
    """Runs a strategy on one rank.

    Args:
        strategy: a ``Strategy``; its counters are part of ``state_dict()``.
        average: the fused weighted-averaging collective (see ``RoundProtocol``).
        size, rank: of the process set.
        payload_bytes: bytes of the averaged tensors (for the telemetry's bytes estimate).
        telemetry: a ``Telemetry``, a directory, or ``None`` (``HOROVOD_HETERO_TELEMETRY``).
        slowdown: a ``Slowdown``, factors (``"1,1,1,4"`` or a list), or ``None``
            (``HOROVOD_HETERO_SLOWDOWN``).
        broadcast: ``broadcast(obj)`` from rank 0 of the set (strategies that start a server).
        host: address other ranks reach this machine at.
        model_ops: ``(snapshot, blend)`` for strategies with ``global_lr != 1``: ``snapshot()``
            keeps the current model as w_t; ``blend(lr)`` sets w = w_t + lr (w - w_t), then w_t = w.
        group_ops: for strategies that average within groups of ranks (WAGMA), an object with
            ``allgather(obj)``, ``require_process_sets(rank_lists, init_call)``, ``current()`` (the
            live model), ``snapshot()`` (a copy), ``allreduce(model, weight, control, ranks, name)``
            (blocking, from any thread; returns the summed model and control) and
            ``assign(summed, total, add_current=False)`` (model = (summed [+ model]) / total).
        clock: injected for tests.
    """

    def __init__(self, strategy, average, size, rank, payload_bytes=0, telemetry=None,
                 slowdown=None, broadcast=None, host="127.0.0.1", model_ops=None, group_ops=None,
                 clock=time.perf_counter):
        self.strategy = strategy
        self.protocol = RoundProtocol(average, size)
        if strategy.global_lr != 1.0:
            if model_ops is None:
                raise ValueError(f"global_lr={strategy.global_lr} needs model snapshots this adapter lacks")
            self.protocol.run_round()      # w_0: the same on every rank, broadcast or not
            model_ops[0]()
        self._model_ops = model_ops
        self.size, self.rank = size, rank
        self.payload_bytes = payload_bytes
        self.telemetry = telemetry if isinstance(telemetry, Telemetry) else Telemetry(rank, telemetry)
        self.slowdown = slowdown if isinstance(slowdown, Slowdown) else Slowdown(rank, slowdown, size=size)
        self._clock = clock
        strategy.bind(rank, size, broadcast, host, group_ops=group_ops)
        self._t_last = clock()
        self._extra_comm = 0.0

    def after_step(self, comm_s=0.0, bytes_sent=0):
        """Account for one local optimizer step and synchronise if the strategy says so.

        ``comm_s``/``bytes_sent``: communication the adapter did itself during the step
        (gradient allreduce of ``Synchronous``). Returns True if an averaging round ran.
        """
        now = self._clock()
        compute = max(0.0, now - self._t_last - comm_s)
        compute += self.slowdown.pad(compute, step=self.strategy.step + 1)
        local_steps = self.protocol.steps_since_round + 1
        self.protocol.local_step()
        t0 = self._clock()
        synced = self.strategy.after_step(step_s=compute)      # may ask a state server
        if synced:
            self.protocol.run_round()
            self._after_round()
            bytes_sent += ring_bytes(self.payload_bytes, self.size)
        comm_s += self._clock() - t0
        self.telemetry.record(step=self.strategy.step, local_steps=local_steps, compute_s=compute,
                              comm_s=comm_s + self._extra_comm, bytes_sent=bytes_sent, synced=synced,
                              **self.strategy.telemetry_fields())
        self._extra_comm = 0.0
        self._t_last = self._clock()
        return synced

    def add_comm(self, seconds):
        """Count communication the adapter did outside a step (e.g. a broadcast in sync_model)."""
        self._extra_comm += seconds

    def _after_round(self):
        if self.strategy.global_lr != 1.0:
            self._model_ops[1](self.strategy.global_lr)
        self.strategy.after_round(self.protocol.round)

    def join(self):
        """Join rounds until every rank has joined; all ranks then hold identical tensors."""
        t0 = self._clock()
        self.strategy.leave()
        rounds = self.protocol.join(on_round=self._after_round)
        self.add_comm(self._clock() - t0)
        self._t_last = self._clock()
        return rounds

    def state_dict(self):
        return {"strategy": self.strategy.state_dict(), "rounds": self.protocol.state_dict()}

    def load_state_dict(self, state):
        self.strategy.load_state_dict(state["strategy"])
        self.protocol.load_state_dict(state["rounds"])


def call_with_timeout(fn, timeout_s, what):
    """Run a blocking collective ``fn()`` with a time limit; raise ``TimeoutError`` naming ``what``.

    For frameworks whose collectives cannot be polled (TensorFlow eager ops): the call runs in
    a helper thread; on timeout the caller gets an error instead of hanging forever.
    """
    import threading
    box = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as e:  # re-raised in the caller
            box["error"] = e

    thread = threading.Thread(target=target, name="horovod_hetero-collective", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(f"{what} did not complete in {timeout_s:g} s: a rank may have died, or ranks "
                           f"stopped entering the same rounds. Raise the limit with timeout=...")
    if "error" in box:
        raise box["error"]
    return box["value"]
