"""Decision rules: pure functions and objects, free of frameworks, sockets and threads.

| module | rule | paper |
| --- | --- | --- |
| ``zipline`` | the barrier minimising total waiting (ZipLine), references | ElasticBSP |
| ``dssp`` | the synchronisation controller's r*, the push/OK server | DSSP |
| ``esync`` | QUERY-STATE / RESET-STATE-SERVER (``ESyncState``) | ESync |
| ``adsp`` | loss-curve fit, reward, commit-rate search, commit timer | ADSP |
| ``grouping`` | butterfly groups, their process sets, group sizes | WAGMA-SGD |

Strategies (``horovod_hetero.strategies``) call these; the transports (``horovod_hetero.transports``)
serve them over sockets; the simulator runs them on a virtual clock.
"""
