"""Epilogue stores of the Hopper Gluon kernels (gluon_fwd_consumer.py, gluon_fwd_persistent.py, gluon_bwd_step.py and
gluon_bwd_split_d.py import them)."""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def _store_rows_via(buf, x, base, stride, row0, rows_end):
    """Rows row0 + [0, R) of x ([R, D] 16-bit, a wgmma accumulator's layout) to base + row * stride, those below
    rows_end, through the free shared-memory tile buf ([R, D], NVMMA-swizzled): read back as 16-byte row pieces, the
    stores fill whole sectors (from the accumulator layout, 4-byte pieces took 2.7-4.3 us per dK / dV program at
    D128: session 18's trace, bwd-epilogue-h200-2026-11-30-s18). The barriers: buf is whole before it is read, and
    read before it is written again. Call from one warpgroup's partition of 4 warps (the layout's warps; the barriers
    are that partition's)."""
    R: gl.constexpr = x.shape[0]
    D: gl.constexpr = x.shape[1]
    gl.static_assert(D >= 16 and D <= 256, "rows of 16 to 256 columns: a warp covers 256 // D rows")
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [256 // D, D // 8], [4, 1], [1, 0])
    gl.thread_barrier()  # buf's earlier readers (the wgmmas, or the previous call's loads) are done
    buf.store(x)
    gl.thread_barrier()
    rows = row0 + gl.arange(0, R, layout=gl.SliceLayout(1, layout))  # [R]
    cols = gl.arange(0, D, layout=gl.SliceLayout(0, layout))  # [D]
    gl.store(base + rows.to(gl.int64)[:, None] * stride + cols[None, :], buf.load(layout),
             mask=(rows < rows_end)[:, None])
