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
and ``except horovod_hetero.errors.HeteroError`` work in either framework.
"""


class HeteroError(RuntimeError):
    """Base class of every run-time error of horovod-hetero."""


class RankLostError(HeteroError):
    """A rank died (its connections closed) or froze (a collective timed out) while this rank
    trained: the job cannot go on. The message names the collective, the round, the step and, where
    it can be seen from this host, the lost rank. Restart from a checkpoint, or train under
    ``hvd.elastic.run`` (there Horovod's own ``HorovodInternalError`` goes to its reset instead, and
    so does a dead rank this library sees first: ``common.ranks.ElasticRankLostError``)."""


class CollectiveTimeoutError(RankLostError, TimeoutError):
    """A collective (averaging round, group average, object broadcast) did not complete in time:
    a rank froze or died, or ranks stopped entering the same rounds."""


class RoundMismatchError(HeteroError):
    """Ranks entered different rounds (or group steps): a rank skipped or added a synchronisation."""


class TransportError(HeteroError):
    """A transport outside Horovod's collectives (a server, a socket) failed."""


class StateServerError(TransportError):
    """ESync's state server cannot be reached or closed the connection (ESync falls back)."""


class StateServerTimeout(StateServerError):
    """ESync's state server did not answer within its timeout (ESync falls back)."""


class ElasticResetError(HeteroError):
    """Horovod was initialised again (``hvd.elastic.run`` after a worker was added, removed or
    failed) and the strategy cannot go on with the new ranks as configured."""
