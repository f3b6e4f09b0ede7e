"""README table rows from results.csv files (later files replace earlier rows of the same shape and provider)."""
import csv, sys
rows = {}
for path in sys.argv[1:]:
    for r in csv.DictReader(open(path)):
        if r["error"] or not r["tflops"]:
            continue
        rows[(r["provider"], r["mode"], int(r["head_dim"]), r["causal"] == "True", int(r["seqlen_k"]))] = float(r["tflops"])
def ratio(v):
    t = f"{v:.2f}"
    return f"{v:.3f}" if t == "1.00" else t
name = {512: "512", 1024: "1K", 2048: "2K", 4096: "4K", 8192: "8K", 16384: "16K"}
print("| head dim | causal | seqlen | flashtile | cuDNN | FA2 | flashtile / cuDNN | flashtile / FA2 |")
print("|---|---|---|---|---|---|---|---|")
for d in (64, 128, 256):
    for c in (False, True):
        for s in (512, 1024, 2048, 4096, 8192, 16384):
            g = lambda p, m: rows[(p, m, d, c, s)]
            f = [g("flashtile", m) for m in ("fwd", "bwd")]
            cu = [g("sdpa-cudnn", m) for m in ("fwd", "bwd")]
            fa = [g("sdpa-flash", m) for m in ("fwd", "bwd")]
            print(f"| {d} | {'yes' if c else 'no'} | {name[s]} | {f[0]:.0f} / {f[1]:.0f} | {cu[0]:.0f} / {cu[1]:.0f} | "
                  f"{fa[0]:.0f} / {fa[1]:.0f} | {ratio(f[0]/cu[0])} / {ratio(f[1]/cu[1])} | "
                  f"{ratio(f[0]/fa[0])} / {ratio(f[1]/fa[1])} |")
