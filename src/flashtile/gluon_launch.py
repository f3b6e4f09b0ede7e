"""Host side of the Hopper Gluon forward (kernels/gluon_fwd.py): support check, descriptors, launch.

launch.py uses it for the dense and varlen forward without dropout, mods or paged keys (plain, causal, sliding
window, softcap, ALiBi, sinks, and an additive bias in the layouts bias_ok accepts) when
configs.gluon_fwd_wanted() and gluon_supported() agree; FLASHTILE_GLUON=1 takes it wherever it is supported,
=0 never. Batch > 1 with Sk % BLOCK_N != 0 and varlen read through ragged TMA descriptors (ragged_descriptor), so
no key block reads another sequence's rows. Block-sparse flashtile.attention calls (a block mask and its mask_mod,
sparse_ok) take the same kernel through gluon_sparse_forward. Importing this module never fails: on a triton
without Gluon's Hopper API, or under the interpreter, gluon_supported() is False.
"""
import functools
import math
import os
import warnings
from dataclasses import dataclass, replace

import torch
import triton

from . import configs, fast_launch, philox
from . import launch as _launch  # the NaN-poisoning allocator (a module import: tests patch its attributes)
from .launch import _arch
from .persistent_schedule import persistent_schedule

try:
    from triton.experimental.gluon import language as _gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as _GluonDescriptor

    from .kernels.gluon_dropout import HALF_COMPARE_MAX_THRESHOLD
    from .kernels.gluon_fwd import _attn_fwd_hopper
    from .kernels.gluon_fwd_common import FIXED_MAX_LIMIT, WG_M
    from .kernels.gluon_fwd_persistent import _attn_fwd_hopper_persistent
    GLUON_IMPORT_ERROR = None
except Exception as exc:  # noqa: BLE001  (any failure means: no Gluon path on this triton)
    _attn_fwd_hopper = _attn_fwd_hopper_persistent = None
    FIXED_MAX_LIMIT = 0.0
    HALF_COMPARE_MAX_THRESHOLD = 0
    GLUON_IMPORT_ERROR = exc

LOG2E = 1.4426950408889634
BLOCK_M = 128  # two consumer warpgroups of WG_M = 64 rows (GluonConfig.block_m: the config's own)
WG_ROWS = 64  # kernels/gluon_fwd_common.WG_M, for when Gluon is not importable
# Gluon is experimental and its API moves between triton releases: by default the kernel is used only with the
# releases it was checked on (the H200 machine's); FLASHTILE_GLUON=1 tries it on any.
TESTED_TRITON = ("3.6.",)
_disabled = None  # the exception that made a launch fail in this process (then the portable path serves)


def tested_triton():
    return triton.__version__.startswith(TESTED_TRITON)


def disable(exc):
    """Stop using the Gluon forward in this process after a launch failed to build (e.g. an API change in an
    untested triton), with one warning; the caller falls back to the portable kernels."""
    global _disabled
    if _disabled is None:
        warnings.warn(f"flashtile: the Hopper Gluon forward failed ({type(exc).__name__}: {exc}); using the portable "
                      f"Triton kernels from now on (FLASHTILE_GLUON=0 silences this)", RuntimeWarning, stacklevel=3)
    _disabled = exc


@dataclass(frozen=True)
class GluonConfig:
    """One schedule of the kernel. Registers: 12 warps share 64K registers; the loader warpgroup gives
    most of its share to the two consumer warpgroups (maxnreg is the launch's per-thread budget).
    p_cvt_asm: the key loop rounds P to 16 bits by pairs (one F2FP per pair, without the PRMT that swaps halves per
    pair otherwise).
    tree_max: the key loop's row maxima as trees instead of one dependent FMNMX chain per row.
    persistent: plain and causal dense launches run kernels/gluon_fwd_persistent.py (about one CTA per SM looping
    over the tiles; ctas_per_sm CTAs per SM, max_ctas caps the grid, 0 = no cap: a small cap makes every CTA run
    many tiles, for checking the barriers' running phases); the features and varlen still run the one-tile
    kernel with this config. tma_store (persistent): O leaves through shared memory by TMA stores that overlap the
    next tile's GEMMs (consumers x 64 x D x 2 B more shared memory), where batch == 1 or Sq % 64 == 0; without it
    (or where it does not apply) through one shared tile two consumers take in turns, at
    configs.GLUON_FWD_SMEM_EPILOGUE's head dims, or from the registers (three consumers; persistent_launch_args).
    consumers: consumer warpgroups of WG_M = 64 query rows, 2 (BLOCK_M 128) or 3 (BLOCK_M 192, FA3's D64 tile:
    each warpgroup's softmax hides behind the two others' GEMMs); 3 needs consumer_regs <= 160 and maxnreg 128
    (16 warps with the loader's warpgroup: 3 x 128 x 160 + 128 x 24 <= 64K registers), takes no bias or ALiBi
    (takes_config gives those the default config) and, persistent, no schedule."""
    block_n: int
    stages: int
    pingpong: bool = True
    consumer_regs: int = 240
    loader_regs: int = 24
    maxnreg: int = 168
    p_cvt_asm: bool = False
    tree_max: bool = False
    persistent: bool = False
    ctas_per_sm: int = 1
    max_ctas: int = 0
    tma_store: bool = False
    consumers: int = 2
    lpt_heads: int = 0  # dense causal: grid (tile) order by groups of this many heads (0: head by head; persistent:
    # rank by rank over all heads)
    schedule: bool = False  # persistent, causal: the host lists each CTA's tiles (persistent_schedule.py) in the
    # lpt_heads order
    q_buffers: int = 1  # persistent: Q tiles in shared memory, 2: the next tile's Q loads while this tile runs
    defer_epilogue: bool = False  # persistent: a tile's epilogue behind the next tile's first Q K^T (O by TMA or
    # from the registers; launches that store O through one shared tile keep it in place)
    lazy_rescale: bool = False  # O rescaled only when a row's max grows by more than 2^8 (the persistent kernel and,
    # since session 30, the one-tile kernel: its features, varlen, block masks and rows; gluon_fwd_common._lazy_max)
    alibi_mma: bool = False  # one-tile kernel, ALiBi without softcap or a bias at BLOCK_N 128: the one-sided key
    # blocks' ALiBi columns by one more wgmma (k = 16) instead of an FADD per score
    # (gluon_fwd_common._alibi_mma_operands); with three consumers it lets them take ALiBi (takes_config)
    fixed_max: bool = False  # softcap alone on bf16 (fixed_max_ok): one fixed row max instead of a running one, no
    # rescale of O (kernels/gluon_fwd_common.FIXED_MAX_HEADROOM)

    def __post_init__(self):
        if self.consumers not in (2, 3) or (self.consumers == 3 and self.schedule):
            raise ValueError(f"GluonConfig: consumers must be 2, or 3 without schedule (got {self.consumers}, "
                             f"schedule={self.schedule}): the host's schedule lists 128-row tiles")
        if self.schedule and not self.persistent:
            raise ValueError("GluonConfig: schedule lists the persistent kernel's tiles (persistent=False)")
        if self.q_buffers not in (1, 2) or (self.q_buffers == 2 and not self.persistent):
            raise ValueError(f"GluonConfig: q_buffers must be 1, or 2 with persistent (got {self.q_buffers})")
        if self.defer_epilogue and not self.persistent:
            raise ValueError("GluonConfig: defer_epilogue reorders the persistent kernel's tiles (persistent=False)")

    @property
    def block_m(self):
        """Query rows per program."""
        return self.consumers * WG_ROWS


