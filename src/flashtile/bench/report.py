"""Reports from records: stdout tables, the paper's three tables, results.json, results.csv, PNG plots."""
import csv
import json
from collections import defaultdict

from flashtile.bench.feature_tables import feature_cost_table, settings, window_scaling_table
from flashtile.bench.features import NONE
from flashtile.bench.flops import MODES

RECORD_KEYS = ("provider", "mode", "batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv", "head_dim",
               "causal", "dtype", "ms", "tflops", "peak_mem_mb", "max_err", "error",
               "speedup_vs_standard", "vs_best_other", "best_other", "features",
               "cache_len", "page_size", "gbps", "frac_of_copy", "note",  # decode records only
               "mask", "density", "speedup_vs_dense", "flex_over_flashtile", "max_diff")  # sparse records only
SHAPE_KEYS = ("batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv", "head_dim", "causal", "dtype")


def shape_key(rec):
    """The shape and feature setting (records from before --feature count as 'none')."""
    return (*(rec[k] for k in SHAPE_KEYS), rec.get("features", NONE))


def annotate(records):
    """Add speedup_vs_standard (standard ms / ms) to every record, and to flashtile records
    vs_best_other (best other provider's ms / flashtile ms: > 1 means flashtile is faster) and
    best_other, comparing only records of the same shape and mode from this run."""
    groups = defaultdict(dict)
    for rec in records:
        groups[(shape_key(rec), rec["mode"])][rec["provider"]] = rec
    for group in groups.values():
        std = group.get("standard", {}).get("ms")
        for rec in group.values():
            rec["speedup_vs_standard"] = std / rec["ms"] if std and rec["ms"] else None
            rec["vs_best_other"] = rec["best_other"] = None
        ours = group.get("flashtile")
        others = [r for name, r in group.items() if name != "flashtile" and r["ms"]]
        if ours and ours["ms"] and others:
            best = min(others, key=lambda r: r["ms"])
            ours["vs_best_other"] = best["ms"] / ours["ms"]
            ours["best_other"] = best["provider"]
    return records


def _fmt(value, spec, missing="-"):
    return missing if value is None else format(value, spec)


