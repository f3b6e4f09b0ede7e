"""Summaries of runs with several ``--feature`` settings: the cost of each feature, and window scaling."""
from collections import defaultdict

from flashtile.bench.features import NONE, parse
from flashtile.bench.flops import MODES


def settings(records):
    """The feature specs of the run, in first-seen order."""
    return list(dict.fromkeys(rec.get("features", NONE) for rec in records))


def _shape_label(rec):
    causal = " causal" if rec["causal"] else ""
    return (f"B{rec['batch']} S{rec['seqlen_q']}x{rec['seqlen_k']} H{rec['heads_q']}/{rec['heads_kv']} "
            f"D{rec['head_dim']}{causal}")


def _flashtile_ms(records):
    """{(mode, shape label): {spec: ms}} for successful flashtile records, rows in sweep order."""
    rows = defaultdict(dict)
    for rec in records:
        if rec["provider"] == "flashtile" and rec["ms"]:
            rows[(rec["mode"], _shape_label(rec))][rec.get("features", NONE)] = rec["ms"]
    return dict(sorted(rows.items(), key=lambda kv: MODES.index(kv[0][0])))


def _table(title, header, rows, render):
    return f"{title}\n" + (render(header, rows) if rows else "(no flashtile results)")


def feature_cost_table(records, render):
    """flashtile ms with each feature / ms without (same shape and mode); None unless the run has
    'none' and at least one other setting."""
    specs = [s for s in settings(records) if s != NONE]
    if NONE not in settings(records) or not specs:
        return None
    rows = []
    for (mode, label), ms in _flashtile_ms(records).items():
        base = ms.get(NONE)
        cells = [f"{ms[s] / base:.2f}x" if base and s in ms else "-" for s in specs]
        rows.append((mode, label, *cells))
    return _table("feature cost for flashtile: ms with feature / ms without (same shape, mode)",
                  ("mode", "shape", *specs), rows, render)


def window_scaling_table(records, render):
    """flashtile ms by window size per shape (window-only settings, plus 'none' as full attention);
    None unless the run has at least two window settings."""
    windows = [s for s in settings(records) if s != NONE and parse(s).window_only]
    if len(windows) < 2:
        return None
    unbounded = 1 << 62
    windows.sort(key=lambda s: tuple(unbounded if w < 0 else w for w in parse(s).window_size))
    columns = windows + ([NONE] if NONE in settings(records) else [])
    rows = []
    for (mode, label), ms in _flashtile_ms(records).items():
        if any(c in ms for c in windows):
            rows.append((mode, label, *(f"{ms[c]:.3f}" if c in ms else "-" for c in columns)))
    header = ("mode", "shape", *(c.removeprefix("window:") if c != NONE else "full" for c in columns))
    return _table("window scaling for flashtile: ms by window (left:right)", header, rows, render)