# Variants the check script can compare on the GPU; "default" is what gluon_forward uses. A variant may cover
# only some head dims. D256 (shared memory per CTA <= 227 KB): Q is 2 x 64 x 256 x 2 B = 64 KB, a K + V stage
# 2 x BLOCK_N x 512 B (64 KB at BLOCK_N 64), so BLOCK_N 64 fits 2 stages, 32 fits 4, 128 only 1; the O
# accumulator alone is 64 x 256 fp32 = 128 registers per consumer thread.
# D64 / D128 take the tree row max and P by pairs since session 6 (gluon-h200-2026-11-29-s6, ratio to cuDNN
# old -> new: D64 4K 0.89 -> 0.89, causal 0.83 -> 0.88; 16K 0.93 -> 0.94, causal 0.90 -> 0.95; D128 4K 0.96 ->
# 0.99, causal 0.98 -> 1.01; 16K 1.01 -> 1.03, causal 1.07 -> 1.10). Measured in the same run and removed:
# FA4's partial polynomial exp2 (no gain at 1/8 of the scores) and softcap's row max from the raw scores (softcap
# stayed above 1.19x plain); code in 26fceee, numbers in docs/perf-log.md.
_TREE_CVT = dict(p_cvt_asm=True, tree_max=True)
VARIANTS = {
    # D128 / D256 causal: heavy-first grid order by groups of 8 heads (lpt_heads; session 13, below). D256: the lazy
    # rescale (session 30, below). D64 / D128: ALiBi's one-sided key blocks by a wgmma (alibi_mma, session 31; 8K
    # tokens, B2, hidden 2048, three passes, ms without -> with: D128 ALiBi 2.014 / 1.864 / 2.176 -> 1.777 / 1.984 /
    # 1.772, causal 1.012 / 1.006 / 1.012 -> 0.953 / 0.960 / 0.964; D64 2.720 / 2.775 / 2.736 -> 2.686 / 2.688 / 2.671,
    # causal 1.420 / 1.432 / 1.423 -> 1.420 / 1.429 / 1.429; the variant timed second ran the D128 ALiBi row faster in
    # every pass: like against like ~5 %, causal ~5 % in every pass).
    "default": {64: GluonConfig(128, 3, alibi_mma=True, fixed_max=True, **_TREE_CVT),
                128: GluonConfig(128, 2, lpt_heads=8, alibi_mma=True, fixed_max=True, **_TREE_CVT),
                256: GluonConfig(64, 2, lpt_heads=8, lazy_rescale=True, fixed_max=True)},
    "plain-softmax": {64: GluonConfig(128, 3), 128: GluonConfig(128, 2)},  # the session-5 default
    "no-pingpong": {64: GluonConfig(128, 3, pingpong=False), 128: GluonConfig(128, 2, pingpong=False),
                    256: GluonConfig(64, 2, pingpong=False)},
    "bn64": {64: GluonConfig(64, 4), 128: GluonConfig(64, 4)},
    "stages3": {64: GluonConfig(128, 4), 128: GluonConfig(128, 3)},
    "d256-bn64s1": {256: GluonConfig(64, 1)},
    "d256-bn32s4": {256: GluonConfig(32, 4)},
    # Issue 4 at 512-1K tokens: the default's schedule in a persistent grid (kernels/gluon_fwd_persistent.py).
    "persistent": {64: GluonConfig(128, 3, persistent=True, **_TREE_CVT),
                   128: GluonConfig(128, 2, persistent=True, **_TREE_CVT),
                   256: GluonConfig(64, 2, persistent=True)},
    # The same kernel on at most 7 CTAs: every CTA runs many tiles (a check of the running barrier phases, not a
    # schedule to time).
    "persistent-7cta": {64: GluonConfig(128, 3, persistent=True, max_ctas=7, **_TREE_CVT),
                        128: GluonConfig(128, 2, persistent=True, max_ctas=7, **_TREE_CVT),
                        256: GluonConfig(64, 2, persistent=True, max_ctas=7)},
    # And with O stored by TMA from shared memory (D256: no room for the 64 KB of O buffers).
    "persistent-tma": {64: GluonConfig(128, 3, persistent=True, tma_store=True, **_TREE_CVT),
                       128: GluonConfig(128, 2, persistent=True, tma_store=True, **_TREE_CVT)},
    "persistent-tma-7cta": {64: GluonConfig(128, 3, persistent=True, tma_store=True, max_ctas=7, **_TREE_CVT),
                            128: GluonConfig(128, 2, persistent=True, tma_store=True, max_ctas=7, **_TREE_CVT)},
    # Issue 4 at D64 (0.84-0.97x cuDNN): FA3's hdim-64 tile, three consumer warpgroups (BLOCK_M 192) taking turns
    # round a ring, so a warpgroup's softmax (66 MUFU.EX2 per thread and key block: 528 clocks of the MUFU pipe)
    # hides behind two warpgroups' GEMMs (2 x 512 clocks) instead of one. Shared memory: Q 3 x 8 KB + 3 K / V
    # stages of 2 x 16 KB = 120 KB. Softcap, sinks, windows, varlen and ALiBi (its columns by the wgmma: in
    # registers ptxas spilled at 160) run in it; a bias (a [192, 128] box ring would not fit), dropout and ALiBi with
    # softcap run the default config (takes_config).
    # Registers: the two worker consumers get 160 (the default partition 168). Lazy rescale since session 30 (below).
    # ALiBi's columns by the wgmma since session 32 (alibi_mma, below): ALiBi runs three consumers too.
    # P by pairs (p_cvt_asm) since session 33: when these kernels were built it made ptxas spill in their full-block
    # loop (12 LDL + 10 STL per block), so P was rounded per element (+32 instructions per warp and block in today's
    # loops); with today's kernels the loops compile without spills (but varlen with a window: gluon_launch_args).
    # Session 33, call 6 (h200-2026-12-02-s33), ms per element -> by pairs, two passes in swapped order,
    # persistent-3wg-tma-q2-lr plain 1K / 2K / 4K / 8K / 16K 0.340-0.344 / 0.603-0.604 / 1.161-1.171 / 2.198-2.214 /
    # 4.341-4.387 -> 0.327-0.328 / 0.576-0.579 / 1.118-1.127 / 2.125-2.138 / 4.219-4.224 (cuDNN 0.324 / 0.613-0.615 /
    # 1.179-1.189 / 2.375-2.378 / 4.89-5.03); d64-3wg at 8K (interleaved) plain 2.155 -> 2.136, causal 1.286 -> 1.198,
    # softcap 3.058 -> 3.023, ALiBi 2.406 -> 2.288, causal ALiBi 1.401 -> 1.319, sink 2.244 -> 2.181, a 4096-key
    # window with softcap 1.775 -> 1.530.
    "d64-3wg": {64: GluonConfig(128, 3, consumers=3, consumer_regs=160, loader_regs=24, maxnreg=128,
                                lazy_rescale=True, alibi_mma=True, fixed_max=True, **_TREE_CVT)},
    # The same three consumers in the persistent grid (session 26): 192-row tiles, O by TMA stores (3 x 8 KB more
    # shared memory). Plain D64 rows of 1025-16384 keys take its "-q2-lr" twin (configs.GLUON_FWD_PERSISTENT); causal
    # measured slower.
    "persistent-3wg-tma": {64: GluonConfig(128, 3, consumers=3, consumer_regs=160, loader_regs=24, maxnreg=128,
                                           persistent=True, tma_store=True, **_TREE_CVT)},
    "persistent-3wg-tma-lpt8": {64: GluonConfig(128, 3, consumers=3, consumer_regs=160, loader_regs=24, maxnreg=128,
                                                persistent=True, tma_store=True, lpt_heads=8, **_TREE_CVT)},
}
# Q double-buffered in the persistent grid (session 27; configs.GLUON_FWD_PERSISTENT serves some of these): the
# loader issues tile t+1's Q as soon as it reaches that tile, not after tile t's last Q K^T. D128: 224 KB of shared
# memory; D256 has no room.
VARIANTS.update({f"{name}-q2": {d: replace(c, q_buffers=2) for d, c in VARIANTS[name].items() if d != 256}
                 for name in ("persistent-tma", "persistent-tma-7cta", "persistent-3wg-tma")})
