"""The Hopper Gluon forward's schedules as data: GluonConfig, the VARIANTS table with the measurements that chose
its entries, the variant families built from a default (grid_order_variants, also gluon_bwd_launch's;
persistent_order_variants), and takes_config, the config a call runs (alibi_by_mma: whether it takes ALiBi by
the wgmma).

configs.gluon_fwd_variant names the variant a call takes; gluon_launch.py launches takes_config's config; the check
scripts (tests/gluon_compile_check.py, benchmarks/gluon_check.py) compile or time the others. No torch or Gluon
import: plain data that loads on any triton.
"""
from dataclasses import dataclass, replace

WG_ROWS = 64  # kernels/gluon_fwd_common.WG_M, without importing Gluon


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
    batch_fast_bias: bool = False  # one-tile kernel, a bias shared by a batch of B > 1: the grid walks the batch
    # fastest (kernels/gluon_grid._batch_fast), so each bias tile is read from DRAM once, not B times

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
    # All: a bias the batch shares read in the batch-fast grid order (batch_fast_bias, session 46, below).
    "default": {64: GluonConfig(128, 3, alibi_mma=True, fixed_max=True, batch_fast_bias=True, **_TREE_CVT),
                128: GluonConfig(128, 2, lpt_heads=8, alibi_mma=True, fixed_max=True, batch_fast_bias=True,
                                 **_TREE_CVT),
                256: GluonConfig(64, 2, lpt_heads=8, lazy_rescale=True, fixed_max=True, batch_fast_bias=True)},
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
# A bias the batch shares, (1, H, S, S): the grid in batch-fast order reads each of its tiles from DRAM once, not once
# per batch row (GluonConfig.batch_fast_bias). Session 46, call 2 (h200-2026-12-04-s46, bias_order.py: bf16, hidden
# 2048, 16K tokens, three interleaved rounds), ms by head ("-bias-by-head", the order before) -> batch-fast, plain /
# causal: D128 B2 8K 2.485 -> 2.330 / 1.335 -> 1.228, B4 4K 1.295 -> 1.150 / 0.709 -> 0.640, B8 2K 0.677 -> 0.600 /
# 0.393 -> 0.349; D64 B2 8K 3.874 -> 3.608 / 2.087 -> 1.846; D256 B2 8K 2.023 -> 1.931 / 1.073 -> 0.999 (5-12 %
# faster, the same bits).
VARIANTS["default-bias-by-head"] = {d: replace(c, batch_fast_bias=False) for d, c in VARIANTS["default"].items()}


def alibi_by_mma(config, alibi_slopes, softcap=0.0, attn_bias=None):
    """True when a launch with config adds ALiBi's columns by the wgmma (ALIBI_MMA): its alibi_mma, ALiBi without
    softcap (tanh comes between) or a bias (no shared memory left for the operands at D128), 128-key blocks."""
    return (config.alibi_mma and alibi_slopes is not None and not softcap and attn_bias is None
            and config.block_n == 128)


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
