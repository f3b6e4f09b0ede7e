"""Per-program timeline of the Gluon backward's dK/dV kernel on the GPU: %globaltimer at the program's entry, the
consumers' start, K/V's arrival, the end of the tile loops, after the last dQ reduce-add's store_wait and after the
dK/dV stores (warpgroup 0; warpgroup 1's end too), with %smid, at the bench's shapes (16K tokens, hidden 2048).

    python3 benchmarks/bwd_trace.py [--tree DIR]

Copies src/ to DIR (default /tmp/flashtile-trace), adds the timer writes there (an experiment build: a Trace buffer
argument and a TRACE constexpr; the anchors below follow kernels/gluon_bwd.py as of session 18 and fail loudly when
it changes), then runs the backward from that copy (FLASHTILE_FAST_LAUNCH=0, so every call goes through
gluon_backward) and prints medians per phase, the gap between a program's end and the next program's start on
the same SM, and the kernel's span. Session 18's results: benchmarks/results/bwd-epilogue-h200-2026-11-30-s18/trace.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

REC = 10  # int64 per program: 0 entry, 1 consumer start, 2 K/V in, 3 loops done, 4 after store_wait,
# 5 warpgroup 0 done, 6 smid, 7 tiles, 8 warpgroup 1 done, 9 (the later end, filled on the host)
SHAPES = [(128, 1024, False), (128, 1024, True), (128, 4096, False), (128, 4096, True), (64, 1024, False),
          (128, 512, False)]


def _replace(text, old, new, count=1):
    if text.count(old) != count:
        raise SystemExit(f"anchor not found {count}x (kernels/gluon_bwd.py changed?):\n{old}")
    return text.replace(old, new)


def patch(root):
    """The timer writes, into the copy at root."""
    path = root / "flashtile" / "kernels" / "gluon_bwd.py"
    s = path.read_text()
    s = _replace(s, "@gluon.jit\ndef _consumer_partition(", f'''@gluon.jit
def _trace_put(trace, slot, lane):
    rec = gl.program_id(1) * gl.num_programs(0) + gl.program_id(0)
    t = gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [lane], dtype=gl.int64, is_pure=False,
                                  pack=1)
    gl.store(trace + rec.to(gl.int64) * {REC} + slot + lane * 0, t, mask=lane == 0)


@gluon.jit
def _consumer_partition(''')
    s = _replace(s, 'STORE_VIA_SMEM: gl.constexpr = False):\n    """Keys start_n',
                 'STORE_VIA_SMEM: gl.constexpr = False,\n                        trace=0, '
                 'TRACE: gl.constexpr = False):\n    """Keys start_n')
    s = _replace(s, '''    mbarrier.wait(kv_bar, 0)
    if BLOCK_SPARSE:
        dk, dv = _consumer_sparse_walk(''', '''    if TRACE:
        lane = gl.arange(0, 128, layout=gl.BlockedLayout([1], [32], [4], [0]))
        if WG == 0:
            _trace_put(trace, 1, lane)
    mbarrier.wait(kv_bar, 0)
    if TRACE:
        if WG == 0:
            _trace_put(trace, 2, lane)
    if BLOCK_SPARSE:
        dk, dv = _consumer_sparse_walk(''')
    s = _replace(s, '''    if DQ_TMA_REDUCE:
        tma.store_wait(0)  # the last reduce-add has read dq_smem before the program exits
    if STORE_VIA_SMEM:''', '''    if TRACE:
        if WG == 0:
            _trace_put(trace, 3, lane)
    if DQ_TMA_REDUCE:
        tma.store_wait(0)  # the last reduce-add has read dq_smem before the program exits
    if TRACE:
        if WG == 0:
            _trace_put(trace, 4, lane)
    if STORE_VIA_SMEM:''')
    s = _replace(s, 'mask=in_seq)\n\n\n@gluon.jit\ndef _consumer1_partition(', f'''mask=in_seq)
    if TRACE:
        rec = (gl.program_id(1) * gl.num_programs(0) + gl.program_id(0)).to(gl.int64) * {REC}
        if WG == 0:
            _trace_put(trace, 5, lane)
            smid = gl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,r", [lane], dtype=gl.int32, is_pure=False,
                                             pack=1)
            gl.store(trace + rec + 6 + lane * 0, smid.to(gl.int64), mask=lane == 0)
            gl.store(trace + rec + 7 + lane * 0, (n_tiles * group_size).to(gl.int64) + lane * 0, mask=lane == 0)
        else:
            _trace_put(trace, 8, lane)


@gluon.jit
def _consumer1_partition(''')
    s = _replace(s, 'STORE_VIA_SMEM: gl.constexpr = False):\n    _consumer_partition(',
                 'STORE_VIA_SMEM: gl.constexpr = False, trace=0,\n                         '
                 'TRACE: gl.constexpr = False):\n    _consumer_partition(')
    s = _replace(s, '''drop_row_groups, drop_thr, dropout_scale, HAS_DROPOUT, STORE_VIA_SMEM)''',
                 '''drop_row_groups, drop_thr, dropout_scale, HAS_DROPOUT, STORE_VIA_SMEM, trace, TRACE)''')
    s = _replace(s, 'STORE_VIA_SMEM: gl.constexpr = False):\n    """q_desc / do_desc',
                 'STORE_VIA_SMEM: gl.constexpr = False,\n                          Trace=None, '
                 'TRACE: gl.constexpr = False):\n    """q_desc / do_desc')
    s = _replace(s, '''dropout_threshold, dropout_scale, HAS_DROPOUT,
                                   STORE_VIA_SMEM)),''', '''dropout_threshold, dropout_scale, HAS_DROPOUT,
                                   STORE_VIA_SMEM, trace, TRACE)),''')
    s = _replace(s, '''dropout_threshold, dropout_scale, HAS_DROPOUT,
                                    STORE_VIA_SMEM)),''', '''dropout_threshold, dropout_scale, HAS_DROPOUT,
                                    STORE_VIA_SMEM, trace, TRACE)),''')
    s = _replace(s, "cannot be captured).\n    alibi_ptr = 0", """cannot be captured).
    trace = 0
    if TRACE:
        trace = Trace
        _trace_put(Trace, 0, gl.arange(0, 128, layout=gl.BlockedLayout([1], [32], [4], [0])))
    alibi_ptr = 0""")
    path.write_text(s)
    path = root / "flashtile" / "gluon_bwd_launch.py"
    s = path.read_text()
    s = _replace(s, "    fast_launch.launch(_attn_bwd_dkdv_hopper, grid, args, {**constexprs, **options})", f"""\
    if TRACE_BUF is not None:
        TRACE_BUF.append(torch.zeros(grid[0] * grid[1] * {REC}, dtype=torch.int64, device=q.device))
        _attn_bwd_dkdv_hopper[grid](*args, Trace=TRACE_BUF[-1], TRACE=True, **constexprs, **options)
    else:
        fast_launch.launch(_attn_bwd_dkdv_hopper, grid, args, {{**constexprs, **options}})""")
    s = _replace(s, "\nDQ_BOX_N = 32", "\nTRACE_BUF = None  # bwd_trace.py: launches append traces\nDQ_BOX_N = 32")
    path.write_text(s)


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def run():
    """In the patched copy: trace each shape's third backward and print the phases."""
    import torch

    import flashtile
    from flashtile import gluon_bwd_launch

    for head_dim, seqlen, causal in SHAPES:
        batch, heads = 16384 // seqlen, 2048 // head_dim
        q, k, v = (torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=torch.bfloat16,
                               requires_grad=True) for _ in range(3))
        out = flashtile.flash_attn_func(q, k, v, causal=causal)
        dout = torch.randn_like(out)
        gluon_bwd_launch.TRACE_BUF = []
        for _ in range(3):
            torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        torch.cuda.synchronize()
        rows = gluon_bwd_launch.TRACE_BUF[-1].view(-1, REC).tolist()
        gluon_bwd_launch.TRACE_BUF = None
        t0 = min(r[0] for r in rows)
        for r in rows:
            for i in (0, 1, 2, 3, 4, 5, 8):
                r[i] -= t0
            r[9] = max(r[5], r[8])
        by_sm = {}
        for r in rows:
            by_sm.setdefault(r[6], []).append(r)
        gaps = []
        for progs in by_sm.values():
            progs.sort(key=lambda r: r[0])
            gaps += [(b[0] - a[9]) / 1e3 for a, b in zip(progs, progs[1:])]

        def phase(a, b):
            return [(r[b] - r[a]) / 1e3 for r in rows]

        life, loop = phase(0, 9), phase(2, 3)
        per_tile = [(r[3] - r[2]) / 1e3 / r[7] for r in rows if r[7]]
        print(f"D{head_dim} S{seqlen} {'causal' if causal else 'plain'}: {len(rows)} programs on {len(by_sm)} SMs, "
              f"span {max(r[9] for r in rows) / 1e3:.1f} us; median us: entry->consumer {median(phase(0, 1)):.2f}, "
              f"K/V wait {median(phase(1, 2)):.2f}, loop {median(loop):.2f} ({median(per_tile):.3f}/tile), "
              f"store_wait {median(phase(3, 4)):.2f}, dK/dV stores {median(phase(4, 5)):.2f}, WG1 end - WG0 end "
              f"{median(phase(5, 8)):.2f}, lifetime {median(life):.2f}, gap to the SM's next program "
              f"{median(gaps):.2f}; per SM: (lifetime - loop) {sum(a - b for a, b in zip(life, loop)) / len(by_sm):.1f}"
              f" us, gaps {sum(gaps) / len(by_sm):.1f} us", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", default="/tmp/flashtile-trace", help="where the patched copy of src/ goes")
    parser.add_argument("--run", action="store_true", help=argparse.SUPPRESS)  # inside the patched copy
    args = parser.parse_args()
    if args.run:
        return run()
    tree = Path(args.tree)
    marker = tree / ".bwd_trace"  # only a tree this script made is replaced
    if tree.exists() and any(tree.iterdir()) and not marker.exists():
        raise SystemExit(f"{tree} exists and was not made by bwd_trace.py: pass another --tree")
    shutil.rmtree(tree, ignore_errors=True)
    shutil.copytree(Path(__file__).resolve().parents[1] / "src", tree)
    marker.touch()
    patch(tree)
    path = os.pathsep.join(p for p in (str(tree), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, PYTHONPATH=path, FLASHTILE_FAST_LAUNCH="0")
    return subprocess.run([sys.executable, __file__, "--run"], env=env, check=True).returncode


if __name__ == "__main__":
    sys.exit(main())
