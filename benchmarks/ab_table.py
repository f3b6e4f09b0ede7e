"""Before / after table of an A/B from the bench's results.csv files, as the perf-log and README tables show one.

    python3 benchmarks/ab_table.py --mode fwd old=fwd-old-r1.csv,fwd-old-r2.csv new=fwd-new-r1.csv,fwd-new-r2.csv

Each TREE=CSV,... argument names one side of the A/B and the runs it made (alternate the trees' runs on the device:
see benchmarks/results/fwd-epilogue-h200-2026-11-30-s19/call7.sh). Per shape of --mode (fwd or bwd): flashtile's
TFLOP/s in every run of each tree, the reference provider's range over all runs, and the last tree's ratio to it
(time ratio, > 1: flashtile faster) run by run.
"""
import argparse
import csv


def load(paths, mode):
    """{(head_dim, causal, seqlen_q, seqlen_k, provider): [TFLOP/s per file]} of the rows of this mode."""
    runs = {}
    for path in paths:
        with open(path) as f:
            for row in csv.DictReader(f):
                if row["mode"] != mode or not row["tflops"] or row.get("error"):
                    continue
                key = (int(row["head_dim"]), row["causal"] == "True", int(row["seqlen_q"]), int(row["seqlen_k"]),
                       row["provider"])
                runs.setdefault(key, []).append(float(row["tflops"]))
    return runs


def span(values, fmt=lambda v: f"{v:.0f}"):
    """min-max of values in fmt, or one value where both print the same."""
    low, high = fmt(min(values)), fmt(max(values))
    return low if low == high else f"{low}-{high}"


def ratio(value):
    """Two decimals, three where two would print 1.00 (the README's rule: 0.997 is not parity)."""
    text = f"{value:.2f}"
    return f"{value:.3f}" if text == "1.00" else text


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="+", help="TREE=results.csv[,results.csv...], the before tree first")
    parser.add_argument("--mode", default="fwd", choices=["fwd", "bwd"])
    parser.add_argument("--reference", default="sdpa-cudnn", help="the provider the ratio column divides by")
    args = parser.parse_args()
    trees = [(name, path.split(",")) for name, path in (t.split("=", 1) for t in args.trees)]
    data = {name: load(paths, args.mode) for name, paths in trees}
    shapes = sorted({key[:4] for runs in data.values() for key in runs if key[4] == "flashtile"})
    last = trees[-1][0]
    print(f"| head dim | causal | seqlen | {' | '.join(name for name, _ in trees)} | {args.reference} | "
          f"{last} / {args.reference} |")
    print("|---|---|---|" + "---|" * (len(trees) + 2))
    for shape in shapes:
        cells = [", ".join(f"{v:.0f}" for v in data[name].get(shape + ("flashtile",), [])) or "-" for name, _ in trees]
        ref = [v for name, _ in trees for v in data[name].get(shape + (args.reference,), [])]
        ours, theirs = data[last].get(shape + ("flashtile",), []), data[last].get(shape + (args.reference,), [])
        ratios = span([a / b for a, b in zip(ours, theirs)], ratio) if ours and theirs else "-"
        seqlen = f"{shape[2]}" if shape[2] == shape[3] else f"{shape[2]} x {shape[3]}"
        print(f"| {shape[0]} | {'yes' if shape[1] else 'no'} | {seqlen} | {' | '.join(cells)} | "
              f"{span(ref) if ref else '-'} | {ratios} |")


if __name__ == "__main__":
    main()
