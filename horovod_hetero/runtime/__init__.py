"""The runtime: what runs a strategy on one rank, written once for every framework.

| module | what |
| --- | --- |
| ``controller`` | ``HeteroController``: measures steps, carries out decisions, opens/closes transports |
| ``rounds`` | ``RoundProtocol``: fused weighted-average rounds carrying every rank's step statistics |
| ``collectives`` | the ``Collectives`` and ``Model`` interfaces a framework adapter implements |
| ``telemetry`` | per-step JSON-lines records and their summary |
| ``straggler`` | simulated slowdown (``HOROVOD_HETERO_SLOWDOWN``), transient stragglers |
"""