# And each tile's epilogue deferred behind the next tile's first Q K^T (session 27; measured in session 28: faster
# with two consumers, slower with three; configs.GLUON_FWD_PERSISTENT has the numbers).
VARIANTS.update({f"{name}-de": {d: replace(c, defer_epilogue=True) for d, c in VARIANTS[name].items()}
                 for name in ("persistent-tma-q2", "persistent-tma-7cta-q2", "persistent-3wg-tma-q2")})
# The causal grid's order (kernels/gluon_grid._heavy_first): "head-major" is the order before session 13 (head by
# head, each head's longest rows first), "lptN" starts the longest rows of N heads at a time. Session 13
# (lpt-h200-2026-11-30-s13, 16K tokens, causal 1K / 2K / 4K / 8K, speed / cuDNN, head-major -> lpt8): D128 0.81 ->
# 0.83, 0.92 -> 0.93, 1.03 -> 1.04, 1.06 -> 1.08; D256 0.85 -> 0.88, 0.92 -> 0.95, 0.99 -> 1.05, 1.01 -> 1.06. D64
# (0.65 / 0.81 / 0.89 / 0.93 head-major) was not faster (0.66 / 0.79 / 0.87 / 0.93): it keeps the old order.
# Groups of 32 heads ran slower than 8, and the whole grid at once (LPT without groups) up to 18 % slower than
# head-major: the tiles in flight then read many heads' K / V, which L2 no longer holds.
# The persistent kernel's causal tiles walk rank by rank over all heads, the order lpt-all measured slow in the
# one-tile kernel; "persistent[-tma]-lptN" walk them by groups of N heads with the grid's stride, "-schedN" deal the
# same order by the host's list schedule (GluonConfig.schedule, persistent_schedule.py). Session 14
# (lpt-h200-2026-11-30-s14), D128 causal speed / cuDNN at 1K / 2K / 4K, persistent-tma 0.83 / 0.86 / 0.91, lpt4
# 1.00 / 0.99 / 0.76, lpt8 0.97 / 0.79 / 0.88, lpt16 0.79 / 0.91 / 0.94: the stride's balance depends on the group
# size and the shape.


def grid_order_variants(default, head_dims=(128, 256)):
    """The causal grid-order variants of a launcher's VARIANTS from its default configs (this module's and
    gluon_bwd_launch's): "head-major" (lpt_heads 0) and "lpt4" / "lpt16" at head_dims."""
    return {name: {d: replace(default[d], lpt_heads=n) for d in head_dims}
            for name, n in (("head-major", 0), ("lpt4", 4), ("lpt16", 16))}


def persistent_order_variants():
    """The persistent kernel's causal tile-order variants: "persistent[-tma]-lptN" (groups of N heads, the grid's
    stride) and "-schedN" (the same order, listed per CTA by the host)."""
    orders = {"lpt4": (4, False), "lpt8": (8, False), "lpt16": (16, False), "sched4": (4, True), "sched8": (8, True)}
    return {f"{base}-{name}": {d: replace(c, lpt_heads=n, schedule=listed) for d, c in VARIANTS[base].items()}
            for base in ("persistent", "persistent-tma", "persistent-tma-q2", "persistent-tma-q2-de")
            for name, (n, listed) in orders.items()}


VARIANTS.update({**grid_order_variants(VARIANTS["default"]), **persistent_order_variants()})
# FA4's conditional rescaling (GluonConfig.lazy_rescale, session 29): "-lr" twins of the persistent variants configs
# serves; D256 and the three-consumer D64 grid take them (configs.GLUON_FWD_PERSISTENT has the numbers). And of the
# one-tile kernel's default (session 30), which serves the score features, a bias, dropout, varlen and the plain rows
# past the persistent ranges: "default" at D256 (and the grid-order variants built from it above) and "d64-3wg" (D64's
# long rows) rescale lazily themselves, "default-lr" is the D64 / D128 two-consumer twin. Call 3 (h200-2026-12-02-s30),
# ms at 8K tokens (B2, hidden 2048), two passes in swapped order, without -> with: D256 softcap 30 1.718 / 1.756 ->
# 1.645 / 1.618, causal softcap 0.960 / 0.974 -> 0.886 / 0.883, sink 1.624 / 1.626 -> 1.561 / 1.529, bias 2.044 / 2.061
# -> 1.974 / 2.000, a 4096-key window with softcap 0.708 / 0.737 -> 0.693 / 0.703, causal bias 1.052 / 1.055 -> 1.056 /
# 1.011, ALiBi 1.646 / 1.618 -> 1.650 / 1.649; d64-3wg softcap 3.238 / 3.235 -> 3.064 / 3.063, sink 2.327 / 2.415 ->
# 2.236 / 2.212, causal softcap 1.760 / 1.764 -> 1.746 / 1.747, window + softcap 1.765 / 1.762 -> 1.788 / 1.780; D128
# two consumers slower (softcap 2.175 / 2.180 -> 2.216 / 2.233, ALiBi 1.903 / 1.846 -> 1.918 / 1.953, bias 2.382 / 2.464
# -> 2.554 / 2.486), as in the persistent kernel.
# Three consumers with ALiBi by the wgmma (built in session 31 as "d64-3wg-am": no spills at D64 with ALiBi, windows
# and sinks, dense and varlen, but 8 B with varlen + window + sink). Until then d64-3wg's ALiBi calls fell back to the
# two-consumer default (takes_config). Session 32, call 1 (h200-2026-12-02-s32), ms at D64 8K (B2, H32), two passes in
# swapped order, default fallback -> three consumers: ALiBi 2.625 / 2.644 -> 2.435 / 2.403, causal ALiBi 1.401 / 1.408
# -> 1.383 / 1.386; d64-3wg took alibi_mma then.
VARIANTS.update({f"{name}-lr": {d: replace(c, lazy_rescale=True) for d, c in VARIANTS[name].items()}
                 for name in ("persistent", "persistent-sched4", "persistent-tma-q2", "persistent-tma-q2-de",
                              "persistent-tma-q2-de-lpt8", "persistent-tma-q2-de-sched4", "persistent-tma-sched4",
                              "persistent-3wg-tma-q2", "default")})
