"""What the torch and TensorFlow adapters share of Horovod, one concern per module.

- ``compat``: every use of Horovod's (and Keras') private API, behind a check of Horovod's version;
- ``collectives``: ``HorovodCollectives``, the framework-independent half of an adapter's collectives;
- ``process_sets``: WAGMA's process sets and the check of a ``process_set`` argument;
- ``ranks``: the ``Membership`` an adapter follows, which errors mean a failed collective, lost ranks;
- ``failures``: the process-wide hooks for Horovod's own failure paths (terminate handler, GIL watchdog);
- ``options``: the check of an adapter's run options at construction.

The address a rank's servers bind is the transports' (``transports.addresses``): it needs no Horovod.
"""
