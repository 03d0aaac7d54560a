"""Transports outside Horovod's collectives (sockets, messages, keys): opened for a strategy, closed by the runtime.

| module | what | used by |
| --- | --- | --- |
| ``state_server`` | ESync's state server and client (JSON Lines over TCP, standard library) | ESync |
| ``activations`` | "a group average started" messages (authenticated lines over TCP, standard library) | wait-avoiding groups |
| ``auth`` | the job's key and the HMAC ``Channel`` that seals every message of the two above | both |

A strategy never builds a socket or a thread: it asks ``ctx.transports`` (``runtime.strategy_transports.Transports``)
for what it needs in ``on_start``, and the runtime closes it. Nothing here imports the runtime (the
runtime imports these; ``runtime.group_exchange`` runs wait-avoiding group averages over activations).
"""