# One fixed row max for softcap alone on bf16 (GluonConfig.fixed_max, session 34) in the configs that serve softcap
# (the one-tile default, and d64-3wg for D64's long rows); their "-rmax" twins keep the running max. Session 34,
# call 1 (h200-2026-12-02-s34), 8K tokens (B2, hidden 2048), interleaved rounds, ms running -> fixed: D128 softcap 30
# 2.179 -> 2.004, causal 1.155 -> 1.113, a 4096-key window with softcap 0.909 -> 0.856; D64 (d64-3wg) 3.032 -> 2.902,
# causal 1.713 -> 1.600, window 1.534 -> 1.305; D256 1.656 -> 1.514, causal 0.904 -> 0.853, window 0.726 -> 0.675.
VARIANTS.update({f"{name}-rmax": {d: replace(c, fixed_max=False) for d, c in VARIANTS[name].items()}
                 for name in ("default", "d64-3wg")})
HEAD_DIMS = (64, 128, 256)
_DTYPES = (torch.float16, torch.bfloat16)


def _tma_2d_ok(t):
    """t (B, S, H, D), or packed varlen (total, H, D), viewed as a 2D (B * S, H * D) TMA tensor: rows of a head
    contiguous, 16-byte aligned."""
    shape, s = t.shape, t.stride()  # one read each (host time)
    if len(shape) == 3:
        total, heads, head_dim = shape
        return (s[2] == 1 and (s[1] == head_dim or heads == 1)
                and s[0] * t.element_size() % 16 == 0 and t.data_ptr() % 16 == 0)
    batch, seqlen, heads, head_dim = shape
    return (s[3] == 1 and (s[2] == head_dim or heads == 1)
            and (s[0] == seqlen * s[1] or batch == 1)
            and s[1] * t.element_size() % 16 == 0 and t.data_ptr() % 16 == 0)


def _varlen_ok(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k):
    """Packed (total, H, D) q / k / v at int32 cu_seqlens (B + 1,) on q's device (launch.Geometry's varlen form;
    interface.py has validated the values). Rows of one sequence are found from cu_seqlens on the device, so
    nothing here depends on the lengths but the grid (max_seqlen_q) and the int32 / 2**30 row limits."""
    if not all(isinstance(t, torch.Tensor) and t.dim() == 3 for t in (q, k, v)):
        return False
    if not all(isinstance(c, torch.Tensor) and c.dtype == torch.int32 and c.dim() == 1 and c.device == q.device
               and c.numel() >= 2 and c.stride(0) == 1 for c in (cu_seqlens_q, cu_seqlens_k)):
        return False
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        return False
    # Ragged descriptors address at most 2**30 rows; empty q or k (a TMA descriptor needs a base address) and
    # max_seqlen_q == 0 (an empty grid) are left to the portable path.
    return 0 < q.shape[0] <= RAGGED_ROWS and 0 < k.shape[0] <= RAGGED_ROWS and max_seqlen_q > 0


def mask_mode(causal, window_size):
    """(is_causal, is_local, window_left, window_right) of flash-attn's (causal, window_size), -1 = unbounded:
    causal is the window (left, 0), and the window (-1, 0) is plain causal (the kernel's IS_CAUSAL path)."""
    left, right = window_size
    left = int(left) if left is not None and left >= 0 else -1  # no generator: this runs several times per call
    right = int(right) if right is not None and right >= 0 else -1
    if causal:
        right = 0
    is_causal = left < 0 and right == 0
    return is_causal, not is_causal and (left >= 0 or right >= 0), left, right


def _supported_device(*tensors):
    """CUDA tensors on a Hopper (sm90) device: the Gluon kernel uses its TMA, wgmma and setmaxnreg."""
    return all(t.is_cuda for t in tensors) and _arch(tensors[0].device) == (9, 0)


def alibi_ok(alibi_slopes, q, batch, heads_q):
    """No ALiBi, or slopes the Gluon kernels read: fp32 (Hq,) or (B, Hq) on q's device."""
    return alibi_slopes is None or (
        isinstance(alibi_slopes, torch.Tensor) and alibi_slopes.device == q.device
        and alibi_slopes.dtype == torch.float32 and tuple(alibi_slopes.shape) in ((heads_q, ), (batch, heads_q)))


def dropout_ok(dropout_p, rng, q):
    """No dropout, or 0 < dropout_p < 1 with the seed the Gluon kernels read: an int64 tensor on q's device."""
    return dropout_p == 0 or (0 < dropout_p < 1 and isinstance(rng, torch.Tensor) and rng.dtype == torch.int64
                              and rng.device == q.device)


BIAS_DTYPES = (torch.float16, torch.bfloat16)


