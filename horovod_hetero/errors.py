"""The exceptions horovod-hetero raises at run time: one hierarchy, one timeout type.

Bad arguments are ``TypeError``/``ValueError`` raised when an object is built; everything that
goes wrong while training is a ``HeteroError``::

    HeteroError (RuntimeError)
    ├── RankLostError                                  a rank died or froze: a collective cannot complete
    │   └── CollectiveTimeoutError (also a TimeoutError)   a collective did not complete in time
    ├── RoundMismatchError                             ranks entered different rounds / group steps
    ├── ElasticResetError                              the strategy cannot go on after hvd.elastic's reset
    └── TransportError                                 a transport outside Horovod failed, as its user sees it
        └── StateServerError                           ESync's state server unreachable or closed
            └── StateServerTimeout                     ... or silent for longer than its timeout

(A server that cannot even bind its socket raises the ``OSError`` the operating system gave.)

The torch wrapper and the Keras callbacks raise the same classes, so ``except TimeoutError``
and ``except horovod_hetero.errors.HeteroError`` work in either framework. Every message ends with a
line naming its entry in the troubleshooting page (``docs/troubleshooting.md``: the cause and the fix).
"""
from __future__ import annotations

#: The troubleshooting page, by error message: ``docs/troubleshooting.md`` (``troubleshooting.html`` on the site)
TROUBLESHOOTING = "docs/troubleshooting.md"


def troubleshooting(anchor: str) -> str:
    """The pointer to the troubleshooting page's entry ``anchor``, as messages end with it.

    Example:
        >>> troubleshooting("troubleshooting-rank-lost")
        'Troubleshooting: docs/troubleshooting.md#troubleshooting-rank-lost'
    """
    return f"Troubleshooting: {TROUBLESHOOTING}#{anchor}"


class HeteroError(RuntimeError):
    """Base class of every run-time error of horovod-hetero. Its message ends with a line naming its
    class's entry in the troubleshooting page (``anchor``)."""

    #: the entry of ``docs/troubleshooting.md`` that says what causes this error and how to fix it
    anchor = "troubleshooting-hetero-error"

    def __str__(self) -> str:
        return f"{super().__str__()}\n{troubleshooting(self.anchor)}"


class RankLostError(HeteroError):
    """A rank died (its connections closed) or froze (a collective timed out) while this rank
    trained: the job cannot go on. The message names the collective, the round, the step and, where
    it can be seen from this host, the lost rank. Restart from a checkpoint, or train under
    ``hvd.elastic.run`` (there Horovod's own ``HorovodInternalError`` goes to its reset instead, and
    so does a dead rank this library sees first: ``common.ranks.ElasticRankLostError``)."""

    anchor = "troubleshooting-rank-lost"


class CollectiveTimeoutError(RankLostError, TimeoutError):
    """A collective (averaging round, group average, object broadcast) did not complete in time:
    a rank froze or died, or ranks stopped entering the same rounds."""

    anchor = "troubleshooting-collective-timeout"


class RoundMismatchError(HeteroError):
    """Ranks entered different rounds (or group steps): a rank skipped or added a synchronisation."""

    anchor = "troubleshooting-round-mismatch"


class TransportError(HeteroError):
    """A transport outside Horovod's collectives (a server, a socket) failed."""

    anchor = "troubleshooting-state-server"


class StateServerError(TransportError):
    """ESync's state server cannot be reached or closed the connection (ESync falls back)."""


class StateServerTimeout(StateServerError):
    """ESync's state server did not answer within its timeout (ESync falls back)."""


class ElasticResetError(HeteroError):
    """Horovod was initialised again (``hvd.elastic.run`` after a worker was added, removed or
    failed) and the strategy cannot go on with the new ranks as configured."""

    anchor = "troubleshooting-elastic-reset"
