"""ZipLine solver timings: the vectorised ``zipline`` against the paper's ZipLineOpt, same run.

    horovod-hetero benchmark zipline [--workers 4,8,100,1000,10000] [--lookahead 15,150]

Workers' end times are predicted from random last ends and intervals between 0.5 and 3.2
(a mixed cluster). Best of several repetitions; the reference is skipped where it would run
for minutes (its removals are O(n) each). Target: n=1000, R=15 in <= 1 ms, >= 20x the reference.
"""
import argparse
import timeit

import numpy as np

from horovod_hetero.rules.zipline import predict_ends, zipline, zipline_opt


def best_time(fn, budget_s=0.5):
    once = min(timeit.repeat(fn, number=1, repeat=3))
    number = max(1, int(budget_s / max(once, 1e-6) / 5))
    return min(timeit.repeat(fn, number=number, repeat=5)) / number


def counts(text):
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"a comma list of whole numbers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"every value must be >= 1, got {text!r}")
    return values


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=counts, default=[4, 8, 100, 1000, 10000], metavar="N,...",
                   help="comma list of n (workers)")
    p.add_argument("--lookahead", type=counts, default=[15, 150], metavar="R,...",
                   help="comma list of R (iterations predicted)")
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    print(f"{'n':>6} {'R':>4} {'zipline ms':>11} {'ZipLineOpt ms':>14} {'speed-up':>9} {'same answer':>12}")
    for R in args.lookahead:
        for n in args.workers:
            ends = predict_ends(rng.uniform(0, 1, n), rng.uniform(0.5, 3.2, n), R)
            fast = best_time(lambda: zipline(ends))
            if n * n * R <= 2e8:
                ref = min(timeit.repeat(lambda: zipline_opt(ends), number=1, repeat=3))
                a, b = zipline(ends), zipline_opt(ends)
                same = "yes" if (a.wait, a.t_sync) == (b.wait, b.t_sync) else "NO"
                print(f"{n:>6} {R:>4} {fast * 1e3:>11.3f} {ref * 1e3:>14.1f} {ref / fast:>8.0f}x {same:>12}")
            else:
                print(f"{n:>6} {R:>4} {fast * 1e3:>11.3f} {'(skipped)':>14} {'':>9} {'':>12}")


if __name__ == "__main__":
    main()