def bias_layout(attn_bias, seqlen_q, seqlen_k):
    """(rows, row stride, rows per batch, rows per head) of the 2-D (rows, Sk) TMA view of a 4-D attn_bias
    (B or 1, Hq or 1, Sq, Sk) in which query row i of (b, h) is row b * rows_b + h * rows_h + i, or None where
    there is none: an fp16 / bf16 bias whose last dim is Sk and contiguous, whose query dim is not broadcast
    (Sq == 1 aside) and whose row stride is a positive multiple of 16 bytes with each batch / head stride a
    multiple of it (size-1 and expanded (stride 0) dims step by 0: every batch / head reads the first one's
    rows), 16-byte aligned, under 2**31 rows."""
    if not (isinstance(attn_bias, torch.Tensor) and attn_bias.dim() == 4 and attn_bias.dtype in BIAS_DTYPES):
        return None
    (bb, hb, sq, sk), (sb, sh, sm, sn) = attn_bias.shape, attn_bias.stride()
    if sq != seqlen_q or sk != seqlen_k or sn != 1 or sm < sk or sm * attn_bias.element_size() % 16:
        return None
    if attn_bias.data_ptr() % 16 or attn_bias.numel() == 0:
        return None
    steps = []
    for size, stride in ((bb, sb), (hb, sh)):
        if size == 1 or stride == 0:  # broadcast (a size-1 dim, or an expanded one): every b / h reads row 0's
            steps.append(0)
        elif stride > 0 and stride % sm == 0:
            steps.append(stride // sm)
        else:
            return None
    rows = (bb - 1) * steps[0] + (hb - 1) * steps[1] + sq
    # int32 TMA row coordinates, a query tile (BLOCK_M rows) past the last row included.
    if rows + BLOCK_M >= 2**31:
        return None
    return rows, sm, steps[0], steps[1]


def bias_ok(attn_bias, q, seqlen_q, seqlen_k):
    """No bias, or one the Gluon forward reads through TMA (bias_layout) on q's device; any 16-bit dtype (an fp16
    bias with bf16 q too). Refused (the portable kernel serves them): fp32 biases (their [128, BLOCK_N] ring would
    take 2 x 64 KB, which does not fit beside K / V at D128 / D256), a broadcast query or key dim (size 1 or stride
    0 where Sq / Sk > 1), a non-contiguous last dim, row strides that are not multiples of 16 bytes, batch / head
    strides that are not whole rows, a base address off 16 bytes, and over 2**31 rows. Varlen is taken (positions
    within each sequence index the (B or 1, Hq or 1, max_seqlen_q, max_seqlen_k) bias)."""
    if attn_bias is None:
        return True
    return attn_bias.device == q.device and bias_layout(attn_bias, seqlen_q, seqlen_k) is not None


def gluon_supported(q, k, v, causal=False, dropout_p=0.0, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                    attn_bias=None, sink=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0,
                    rng=None, **other_features):
    """True when the Gluon forward can compute flash_attn_func(q, k, v, causal=causal, window_size=window_size,
    softcap=softcap, alibi_slopes=alibi_slopes, sink=sink), or flash_attn_varlen_func with cu_seqlens_q / _k
    and max_seqlen_q / _k: CUDA sm90, no interpreter, fp16/bf16 dense (B, S, H, D) or packed varlen (total, H, D)
    with int32 cu_seqlens, head_dim 64, 128 or 256, heads_q % heads_kv == 0, TMA-compatible strides, (dense)
    every query row seeing at least one key (causal: seqlen_q <= seqlen_k; a window's right side:
    seqlen_q - seqlen_k <= right; varlen rows without keys are handled in the kernel), ALiBi slopes fp32 (Hq,)
    or (B, Hq), sink (Hq,), attn_bias fp16 / bf16 (B or 1, Hq or 1, Sq, Sk) in a layout bias_ok accepts (varlen:
    (B or 1, Hq or 1, max_seqlen_q, max_seqlen_k)); dropout 0 <= dropout_p <= 0.96875 with rng, the int64 (1,)
    Philox seed on q's device, without a bias; no paged keys (block_table) or mods."""
    if _attn_fwd_hopper is None or _disabled is not None or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return False
    if other_features and any(v_ is not None and (isinstance(v_, torch.Tensor) or v_)
                              for v_ in other_features.values()):
        return False
    if softcap < 0 or not dropout_ok(dropout_p, rng, q):
        return False
    if philox.dropout_threshold(dropout_p) > HALF_COMPARE_MAX_THRESHOLD:  # dropout_p > 0.96875 (gluon_dropout)
        return False
    if dropout_p and attn_bias is not None:
        # The draws' per-warp exchange takes ~3.8 KB of shared memory, which the bias ring has used up (D128 / D256:
        # 233,600 B of 232,448 at launch).
        return False
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    if varlen:
        if not _varlen_ok(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k):
            return False
    elif not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)
              and q.dim() == 4 and k.dim() == 4 and v.dim() == 4):  # no generator: ~1 us less per call
        return False
    if not _supported_device(q, k, v):
        return False
    dtype = q.dtype
    if dtype not in _DTYPES or k.dtype != dtype or v.dtype != dtype:
        return False
    if varlen:  # (total, H, D): sizes as a batch of cu_seqlens.numel() - 1 sequences of the maximal lengths
        batch, seqlen_q, seqlen_k = cu_seqlens_q.numel() - 1, max_seqlen_q, max(max_seqlen_k, 1)
        (heads_q, head_dim), (heads_kv, head_dim_k) = q.shape[1:], k.shape[1:]
    else:
        batch, seqlen_q, heads_q, head_dim = q.shape
        seqlen_k, heads_kv, head_dim_k = k.shape[1], k.shape[2], k.shape[3]
        if k.shape[0] != batch:
            return False
    if head_dim not in HEAD_DIMS or k.shape != v.shape or head_dim_k != head_dim:
        return False
    if heads_kv == 0 or heads_q % heads_kv or seqlen_q == 0 or seqlen_k == 0 or batch == 0:
        return False
    if not alibi_ok(alibi_slopes, q, batch, heads_q):
        return False
    if attn_bias is not None and not bias_ok(attn_bias, q, max_seqlen_q if varlen else seqlen_q,
                                             max_seqlen_k if varlen else seqlen_k):
        return False
    if sink is not None and not (isinstance(sink, torch.Tensor) and sink.device == q.device
                                 and tuple(sink.shape) == (heads_q, )):
        return False
    _, _, _, right = mask_mode(causal, window_size)
    if not varlen and right >= 0 and seqlen_q - seqlen_k > right:  # rows without keys: the portable kernel's
        return False
    # int32 TMA coordinates; a ragged descriptor (batch > 1, possibly) addresses at most 2**30 rows.
    if not varlen and max(batch * seqlen_q, batch * seqlen_k) >= (2**31 if batch == 1 else RAGGED_ROWS):
        return False
    # Batch > 1 with Sk % BLOCK_N != 0 and varlen read through ragged descriptors (ragged_descriptor): a key
    # block past a sequence's end is zero-filled instead of reading the next sequence's keys and values.
    return _tma_2d_ok(q) and _tma_2d_ok(k) and _tma_2d_ok(v)


@functools.lru_cache(maxsize=None)  # layouts are immutable; building one costs ~10 us of host time per descriptor
def shared_layout(block_shape, gl_dtype):
    """The NVMMA shared-memory layout (128-byte swizzle where the rows allow) of a TMA box of block_shape."""
    return _gl.NVMMASharedLayout.get_default_for(list(block_shape), gl_dtype)


@functools.lru_cache(maxsize=None)  # keyed by torch's dtype: hashing a gluon dtype is Python code (~0.5 us)
def torch_layout(block_shape, dtype):
    """shared_layout(block_shape, ...) of 16-bit torch dtype dtype."""
    return shared_layout(block_shape, _gl.float16 if dtype == torch.float16 else _gl.bfloat16)


def tma_descriptor(t, shape, strides, block_shape, layout):
    """Gluon's TensorDescriptor without its dataclass checks, which cost ~5 us of host time per descriptor on the
    H200 machine (four to six per call). The callers' support checks cover them (16-byte aligned base and strides,
    unit last stride, positive sizes: _tma_2d_ok, gluon_bwd_launch._tma_3d_ok; the block shapes are the kernels'
    constants), and the driver still refuses a bad one when it encodes the tensor map at launch.
    tests/test_gluon_dispatch.py checks that the two constructions agree and that the checked one accepts the inputs."""
    desc = _GluonDescriptor.__new__(_GluonDescriptor)
    desc.base, desc.shape, desc.strides, desc.block_shape, desc.layout, desc.padding = (
        t, shape, strides, block_shape, layout, "zero")
    return desc


def _descriptor(t, block_rows, ragged=False):
    """t (B, S, H, D) or packed (total, H, D) as a 2D (rows, H * D) TMA tensor with boxes [block_rows, D], or
    with ragged, the ragged 4-D view of it (ragged_descriptor)."""
    shape, strides = t.shape, t.stride()
    head_dim, heads = shape[-1], shape[-2]
    rows, row_stride = (shape[0], strides[0]) if len(shape) == 3 else (shape[0] * shape[1], strides[1])
    if ragged:
        gl_dtype = _gl.float16 if t.dtype == torch.float16 else _gl.bfloat16
        return ragged_descriptor(t, rows, row_stride, heads * head_dim, block_rows, head_dim, gl_dtype)
    return tma_descriptor(t, [rows, heads * head_dim], [row_stride, 1], [block_rows, head_dim],
                          torch_layout((block_rows, head_dim), t.dtype))


RAGGED_ROWS = 2**30


