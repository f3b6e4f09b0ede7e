"""README table of two sweeps of the same code (results.csv each): run 1's TFLOP/s, and both runs' ratios to cuDNN.
Further files' rows (later sweeps of some shapes, each over the ones before) replace run 1's, their run-2 ratio shown
as "·". The README's table, from this folder:
    python3 readme_table.py ../h200-2026-12-02-s33/call2/sweep1/results.csv ../h200-2026-12-02-s33/call2/sweep2/results.csv \
        ../h200-2026-12-02-s33/call7/sweep-d64/results.csv call2/sweep-d64c/results.csv"""
import csv
import sys


def load(path):
    return {(r["provider"], r["mode"], int(r["head_dim"]), r["causal"] == "True", int(r["seqlen_k"])): float(r["tflops"])
            for r in csv.DictReader(open(path)) if not r["error"] and r["tflops"]}


def ratio(v):
    t = f"{v:.2f}"
    return f"{v:.3f}" if t == "1.00" else t


runs = [load(p) for p in sys.argv[1:3]]
later = {}
for path in sys.argv[3:]:
    later.update(load(path))
name = {512: "512", 1024: "1K", 2048: "2K", 4096: "4K", 8192: "8K", 16384: "16K"}
print("| head dim | causal | seqlen | flashtile | cuDNN | FA2 | flashtile / cuDNN | run 2: flashtile / cuDNN "
      "| flashtile / FA2 |")
print("|---|---|---|---|---|---|---|---|---|")
for d in (64, 128, 256):
    for c in (False, True):
        for s in (512, 1024, 2048, 4096, 8192, 16384):
            replaced = ("flashtile", "fwd", d, c, s) in later
            first = later if replaced else runs[0]

            def get(run, provider):
                return [run[(provider, m, d, c, s)] for m in ("fwd", "bwd")]
            f, cu, fa = (get(first, p) for p in ("flashtile", "sdpa-cudnn", "sdpa-flash"))
            if replaced:
                second = "·"
            else:
                f2, cu2 = (get(runs[1], p) for p in ("flashtile", "sdpa-cudnn"))
                second = f"{ratio(f2[0] / cu2[0])} / {ratio(f2[1] / cu2[1])}"
            print(f"| {d} | {'yes' if c else 'no'} | {name[s]} | {f[0]:.0f} / {f[1]:.0f} | {cu[0]:.0f} / {cu[1]:.0f} | "
                  f"{fa[0]:.0f} / {fa[1]:.0f} | {ratio(f[0] / cu[0])} / {ratio(f[1] / cu[1])} | {second} | "
                  f"{ratio(f[0] / fa[0])} / {ratio(f[1] / fa[1])} |")
