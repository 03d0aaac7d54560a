"""Runnable examples, shipped with the package (``horovod-hetero demo`` runs ``torch_digits``)::

    horovodrun -np 4 -H localhost:4 --gloo python -m horovod_hetero.examples.torch_digits --strategy esync
    horovodrun -np 4 -H localhost:4 --gloo python -m horovod_hetero.examples.keras_digits --strategy localsgd

Both take the same strategy options (``add_strategy_arguments``) and build the same strategy objects
(``build_strategy``): the torch example hands it to ``hh.DistributedOptimizer``, the Keras one to
``hh.callbacks.HeteroSyncCallback``.
"""
from horovod_hetero import strategies


def add_strategy_arguments(parser):
    """The options that choose and configure a strategy, on an ``argparse`` parser."""
    parser.add_argument("--strategy", choices=["sync", "localsgd", "esync", "wagma", "elasticbsp", "dssp", "adsp"],
                        default="localsgd")
    parser.add_argument("--period", type=int, default=8, help="LocalSGD period, WAGMA sync_period")
    parser.add_argument("--warmup-steps", type=int, default=0, help="LocalSGD steps averaged each")
    parser.add_argument("--mode", choices=["blocking", "delayed_ack"], default="blocking", help="ESync mode")
    parser.add_argument("--global-lr", type=float, default=1.0, help="ESync global step size")
    parser.add_argument("--group-size", type=int, default=None, help="WAGMA group size (default: nearest sqrt(P))")
    parser.add_argument("--lookahead", type=int, default=15, help="ElasticBSP lookahead R")
    parser.add_argument("--staleness", type=int, nargs=2, default=(3, 15), metavar=("LOW", "HIGH"), help="DSSP bounds")
    parser.add_argument("--check-period", default="10steps", help="ADSP check period: 10steps (of the slowest worker) or 4s")
    parser.add_argument("--search-every", default=None, help="ADSP search epoch, in the check period's unit")


def build_strategy(args):
    """The strategy ``args`` (parsed with ``add_strategy_arguments``) name."""
    if args.strategy == "sync":
        return strategies.Synchronous()
    if args.strategy == "esync":
        return strategies.ESync(global_lr=args.global_lr, mode=args.mode)
    if args.strategy == "wagma":
        return strategies.WAGMA(group_size=args.group_size, sync_period=args.period)
    if args.strategy == "elasticbsp":
        return strategies.ElasticBSP(lookahead=args.lookahead)
    if args.strategy == "dssp":
        return strategies.DSSP(staleness=tuple(args.staleness))
    if args.strategy == "adsp":
        return strategies.ADSP(check_period=args.check_period, search_every=args.search_every)
    return strategies.LocalSGD(period=args.period, warmup_steps=args.warmup_steps)