def ragged_descriptor(t, rows, row_stride, width, block_rows, block_cols, gl_dtype):
    """The rows x width matrix at t (row stride row_stride) as triton.tools.ragged_tma's 4-D "ragged" descriptor:
    shape (2**31 - 2**16, 2**31 - 2**16, 2**30, width), strides (2**34 - row_stride, row_stride, row_stride, 1),
    boxes [1, 1, block_rows, block_cols]. The box at (2**30, end, 2**30 - n + r, c) holds rows r... of the n rows
    that end at row `end` (the address wraps modulo 2**64 back to row end - n + r), and the hardware zero-fills
    (loads) or drops (stores) every row at or past `end`: per-sequence bounds from one host descriptor, no
    per-sequence state and nothing recompiled per length (kernels/gluon_fwd_common._tma_load)."""
    assert rows <= RAGGED_ROWS
    max_int = 0x7FFF0000
    return tma_descriptor(t, [max_int, max_int, RAGGED_ROWS, width], [2**34 - row_stride, row_stride, row_stride, 1],
                          [1, 1, block_rows, block_cols], shared_layout((1, 1, block_rows, block_cols), gl_dtype))


def bias_descriptor(attn_bias, seqlen_q, seqlen_k, block_n):
    """(descriptor, rows per batch, rows per head) of attn_bias (bias_layout's 2-D view, boxes [BLOCK_M,
    block_n])."""
    rows, row_stride, rows_b, rows_h = bias_layout(attn_bias, seqlen_q, seqlen_k)
    desc = tma_descriptor(attn_bias, [rows, seqlen_k], [row_stride, 1], [BLOCK_M, block_n],
                          torch_layout((BLOCK_M, block_n), attn_bias.dtype))
    return desc, rows_b, rows_h


def gluon_launch_args(q, k, v, out, lse, softmax_scale, causal, config, window_size=(-1, -1), softcap=0.0,
                      alibi_slopes=None, sink=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0,
                      max_seqlen_k=0, attn_bias=None, mods=None, dropout_p=0.0, rng=None):
    """(grid, args, constexprs, launch options) of one launch; shared by gluon_forward and the offline
    compile check so both compile the same kernel. Features off leave the constexprs at the plain kernel's.
    mods: a launch.ModArgs with a block mask (sparse_ok): the block-sparse walk, MASK_MOD in partial blocks.
    Varlen (cu_seqlens_q given): q / k / v / out packed (total, H, D), lse (Hq, total_q); the grid covers
    max_seqlen_q rows of every sequence and the kernel reads each one's lengths from cu_seqlens.
    attn_bias: 4-D, as gluon_supported takes it (its 2-D TMA descriptor: bias_descriptor).
    dropout_p > 0: rng the int64 (1,) Philox seed (the kernel's HAS_DROPOUT; two-consumer configs only)."""
    varlen = cu_seqlens_q is not None
    if varlen:
        batch, seqlen_q, seqlen_k = cu_seqlens_q.numel() - 1, max_seqlen_q, max_seqlen_k
        heads_q, head_dim, heads_kv = q.shape[1], q.shape[2], k.shape[1]
        # (total, H, D) out and (Hq, total_q) lse: no batch stride; the kernel adds each sequence's first row.
        out_strides, lse_strides = (0, out.stride(0), out.stride(1)), (0, lse.stride(0))
    else:
        batch, seqlen_q, heads_q, head_dim = q.shape
        seqlen_k, heads_kv = k.shape[1], k.shape[2]
        out_strides, lse_strides = (out.stride(0), out.stride(1), out.stride(2)), (lse.stride(0), lse.stride(1))
    # Zero-filled key blocks past each sequence's end, where a block could reach into the next sequence.
    # Block-sparse: a listed key block of SPARSE_N > BLOCK_N keys can put a whole tile past Sk.
    key_block = max(config.block_n, mods.block_size[1]) if mods is not None else config.block_n
    ragged = varlen or (batch > 1 and seqlen_k % key_block != 0)
    is_causal, is_local, left, right = mask_mode(causal, window_size)
    unbounded = seqlen_q + seqlen_k  # as launch.ScoreArgs: no position difference reaches it
    alibi = alibi_slopes.float().contiguous() if alibi_slopes is not None else lse  # lse: an unread placeholder
    sink_t = sink.float().contiguous() if sink is not None else lse
    args = (_descriptor(q, WG_M.value, ragged), _descriptor(k, config.block_n, ragged),
            _descriptor(v, config.block_n, ragged), out, lse,
            alibi, sink_t, *out_strides, *lse_strides,
            alibi.stride(0) if alibi_slopes is not None and alibi.dim() == 2 else 0,
            seqlen_q, seqlen_k, heads_q, heads_q // heads_kv,
            softmax_scale / softcap if softcap > 0 else softmax_scale * LOG2E, float(softcap) * LOG2E,
            left if left >= 0 else unbounded, right if right >= 0 else unbounded,
            cu_seqlens_q if varlen else lse, cu_seqlens_k if varlen else lse,
            *(bias_descriptor(attn_bias, seqlen_q, seqlen_k, config.block_n) if attn_bias is not None
              else (lse, 0, 0)), float(softmax_scale), *_sparse_args(mods),
            rng if dropout_p else lse, 1.0 / (1.0 - dropout_p), philox.dropout_threshold(dropout_p))
    constexprs = dict(HEAD_DIM=head_dim, BLOCK_N=config.block_n, STAGES=config.stages, IS_CAUSAL=is_causal,
                      PINGPONG=config.pingpong, CONSUMER_REGS=config.consumer_regs, LOADER_REGS=config.loader_regs,
                      IS_LOCAL=is_local, SOFTCAP=softcap > 0, HAS_ALIBI=alibi_slopes is not None,
                      HAS_SINK=sink is not None, VARLEN=varlen, RAGGED=ragged,
                      # Three consumers with varlen and a window: P by pairs spilled in the full-block loops (5 LDL +
                      # 5 STL per block, session 33's offline count), P per element did not.
                      P_CVT_ASM=config.p_cvt_asm and not (config.consumers == 3 and varlen and is_local),
                      TREE_MAX=config.tree_max,
                      HAS_BIAS=attn_bias is not None, CONSUMERS=config.consumers)
    alibi_mma = alibi_by_mma(config, alibi_slopes, softcap, attn_bias)
    if config.consumers != 2:
        assert attn_bias is None and (alibi_slopes is None or alibi_mma) and mods is None and not dropout_p, \
            "a bias, ALiBi (but by ALIBI_MMA), dropout or a block mask runs two consumers (takes_config, sparse_ok)"
    if dropout_p:
        assert philox.dropout_threshold(dropout_p) <= HALF_COMPARE_MAX_THRESHOLD, "p > 0.96875 (gluon_supported)"
        constexprs.update(HAS_DROPOUT=True)
    # O through each warpgroup's Q tile: dense launches of two consumers at the head dims
    # configs.GLUON_FWD_SMEM_EPILOGUE lists (plain and causal since session 19, with score features, windows, sinks,
    # a bias and dropout under the plain causal mask since session 24; configs.py has the numbers). Other dropout
    # launches (no mask, or a window), varlen and block-sparse launches, three consumers and the other head dims
    # keep the register stores.
    if (not varlen and mods is None and config.consumers == 2 and not (dropout_p and not is_causal)
            and head_dim in configs.GLUON_FWD_SMEM_EPILOGUE):
        constexprs.update(O_VIA_SMEM=True)
    if config.lazy_rescale:
        constexprs.update(LAZY_RESCALE=True)
    if alibi_mma:
        constexprs.update(ALIBI_MMA=True)
    if config.fixed_max and fixed_max_ok(q.dtype, softcap, alibi_slopes, sink, attn_bias, mods):
        constexprs.update(FIXED_MAX=True)
    if config.lpt_heads and is_causal and not varlen and mods is None:  # (is_causal excludes a window: mask_mode)
        constexprs.update(LPT_HEADS=config.lpt_heads)  # only then: other launches keep their kernels
    if mods is not None:
        # EVEN_N: every listed key block lies inside Sk, so partial tiles need no sequence-end mask.
        constexprs.update(MASK_MOD=mods.mask_mod, BLOCK_SPARSE=True, SPARSE_M=mods.block_size[0],
                          SPARSE_N=mods.block_size[1], EVEN_N=seqlen_k % mods.block_size[1] == 0)
    grid = (math.ceil(seqlen_q / config.block_m), batch * heads_q)
    return grid, args, constexprs, dict(num_warps=4, maxnreg=config.maxnreg)