def _render(header, rows):
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    lines = ["  ".join(str(x).rjust(w) for x, w in zip(r, widths)).rstrip() for r in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_table(records, mode):
    """The per-mode table: one row per (shape, feature, provider), in sweep order; a features column
    when the run has more than one setting."""
    multi = len(settings(records)) > 1
    header = ("provider", "B", "Sq", "Sk", "Hq", "Hk", "D", "causal", *(("features",) if multi else ()), "ms",
              "TFLOP/s", "vs std", "vs best other", "fwd+bwd MB", "max err", "error")
    rows = []
    for rec in (r for r in records if r["mode"] == mode):
        best = "-"
        if rec.get("vs_best_other") is not None:
            best = f"{rec['vs_best_other']:.2f}x {rec['best_other']}"
        error = rec["error"] or ""
        rows.append((rec["provider"], rec["batch"], rec["seqlen_q"], rec["seqlen_k"], rec["heads_q"],
                     rec["heads_kv"], rec["head_dim"], int(rec["causal"]),
                     *((rec.get("features", NONE),) if multi else ()), _fmt(rec["ms"], ".3f"),
                     _fmt(rec["tflops"], ".3g"), _fmt(rec.get("speedup_vs_standard"), ".2f"), best,
                     _fmt(rec["peak_mem_mb"], ".1f"), _fmt(rec["max_err"], ".1e"),
                     error if len(error) <= 60 else error[:57] + "..."))
    return f"== {mode} ==\n" + _render(header, rows)


def _by_seqlen_table(title, rows_by_key, seqlens, row_names):
    header = (*row_names, *(f"S={s}" for s in seqlens))
    rows = [(*key, *(cells.get(s, "-") for s in seqlens)) for key, cells in rows_by_key.items()]
    return f"{title}\n" + _render(header, rows) if rows else f"{title}\n(no flashtile and standard pairs)"


def _std_missing(std):
    """The table entry where the standard baseline has no number: it ran out of memory (or was skipped because it
    would), or does not implement the shape's feature (sweep._skip_reason)."""
    error = std["error"] or ""
    if error.startswith("skipped:") and "would need" not in error:
        return "std n/a"
    return "std failed"


def paper_tables(records, probes=()):
    """The FlashAttention paper's summaries as text: (a) speedup of flashtile over standard attention,
    (b) memory reduction (standard peak / flashtile peak), (c) longest sequence that fits at batch 1.
    Rows of (a) and (b) are split by feature setting when the run has more than one."""
    order = {spec: i for i, spec in enumerate(settings(records))}
    extra = ("features",) if len(order) > 1 else ()
    pairs = defaultdict(dict)
    for rec in records:
        if rec["provider"] in ("flashtile", "standard"):
            pairs[(shape_key(rec), rec["mode"])][rec["provider"]] = rec
    seqlens = sorted({rec["seqlen_q"] for rec in records})
    speed, memory = defaultdict(dict), defaultdict(dict)
    for (shape, mode), pair in pairs.items():
        ours, std = pair.get("flashtile"), pair.get("standard")
        if not ours or not std:
            continue
        seqlen, head_dim, causal = shape[1], shape[5], int(shape[6])
        feature = (shape[-1],) if extra else ()
        if ours["ms"] and std["ms"]:
            speed[(mode, head_dim, causal, *feature)][seqlen] = f"{std['ms'] / ours['ms']:.2f}x"
        elif ours["ms"]:
            speed[(mode, head_dim, causal, *feature)][seqlen] = _std_missing(std)
        if ours["peak_mem_mb"] and std["peak_mem_mb"]:
            memory[(head_dim, causal, *feature)][seqlen] = f"{std['peak_mem_mb'] / ours['peak_mem_mb']:.1f}x"
        elif ours["peak_mem_mb"] and std["error"]:
            memory[(head_dim, causal, *feature)][seqlen] = _std_missing(std)

    def feature_order(key):
        return (*key[:-1], order[key[-1]]) if extra else key

    speed = dict(sorted(speed.items(), key=lambda kv: (MODES.index(kv[0][0]), *feature_order(kv[0][1:]))))
    parts = [
        _by_seqlen_table("(a) speedup of flashtile over standard attention (standard ms / flashtile ms)",
                         speed, seqlens, ("mode", "D", "causal", *extra)),
        _by_seqlen_table("(b) memory reduction of fwd+bwd (standard peak / flashtile peak)",
                         dict(sorted(memory.items(), key=lambda kv: feature_order(kv[0]))), seqlens,
                         ("D", "causal", *extra)),
    ]
    if probes:
        lines = ["(c) longest sequence that fits (batch 1, causal fwd+bwd, doubling from 1024)"]
        for p in probes:
            lines.append(f"  {p['provider']:<10} {_fmt(p['max_seqlen'], 'd', 'none'):>8}   "
                         f"(H{p['heads_q']}/{p['heads_kv']} D{p['head_dim']} {p['dtype']}; stopped {p['stopped']})")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def feature_summaries(records):
    """The feature-cost and window-scaling tables as text ("" when the run has neither)."""
    tables = (feature_cost_table(records, _render), window_scaling_table(records, _render))
    return "\n\n".join(t for t in tables if t)


def write_json(path, meta, records, probes=()):
    """results.json: {"meta": ..., "records": [...], "max_seqlen": [...]}, strict JSON (no NaN)."""
    data = {"meta": meta, "records": [{k: rec.get(k) for k in RECORD_KEYS} for rec in records],
            "max_seqlen": list(probes)}
    with open(path, "w") as f:
        json.dump(data, f, indent=1, allow_nan=False)
        f.write("\n")


def write_csv(path, records):
    """results.csv: one row per record, columns RECORD_KEYS, empty cells for null."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=RECORD_KEYS, extrasaction="ignore")
        writer.writeheader()
        for rec in records:
            writer.writerow({k: "" if rec.get(k) is None else rec[k] for k in RECORD_KEYS})


def _panels(records):
    """(head_dim, causal) pairs in a stable order."""
    return sorted({(r["head_dim"], r["causal"]) for r in records})


def _lines(ax, records, value, log_y=False):
    multi = len(settings(records)) > 1  # one line per (provider, feature setting)
    by_provider = defaultdict(list)
    for rec in records:
        if rec[value] is not None:
            label = f"{rec['provider']} [{rec.get('features', NONE)}]" if multi else rec["provider"]
            by_provider[label].append((rec["seqlen_q"], rec[value]))
    for provider, points in by_provider.items():
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=provider)
    if by_provider:  # log axes of an empty panel only produce warnings
        ax.set_xscale("log", base=2)
        xs = sorted({x for points in by_provider.values() for x, _ in points})
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_xticks([], minor=True)
        if log_y:
            ax.set_yscale("log")
    ax.grid(True, alpha=0.3)


def _finish(plt, fig, axes, title, path):
    """Legend, title, layout; save the figure to path and close it. Returns path."""
    _legend(axes.flat)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _legend(axes):
    """One legend, on the first panel that has lines."""
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
            return


def write_plots(out_dir, records, title=""):
    """tflops.png (rows: modes, columns: (head dim, causal)) and memory.png (log scale).
    Returns the written paths; raises ImportError when matplotlib is missing."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = _panels(records)
    modes = [m for m in MODES if any(r["mode"] == m for r in records)]
    if not panels or not modes:
        return []
    paths = []
    fig, axes = plt.subplots(len(modes), len(panels), figsize=(4 * len(panels), 3.2 * len(modes)),
                             squeeze=False)
    for i, mode in enumerate(modes):
        for j, (head_dim, causal) in enumerate(panels):
            ax = axes[i][j]
            _lines(ax, [r for r in records if r["mode"] == mode and r["head_dim"] == head_dim
                        and r["causal"] == causal], "tflops")
            ax.set_title(f"{mode}, D={head_dim}, causal={int(causal)}", fontsize=9)
            ax.set_xlabel("seqlen")
            ax.set_ylabel("TFLOP/s")
    paths.append(_finish(plt, fig, axes, title, f"{out_dir}/tflops.png"))

    # Memory does not depend on the mode (always one fwd+bwd): plot each (provider, shape) once.
    first_mode = [r for r in records if r["mode"] == modes[0]]
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.4), squeeze=False)
    for j, (head_dim, causal) in enumerate(panels):
        ax = axes[0][j]
        _lines(ax, [r for r in first_mode if r["head_dim"] == head_dim and r["causal"] == causal],
               "peak_mem_mb", log_y=True)
        ax.set_title(f"fwd+bwd peak memory, D={head_dim}, causal={int(causal)}", fontsize=9)
        ax.set_xlabel("seqlen")
        ax.set_ylabel("MB")
    paths.append(_finish(plt, fig, axes, title, f"{out_dir}/memory.png"))
    return paths
