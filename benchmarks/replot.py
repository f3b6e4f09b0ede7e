"""Rebuild results.json and the PNG plots from a bench run's results.csv (the device returns few files, so
runs there write --no-plots and only the CSV may come back).

    PYTHONPATH=src python benchmarks/replot.py DIR [--title TEXT]
"""
import argparse
import csv

from flashtile.bench import report

INTS = {"batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv", "head_dim", "cache_len", "page_size"}
FLOATS = {"ms", "tflops", "peak_mem_mb", "max_err", "speedup_vs_standard", "vs_best_other", "gbps", "frac_of_copy",
          "density", "speedup_vs_dense", "flex_over_flashtile", "max_diff"}


def _value(key, text):
    if text == "":
        return None
    if key in INTS:
        return int(text)
    if key in FLOATS:
        return float(text)
    if key == "causal":
        return text == "True"
    return text


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir")
    p.add_argument("--title", default="")
    args = p.parse_args()
    with open(f"{args.dir}/results.csv") as f:
        records = [{k: _value(k, v) for k, v in row.items()} for row in csv.DictReader(f)]
    report.write_json(f"{args.dir}/results.json", {"rebuilt_from": "results.csv"}, records)
    print("\n".join(report.write_plots(args.dir, records, args.title)))


if __name__ == "__main__":
    main()