def block_list_args(lists, aux):
    """The 14 block-sparse kernel arguments of a block mask's four lists (num, idx, full_num, full_idx; the forward
    walks kv_lists, the backward the transposed q_lists): the lists, the (batch, head, block) strides of num and idx
    (0 along broadcast dims) and four aux tensors (None for absent ones)."""
    num, idx = lists[0], lists[1]
    strides = [0 if num.shape[i] == 1 else num.stride(i) for i in range(3)]
    strides += [0 if idx.shape[i] == 1 else idx.stride(i) for i in range(3)]
    return (*lists, *strides, *aux, *(None,) * (4 - len(aux)))


def _sparse_args(mods):
    """The block-sparse arguments of _attn_fwd_hopper (block_list_args of the key-block lists); all None without
    mods, so a dense launch compiles the kernel it always did."""
    return (None,) * 14 if mods is None else block_list_args(mods.kv_lists, mods.aux)


SPARSE_HEAD_DIMS = (64, 128, 256)  # D256: 64-key tiles, two per 128-key block
_sparse_failed = {}  # mask_mod adapter -> the exception its Gluon build raised (then the portable kernel serves it)


def sparse_ok(q, k, v, window_left, window_right, mods, variant="default"):
    """True when the Gluon forward can run flashtile.attention's block-sparse call: gluon_supported's dense
    conditions (sm90, fp16 / bf16, TMA-compatible strides, GQA), head dim 64, 128 or 256, no causal / window
    (flex.attention refuses causal with a block mask; causal with a lone mask_mod stays portable), a block mask whose
    query block is a multiple of the 128-row tile and whose key block a multiple of the variant's BLOCK_N (so a tile
    never straddles two blocks: other block sizes, e.g. (64, 64) or (128, 64), run the portable kernel, which
    shrinks its tiles to the blocks), a mask_mod or none, and no score_mod (kernels/gluon_fwd has no score_mod
    hook: the portable kernel serves it). A mask_mod whose Gluon build failed once stays portable."""
    if mods is None or mods.block_size is None or mods.score_mod is not None or mods.score_mod_grad is not None:
        return False
    if window_left >= 0 or window_right >= 0 or q.shape[-1] not in SPARSE_HEAD_DIMS:
        return False
    config = VARIANTS[variant].get(q.shape[-1])
    rows, cols = mods.block_size
    if config is None or config.consumers != 2 or rows % BLOCK_M or cols % config.block_n:
        return False
    if mods.mask_mod is not None and mods.mask_mod in _sparse_failed:
        return False
    return gluon_supported(q, k, v)


def record_sparse_failure(failed, direction, mods, exc):
    """A block-sparse launch of the Gluon `direction` ("forward" / "backward") failed to build (e.g. a mask_mod that
    Gluon cannot compile): one warning, and failed (that module's registry) sends the mask_mod to the portable
    kernels from now on; the dense Gluon kernels stay on."""
    warnings.warn(f"flashtile: the Hopper Gluon block-sparse {direction} failed for this mask_mod "
                  f"({type(exc).__name__}: {exc}); it runs the portable Triton kernels from now on "
                  f"(FLASHTILE_GLUON_SPARSE=0 silences this)", RuntimeWarning, stacklevel=4)
    failed[mods.mask_mod] = exc


def sparse_failed(mods, exc):
    """A block-sparse forward launch failed to build: that mask_mod runs the portable forward from now on."""
    record_sparse_failure(_sparse_failed, "forward", mods, exc)


def gluon_sparse_forward(q, k, v, softmax_scale, mods, variant="default"):
    """out (q's shape and dtype) and lse fp32 (B, Hq, Sq) of flashtile.attention(q, k, v, block_mask=...) with the
    block lists and mask_mod in mods (a launch.ModArgs that sparse_ok accepts), natural log, as the portable
    forward writes them (so either block-sparse backward, Gluon or portable, runs on them)."""
    poison = _launch.poison_outputs()
    shape = q.shape
    out = _launch._empty(shape, q, poison=poison)
    lse = _launch._empty((shape[0], shape[2], shape[1]), q, torch.float32, poison)
    config = VARIANTS[variant][q.shape[-1]]
    grid, args, constexprs, options = gluon_launch_args(q, k, v, out, lse, float(softmax_scale), False, config,
                                                        mods=mods)
    fast_launch.launch(_attn_fwd_hopper, grid, args, {**constexprs, **options})
    return out, lse


def alibi_by_mma(config, alibi_slopes, softcap=0.0, attn_bias=None):
    """True when a launch with config adds ALiBi's columns by the wgmma (ALIBI_MMA): its alibi_mma, ALiBi without
    softcap (tanh comes between) or a bias (no shared memory left for the operands at D128), 128-key blocks."""
    return (config.alibi_mma and alibi_slopes is not None and not softcap and attn_bias is None
            and config.block_n == 128)


def fixed_max_ok(dtype, softcap, alibi_slopes=None, sink=None, attn_bias=None, mods=None):
    """Softcap bounds every score: the kernel's FIXED_MAX serves bf16 calls with softcap * log2(e) <= FIXED_MAX_LIMIT
    (softcap <= 51.98, Gemma 2's 50 among them) and no ALiBi, sink, bias or block mask (each can move a row's max
    past the cap's bound). fp16's P has no room for the spread (kernels/gluon_fwd_common.FIXED_MAX_HEADROOM)."""
    return (dtype == torch.bfloat16 and 0 < softcap * LOG2E <= FIXED_MAX_LIMIT and alibi_slopes is None
            and sink is None and attn_bias is None and mods is None)


def takes_config(variant, head_dim, attn_bias=None, alibi_slopes=None, dropout_p=0.0, softcap=0.0):
    """VARIANTS[variant][head_dim], or the default's config where that one cannot serve the call: a
    three-consumer config (192-row tiles, 160 registers per consumer thread) with an attn_bias (the bias ring's
    [BLOCK_M, BLOCK_N] boxes are sized for 128 rows) or ALiBi slopes (the key loop's per-column ALiBi term, 32
    more live registers, made ptxas spill 296-608 B in d64-3wg before it took alibi_mma in session 32; not where the
    config's alibi_mma takes that term into a wgmma: no softcap) or dropout (its draws take 32 more)."""
    config = VARIANTS[variant][head_dim]
    alibi_spills = alibi_slopes is not None and not alibi_by_mma(config, alibi_slopes, softcap, attn_bias)
    if config.consumers != 2 and (attn_bias is not None or alibi_spills or dropout_p):
        return VARIANTS["default"][head_dim]
    return config


def plain_dense(causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, sink=None, cu_seqlens_q=None,
                attn_bias=None):
    """A dense, plain or causal call without window, softcap, ALiBi, sink or bias: the calls the persistent kernel
    takes (takes_persistent) and configs.GLUON_FWD_MIN_KEYS_PLAIN / GLUON_FWD_PERSISTENT route."""
    return not (mask_mode(causal, window_size)[1] or softcap or alibi_slopes is not None or sink is not None
                or cu_seqlens_q is not None or attn_bias is not None)


def takes_persistent(config, q, k, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, sink=None,
                     cu_seqlens_q=None, attn_bias=None):
    """True when a launch with config runs the persistent kernel: config.persistent, a plain_dense call (the
    others and varlen run _attn_fwd_hopper with the same config), and not D256 through ragged descriptors (batch >
    1, Sk % BLOCK_N != 0: ptxas spills 12-56 B there)."""
    if not (config.persistent and _attn_fwd_hopper_persistent is not None
            and plain_dense(causal, window_size, softcap, alibi_slopes, sink, cu_seqlens_q, attn_bias)):
        return False
    return not (q.shape[-1] == 256 and q.shape[0] > 1 and k.shape[1] % config.block_n != 0)


@functools.lru_cache(maxsize=None)
def _sm_count(device_index):
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def persistent_launch_args(q, k, v, out, lse, softmax_scale, causal, config, sm_count=None):
    """(grid, args, constexprs, launch options) of the persistent kernel (takes_persistent): dense (B, S, H, D)
    q / k / v, lse (B, Hq, Sq); the grid is min(tiles, ctas_per_sm * SMs (sm_count, or q's device's), max_ctas)."""
    batch, seqlen_q, heads_q, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    ragged = batch > 1 and seqlen_k % config.block_n != 0
    is_causal, _, _, _ = mask_mode(causal, (-1, -1))
    n_m, n_bh = math.ceil(seqlen_q / config.block_m), batch * heads_q
    n_tiles = n_m * n_bh
    if sm_count is None:
        sm_count = _sm_count(q.device.index if q.device.index is not None else torch.cuda.current_device())
    ctas = min(n_tiles, config.ctas_per_sm * sm_count)
    if config.max_ctas:
        ctas = min(ctas, config.max_ctas)
    o_tma = config.tma_store and (batch == 1 or seqlen_q % WG_M.value == 0) and _tma_2d_ok(out)
    out_strides, lse_strides = out.stride(), lse.stride()
    args = (_descriptor(q, WG_M.value, ragged), _descriptor(k, config.block_n, ragged),
            _descriptor(v, config.block_n, ragged), _descriptor(out, WG_M.value) if o_tma else out, out, lse,
            *out_strides[:3], *lse_strides[:2],
            seqlen_q, seqlen_k, heads_q, heads_q // heads_kv, softmax_scale * LOG2E, n_m, n_bh, n_tiles)
    constexprs = dict(HEAD_DIM=head_dim, BLOCK_N=config.block_n, STAGES=config.stages, IS_CAUSAL=is_causal,
                      PINGPONG=config.pingpong, CONSUMER_REGS=config.consumer_regs, LOADER_REGS=config.loader_regs,
                      RAGGED=ragged, P_CVT_ASM=config.p_cvt_asm, TREE_MAX=config.tree_max, O_TMA=o_tma)
    if config.q_buffers != 1:
        constexprs.update(Q_BUFFERS=config.q_buffers)
    o_via_smem = config.consumers == 2 and not o_tma and head_dim in configs.GLUON_FWD_SMEM_EPILOGUE
    if config.defer_epilogue and not o_via_smem:
        constexprs.update(DEFER_EPILOGUE=True)
    if config.lazy_rescale:
        constexprs.update(LAZY_RESCALE=True)
    if config.consumers != 2:
        constexprs.update(CONSUMERS=config.consumers)  # its O leaves by TMA or from the registers
    elif o_via_smem:  # O through one shared tile (session 20)
        constexprs.update(O_VIA_SMEM=True)
    schedule = None
    if config.schedule and is_causal:
        schedule = persistent_schedule(q.device, n_m, n_bh, ctas, config.lpt_heads or n_bh, seqlen_q, seqlen_k,
                                       config.block_m, config.block_n)
    if schedule is not None:
        constexprs.update(SCHEDULE=True)  # the list holds the order: LPT_HEADS would only split the compiles
    elif config.lpt_heads and is_causal:
        constexprs.update(LPT_HEADS=config.lpt_heads)
    args += (lse if schedule is None else schedule, )  # Schedule: unused without SCHEDULE
    return (ctas, ), args, constexprs, dict(num_warps=4, maxnreg=config.maxnreg)


def gluon_forward(q, k, v, softmax_scale=None, causal=False, variant="default", window_size=(-1, -1), softcap=0.0,
                  alibi_slopes=None, sink=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0,
                  max_seqlen_k=0, attn_bias=None, dropout_p=0.0, rng=None):
    """out (q's shape and dtype) and lse fp32 (B, Hq, Sq), or (Hq, total_q) for packed varlen q / k / v with
    cu_seqlens_q / _k, natural log (as the portable forward writes it, including the sink when there is one, so
    the existing backward runs on them). Requires gluon_supported(q, k, v, causal, window_size=..., softcap=...,
    alibi_slopes=..., sink=..., attn_bias=..., cu_seqlens_q=..., ...) and softmax_scale > 0 (without score
    features the running max is taken before scaling). attn_bias: 4-D (B or 1, Hq or 1, Sq, Sk), added to the
    scores after softcap and ALiBi, before the masks (kernels/common._scores' order). dropout_p > 0: rng is the
    int64 (1,) Philox seed; the probabilities are dropped as the portable kernels drop them (the same draws), so the
    portable backward regenerates the mask."""
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5
    poison = _launch.poison_outputs()  # NaN-poisoned under FLASHTILE_POISON_OUTPUTS=1, as the other launchers
    shape = q.shape
    out = _launch._empty(shape, q, poison=poison)
    if cu_seqlens_q is not None:
        lse = _launch._empty((shape[1], shape[0]), q, torch.float32, poison)
    else:
        lse = _launch._empty((shape[0], shape[2], shape[1]), q, torch.float32, poison)
    config = takes_config(variant, q.shape[-1], attn_bias, alibi_slopes, dropout_p, softcap)
    if not dropout_p and takes_persistent(config, q, k, causal, window_size, softcap, alibi_slopes, sink,
                                          cu_seqlens_q, attn_bias):
        # launch.py says causal as the window (-1, 0): the persistent kernel knows only plain and causal.
        is_causal = mask_mode(causal, window_size)[0]
        grid, args, constexprs, options = persistent_launch_args(q, k, v, out, lse, float(softmax_scale), is_causal,
                                                                 config)
        fast_launch.launch(_attn_fwd_hopper_persistent, grid, args, {**constexprs, **options})
        return out, lse
    if config.persistent:  # a persistent variant's call the persistent kernel cannot take (D256 ragged): the one-tile
        config = VARIANTS["default"][q.shape[-1]]  # kernel with its own measured config, not the variant's order
    grid, args, constexprs, options = gluon_launch_args(q, k, v, out, lse, float(softmax_scale), causal, config,
                                                        window_size, float(softcap), alibi_slopes, sink,
                                                        cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                                        attn_bias, dropout_p=dropout_p, rng=rng)
    fast_launch.launch(_attn_fwd_hopper, grid, args, {**constexprs, **options})
    return out, lse
