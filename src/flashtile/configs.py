"""Tile configurations as data, chosen by (arch, head dim, local (causal or window), dtype, dot precision).

Each entry names the measurement that justified it (docs/perf-log.md). Under the Triton
interpreter a single small configuration is used: the interpreter runs programs one by one
on the CPU, and only correctness matters there.
"""
import functools
import os
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class TileConfig:
    """One kernel's tiles (BLOCK_M queries x BLOCK_N keys), warps and software-pipelining depth."""
    BLOCK_M: int
    BLOCK_N: int
    num_warps: int
    num_stages: int


@dataclass(frozen=True)
class BwdConfig:
    """The backward's two main kernels are tuned apart: dK/dV (keys resident) and dQ (queries resident).

    dkdv_variant: how the dK/dV kernel reads q and dO tiles. "default": pointer tensors (cp.async);
    "desc": tensor descriptors (TMA), where the launcher can build them (bwd_launch._dkdv_descriptors), else default.
    dkdv_split: "" one dK/dV kernel; "dv-dk": a dV launch (tiles dkdv) then a dK launch (tiles dk, or dkdv),
    each program holding one [BLOCK_N, D] fp32 accumulator instead of two (kernels/bwd.py PART): 5 matmuls per
    (key tile, query tile) instead of 4, for room to take 128-key tiles at D256.
    """
    dkdv: TileConfig
    dq: TileConfig
    dkdv_variant: str = "default"
    dkdv_split: str = ""
    dk: TileConfig = None


def _bwd(m1, n1, m2, n2, warps, stages):
    return BwdConfig(TileConfig(m1, n1, warps, stages), TileConfig(m2, n2, warps, stages))


INTERPRETER_FWD = TileConfig(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=1)
INTERPRETER_BWD = _bwd(32, 32, 32, 32, 4, 1)

# Hopper (sm90) configurations keyed by padded head dim. Measured on the H200 with
# benchmarks/tune.py; see docs/perf-log.md for the numbers behind each choice.
# Sweep of 2026-11-29 (bf16, seqlen 4096, 16K tokens): perf-log.md, "v1 tile sweep".
_SM90_FWD = {
    16: TileConfig(128, 64, 4, 3),
    32: TileConfig(128, 64, 4, 3),
    # 8 warps since session 5 (tune-fwd-h200-2026-11-29-s5): 4K 388/337 -> 409/367, 16K 379/374 -> 418/400
    # (non-causal/causal); in the v1 sweep 8 warps had measured 349 against 383.
    64: TileConfig(128, 64, 8, 3),
    128: TileConfig(128, 64, 8, 3),  # 466 (128x128: 465; 4 warps: 208)
    256: TileConfig(128, 64, 8, 2),  # 454 (3 stages does not fit in shared memory)
}
# Rows that see at most SHORT_KEYS keys (short sequences, narrow windows): each program runs a few key tiles,
# so its fixed cost (Q load, pipeline fill, store) dominates; 64-row tiles with 4 warps fit two programs per
# SM, which overlap those phases. Session 4, kernel time in us, default -> 64x64/4 warps/3 stages (bf16, 16K
# tokens; non-causal / causal): D128 512 tokens 230/181 -> 204/151, 1K 347/242 -> 336/219, window 256 at 8K
# 219 -> 192; D64 512 222/188 -> 207/158, 1K 384/275 -> 358/235. Not taken: D128 at 2K (606/379 -> 600/359)
# and a 1024 window at 8K, where the 128-row tiles stay faster (395 vs 422); D256, where they are (512 tokens:
# 218/162, the best alternative 230/163).
SHORT_KEYS = 1024
_SM90_FWD_SHORT = {**_SM90_FWD, 64: TileConfig(64, 64, 4, 3), 128: TileConfig(64, 64, 4, 3)}
_SM90_BWD = {
    16: _bwd(64, 64, 64, 64, 4, 3),
    32: _bwd(64, 64, 64, 64, 4, 3),
    # Session 4 sweep (seqlen 4096, TFLOP/s non-causal / causal): dK/dV 32x64 with 4 stages 329/297 -> 339/317.
    64: BwdConfig(TileConfig(32, 64, 4, 4), TileConfig(64, 64, 4, 3)),
    # dQ 64x64/4 warps/2 stages: 355 -> 372 (non-causal).
    128: BwdConfig(TileConfig(64, 128, 8, 2), TileConfig(64, 64, 4, 2)),
    # Session 7 (d256-bwd-h200-2026-11-29-s7): dV and dK in two launches with 128-key tiles ("dv-dk", below)
    # against session 5's one-kernel "desc" tiles: S 4096 246 -> 275 TFLOP/s, 16K 239 -> 276 (cuDNN 360-378).
    256: BwdConfig(TileConfig(64, 128, 8, 2), TileConfig(128, 32, 8, 2), "desc", "dv-dk", TileConfig(32, 128, 8, 2)),
}
# Causal or windowed (local) backward, where the sweep picked differently.
_SM90_BWD_LOCAL = {
    **_SM90_BWD,
    128: BwdConfig(TileConfig(64, 128, 8, 3), TileConfig(64, 64, 4, 2)),  # 282 -> 314
    # dv-dk with one stage (ptxas serializes the wgmmas of every 2-stage causal compile, C7515): causal S 4096
    # 199 -> 204 TFLOP/s, 16K 218 -> 241 (session 7; cuDNN 375-383).
    256: BwdConfig(TileConfig(64, 128, 8, 1), TileConfig(128, 32, 8, 2), "desc", "dv-dk", TileConfig(32, 128, 8, 1)),
}

# The Hopper Gluon forward (kernels/gluon_fwd.py, FA3's warp-specialized schedule) serves the plain forward from
# these key counts on, where it measured faster than the portable kernel: (head dim, causal) -> least seqlen_k.
# Session 5 (benchmarks/results/gluon-h200-2026-11-29-s5), time Gluon / portable at 512, 1K, 2K, 4K, 16K:
# D128 0.75/0.82/0.82/0.79/0.78, causal 1.10/0.95/0.84/0.80/0.78; D64 1.25/1.06/1.09/0.99/0.98, causal
# 1.56/1.28/1.13/1.05/0.94. Session 7 (gluon-persistent-h200-2026-11-29-s7, 16K tokens), with the persistent
# grid below 4K (GLUON_FWD_PERSISTENT), Gluon / portable at 512, 1K, 2K, 4K: D64 0.94/0.90/0.99/0.94, causal
# (one-tile kernel) 1.58/1.22/1.08/0.97; D128 causal 0.88/0.88/0.82/0.75; D256 0.69/0.70/0.69/0.68, causal
# 0.81/0.72/0.69/0.69. Below 512 keys unmeasured (the portable kernel, except D128 non-causal).
GLUON_FWD_MIN_KEYS = {(128, False): 0, (128, True): 512, (64, False): 512, (64, True): 4096,
                      (256, False): 512, (256, True): 512}
# Plain dense calls (no window, softcap, ALiBi, sink, bias or varlen), which the persistent grid serves where
# GLUON_FWD_PERSISTENT says: these thresholds instead. D64 causal from 1K keys since session 14, with the persistent
# grid's causal order (the portable kernel there: 0.70-0.85x cuDNN; the one-tile kernel that features and varlen run
# stays slower than the portable one below 4K). At 512 keys the README bench measured it at 207 TFLOP/s against the
# portable kernel's 172-218 in earlier runs: not shown faster, so the portable kernel kept 512 until session 27, whose
# block-relative masks (kernels/gluon_fwd_common._mask_scores) made persistent-tma-lpt8 231 against the portable 216
# (cuDNN 259; fwd-block-mask-h200-2026-12-01-s27 call 1, both in one process): from 512 keys now.
GLUON_FWD_MIN_KEYS_PLAIN = {**GLUON_FWD_MIN_KEYS, (64, True): 512}
# (head dim, causal) -> ranges (variant, least seqlen_k, most seqlen_k): the gluon_variants.VARIANTS entry that serves
# plain / causal dense calls from least to most keys; GLUON_FWD_LONG or "default" outside and everywhere else. The
# persistent grid (one CTA per SM walking tiles, kernels/gluon_fwd_persistent.py) removes the per-tile launch / fill /
# drain cost that dominates short rows; "-tma" stores O through shared memory. Session 7, time persistent / default at
# 512, 1K, 2K, 4K: D128 persistent-tma 0.77/0.89/0.96/0.96, causal 0.85/1.00/1.07/1.09; D64 0.74/0.85/0.92/0.95; D256
# persistent 0.92/0.97/0.99/1.02, causal 1.09-1.17.
# Causal since session 14 (lpt-h200-2026-11-30-s14): the causal tiles by groups of heads, heavy first, dealt to the
# CTAs by the host's list schedule ("-sched4", persistent_schedule.py) or the grid's stride ("-lpt8"), where the old
# rank-by-rank order over all heads lost to L2. Speed / cuDNN at 512 / 1K / 2K / 4K keys, two runs, the kernel served
# before -> now: D128 0.79-0.82 (persistent-tma) / 0.85-0.87 (persistent-tma) / 0.86-0.89 (default) / 0.96-1.00
# (default) -> 0.94-0.96 / 1.00-1.01 / 1.03-1.05 / 1.07; D64 (portable kernel but at 4K; one run) 0.70 / 0.85 / 0.84 /
# 0.89 -> lpt8 0.79-0.80 / 0.88-0.89 / 0.89-0.92 / 0.94-0.96 (sched4, one run: 0.78 / 0.84 / 0.93 / 0.96). D256 stays
# on the one-tile kernel: default 0.78 / 0.88 / 0.94 / 1.01 -> persistent-sched4 0.83 / 0.91 / 0.94 / 1.07 in the
# check script, but the README bench (h200-2026-11-30-s14) then measured 252 / 401 / 490 / 595 TFLOP/s against the
# one-tile kernel's 265-267 / 382-401 / 479-501 / 580 in earlier runs: not shown faster below 4K.
# Session 15 (lpt-h200-2026-11-30-s15), the listed order at long causal rows, speed / cuDNN against the one-tile
# default in the same run: D128 4K / 8K / 16K 1.11 / 1.08 / 1.09 against 1.03 / 1.04 / 1.06 (session 14: 8K / 16K
# 1.11 / 1.10 against 1.07 / 1.07); D256 persistent-sched4 4K / 8K / 16K 1.12 / 1.08 / 1.17 against 1.09 / 1.05 /
# 1.16 (session 14: 1.07 against 1.01 at 4K, 1.11 / 1.11 against 1.07 / 1.09 at 8K / 16K). Both to 16K keys, D256
# from 4K. Longer rows are unmeasured (and a tile list grows with them: persistent_schedule.py).
# Session 20 (persistent-epilogue-h200-2026-12-01-s20): D256's persistent kernel stores O through one shared tile
# (GLUON_FWD_SMEM_EPILOGUE). D256 plain 512 / 1K / 2K TFLOP/s before -> after 454-457 / 561-563 / 633-668 -> 542-543
# / 619-642 / 665-679 (cuDNN 1.06-1.09x); causal 8K 638-644 -> 687-688. In one process (gluon_check.py), D256 causal
# 512 / 1K / 2K / 4K / 8K, persistent-sched4 against the one-tile default (both with the new epilogues) 340 / 452 /
# 535 / 626 / 654 against 315 / 437 / 546 / 610 / 639 (cuDNN 332 / 440 / 520 / 551 / 542): causal D256 takes
# persistent-sched4 from 0 keys.
# Session 26 (h200-2026-12-01-s26 call 3, TFLOP/s, two passes but at 512 / 8K): D64 plain rows on the persistent
# grid with three consumers (192-row tiles), persistent-tma -> persistent-3wg-tma (cuDNN): 512 340 -> 313 (385), 1K
# 387 -> 370-374 (415-421), 2K 415-418 -> 436-444 (420-439), 4K 432 -> 450-461 (447-455), 8K 437 -> 472 (459; d64-3wg,
# the one-tile kernel served there, 470). At 1K a 192-row grid pads 1024 rows to 1152 (12 % more tiles' work).
# Causal lost at every length (1K / 2K / 4K, the better of persistent-3wg-tma and its lpt8 order: 220-221 / 308-310 /
# 341-351 against persistent-tma-lpt8's 295-296 / 352-354 / 397-398). From 1025 keys: call 6, one pass, 1280 / 1536
# / 1792 / 16K 405 / 410 / 422 / 445 -> 422 / 446 / 426 / 486 (cuDNN 436 / 440 / 447 / 452; d64-3wg at 16K 490, so
# rows past 8K keep it).
# Session 27 (fwd-block-mask-h200-2026-12-01-s27 call 2, TFLOP/s, two passes in swapped order, cuDNN in brackets):
# Q double-buffered ("-q2", GluonConfig.q_buffers), single -> double: D64 persistent-tma 512 / 1K / 2K / 4K 343-345 ->
# 369-372 (378-382) / 393-394 -> 399-405 (379-408) / 410-416 -> 421 / 425-432 -> 422-423; persistent-3wg-tma 319-324
# -> 350-356 / 368-376 -> 381 / 436 -> 440-442 (401-413) / 450-451 -> 453 (434-446); causal persistent-tma-lpt8 230-233
# -> 245-246 (257-259) / 318-319 -> 319-323 (332-334) / 356-364 -> 366 (381-386) / 401-405 -> 407-409 (411-414); D128
# persistent-tma 488-490 -> 511-519 (492-501) / 546-556 -> 581-584 (555-557) / 590-591 -> 608-614 (588-591) / 613-615
# -> 628-631 (598-599); causal persistent-tma-sched4 294-331 -> 267-340 (322-328) / 437-438 -> 439-443 (411) / 514-519
# -> 517-533 (475) / 574-577 -> 585-587 (512-521). The D64 ranges (plain and causal) and D128 plain take their "-q2"
# twins. D128 causal keeps one Q tile: +0-4 % at 1K-4K is within its runs' spread, and at 512 keys both move between
# runs (README sweep, call 3, q2: 242 = 0.73x cuDNN; call 5, three processes, one Q tile / two: 336 / 343, 324 / 279,
# 228 / 238).
# Session 28 (h200-2026-12-01-s28 call 1, TFLOP/s, two passes in swapped order, cuDNN in brackets): each tile's
# epilogue deferred behind the next tile's first Q K^T ("-de", GluonConfig.defer_epilogue), q2 -> q2-de: D64
# persistent-tma-q2 512 / 1K / 2K / 4K 373-375 -> 382-383 (385-386) / 406-408 -> 420-422 (391-396) / 422-426 -> 440
# (411-424) / 434 -> 449-454 (438-442); persistent-3wg-tma-q2 356-365 -> 355-356 / 391-393 -> 386-387 / 448 -> 440-441
# / 460-465 -> 451-455 (slower: it keeps q2); causal persistent-tma-q2-lpt8 246-247 -> 245-246 (261-263) / 326-329 ->
# 334-335 (335) / 377-380 -> 375-379 (388-390) / 416-422 -> 416-428 (417-418); D128 persistent-tma-q2 within the
# passes' spread (keeps q2); causal persistent-tma-sched4 339-342 -> 342-359 (337-338) / 443 -> 450-455 (419-429) /
# 525-532 -> 532-545 (481-487) / 574-582 -> 593-596 (515-530), q2-sched4 350-353 / 454-458 / 523-526 / 588-589. D128
# causal takes q2-de-sched4 where it measured faster (to 4K keys; at 8K / 16K within the spread, below). Call 3 (longer
# rows, two passes): D256 plain 4K / 8K / 16K default -> persistent 650-664 -> 680-681 (646-651) / 664-665 -> 691-701
# (654-661) / 674-675 -> 681-693 (659-661): D256 plain takes persistent to 16K keys; D128 plain 8K / 16K (default,
# persistent-tma-q2, -de: 628-642 each), D64 8K / 16K (d64-3wg, persistent-3wg-tma-q2: 473-484 each) and D128 causal 8K
# / 16K (sched4, q2-sched4, q2-de-sched4: 607-628 each) within the passes' spread: unchanged.
# Session 29 (h200-2026-12-02-s29 calls 3-4, TFLOP/s, two passes in swapped order, cuDNN in brackets): O rescaled only
# when a row's max moved by more than 2^8 ("-lr", GluonConfig.lazy_rescale), base -> -lr: D256 persistent 1K / 2K / 4K
# / 8K / 16K 627-650 -> 632-638 (600-603) / 666 -> 683 (675) / 690 -> 694-702 (644-651) / 689 -> 711 (665) / 697-715 ->
# 715-719 (666-675); causal persistent-sched4 468-472 -> 466-482 (452-454) / 552 -> 574 (522) / 635-645 -> 656-657
# (564-571) / 680 -> 689 (587) / 684-686 -> 710-718 (602-607); D64 persistent-3wg-tma-q2 2K / 4K / 8K 450 -> 458
# (452) / 462 -> 472 (464) / 483-484 -> 490-497 (462-467), 16K (one pass) 489 -> 508 (d64-3wg, served there before:
# 491; cuDNN 445). Those take their -lr twins, D64 plain's to 16K keys. The two-consumer kernels lost or stayed within
# the spread with it (call 3: D64 persistent-tma-q2-de 512 / 1K -1.5 / -2.5 %, causal -lpt8 1K-4K -2 to -4 %; D128
# plain 1K / 4K / 16K +0.5 / -1.5 / -1.6 %, causal -2 to +2 %) and keep the rescale in every step. One pass (call 4)
# at D256 2K / 8K and D64 4K / 16K. D256 at 1K (-2.7 / +1.7 %) and 512 keys (not measured) and D64 at 1025-2047 keys
# (not measured) take the twins so that one kernel serves each range.
# Session 37 (h200-2026-12-02-s37 call 4, TFLOP/s, two passes in swapped order, cuDNN in brackets): the D64 causal
# tile orders of persistent-tma-q2-de, not measured with Q double-buffering before (session 14 chose lpt8 on the
# single-Q kernel), 1K / 2K / 4K: lpt8 335 / 327-376 / 401-414 (cuDNN 320-331 / 380-384 / 414-415); lpt4 337-340 /
# 384-390 / 363-410; lpt16 321-334 / 389-391 / 411-417; sched8 336-339 / 392-394 / 416-424; sched4 340 / 387-390 /
# 423-425; lpt8-lr 323-324 / 329-370 / 384-406. D64 causal takes sched4 (above cuDNN at 1K-4K in both passes).
GLUON_FWD_PERSISTENT = {(128, False): (("persistent-tma-q2", 0, 4096), ),
                        (128, True): (("persistent-tma-q2-de-sched4", 0, 4096), ("persistent-tma-sched4", 4097, 16384)),
                        (64, False): (("persistent-tma-q2-de", 0, 1024), ("persistent-3wg-tma-q2-lr", 1025, 16384)),
                        (64, True): (("persistent-tma-q2-de-sched4", 0, 4096), ),
                        (256, False): (("persistent-lr", 0, 16384), ),
                        (256, True): (("persistent-sched4-lr", 0, 16384), )}
# (head dim, causal) -> (variant, least seqlen_k): the entry that serves longer rows instead of "default". D64: three
# consumer warpgroups (192-row tiles, FA3's hdim-64 schedule). Session 10 (d64-3wg-h200-2026-11-30-s10), speed /
# cuDNN in one run, default / d64-3wg / persistent-tma: 2K 0.85 / 0.93 / 0.94, 3K 0.86 / 0.95 / 0.92, 4K 0.90 / 0.99
# / 0.96, 8K 0.88 / 0.96 / 0.90, 16K 0.94 / 1.07 (other run); causal 2K 0.82 / 0.70 / 0.85, 3K 0.83 / 0.81 / 0.82,
# 4K 0.88 / 0.85 / 0.91, 8K 0.93 / 1.00 / 0.86, 16K 0.98 / 1.05.
GLUON_FWD_LONG = {(64, False): ("d64-3wg", 2049), (64, True): ("d64-3wg", 8192)}
# Head dims whose one-tile Gluon forward (two consumers; dense launches, see gluon_launch_args) stores O through each
# warpgroup's Q tile in 16-byte row pieces instead of from the accumulators in 4-byte pieces (kernels/gluon_fwd.py's
# O_VIA_SMEM). Session 19's ncu profile of the D256 causal forward at 512 keys (ncu-h200-2026-11-30-s19): load /
# store queue stalls (lg_throttle) 1.5 per issued instruction, cuDNN's 0. A/B (fwd-epilogue-h200-2026-11-30-s19,
# TFLOP/s, two alternated runs): D256 causal 512 / 1K / 2K 265-267 / 390-395 / 506-513 -> 316 / 440-441 / 556-558,
# D256 8K / 16K 671-694 / 678 -> 698 / 702; D128 8K / 16K within the runs' spread (632-638 / 630-639 -> 638-649 /
# 635-645). The persistent kernel takes the set too where it does not store O by TMA (D256 always: no room for
# two O buffers): one shared O tile its two consumers take in turns (kernels/gluon_fwd_persistent.py, session 20;
# numbers at GLUON_FWD_PERSISTENT). D64 (its two-consumer one-tile launches: causal rows of 4097-8191 keys) is
# unmeasured: it keeps the register stores (both epilogues give the same bits there:
# tests/test_gluon_reference.py::test_o_via_smem_matches_register_stores). Session 24 gave the set's one-tile
# launches with score features (windows and sinks too), a bias and dropout under the plain causal mask the same epilogue
# (features-h200-2026-12-01-s24 call 6, D128 8K, ms with the feature, two alternated runs, register -> shared-memory
# stores): ALiBi 1.836-1.843 -> 1.774-1.796, causal 0.993-0.998 -> 0.976-1.001; softcap 2.190-2.192 -> 2.161-2.168,
# causal 1.145-1.151 -> 1.125-1.126; bias 2.357-2.408 -> 2.406-2.409 (level), causal 1.276-1.281 -> 1.255-1.258;
# dropout causal 1.436-1.437 -> 1.407-1.409; call 7: a 1024-key window 0.326-0.327 -> 0.308-0.309, causal window
# 0.331-0.332 -> 0.311-0.314, sink 1.716-1.771 -> 1.732-1.733, causal 0.933-0.938 -> 0.914-0.918. Dropout without
# the causal mask (a window included) measured slower (2.902-2.907 -> 2.942-2.943) and keeps the register stores;
# D256's feature launches follow the rule untimed.
GLUON_FWD_SMEM_EPILOGUE = frozenset({128, 256})
# Sliding windows: the keys a row sees. At D128 8K a 256-key window ran 7 % slower in Gluon than in the portable
# 64x64 tiles, 1024 and 4096 ran 16-19 % faster (gluon-ext-h200-2026-11-29-s5).
GLUON_FWD_MIN_WINDOW = 1024


# The Hopper Gluon backward (kernels/gluon_bwd.py) serves the dense backward from these key counts on: (head dim,
# causal) -> least seqlen_k; FLASHTILE_GLUON_BWD=1 takes it wherever it is supported. Windows, softcap and ALiBi
# take the same thresholds (bwd_launch._gluon_backward: causal = a window whose right side is 0). Session 8
# (gluon-bwd-dq-reduce-h200-2026-11-30-s8, 16K tokens), time portable / Gluon with dQ by TMA reduce-add at 1K / 2K /
# 4K / 16K keys: D64 1.06 / 1.17 / 1.19 / 1.22, causal 1.01 / 1.12 / 1.13 / 1.24; D128 1.35 / 1.38 / 1.36 / 1.47,
# causal 1.23 / 1.34 / 1.33 / 1.40; D256 1.25 / 1.30 / 1.33 / 1.41, causal 1.52 / 1.55 / 1.58 / 1.52 (with dQ by
# atomics, session 7, D64 lost to the portable backward and D256 non-causal only tied). Session 12
# (gluon-bwd-512-h200-2026-11-30-s12, 16K tokens), at 512 keys: D128 1.26, causal 1.15; D256 1.18, causal 1.45; D64
# (d64-bm128-split / default) 1.03 / 0.96, causal 0.95 / 0.91: D128 and D256 from 512 keys, D64 from 1K. Session 25
# (bwd-dq-tiled-h200-2026-12-01-s25 call 6, two passes), with dQ's buffer tiled, at 512 keys: D64 d64-bm128-split 284
# TFLOP/s, default 273-275, portable 249, cuDNN 279; causal d64-bm128 174, default 173-174, portable 169, cuDNN 170:
# D64 from 512 keys too. Below 512 keys unmeasured.
# Score features: checked on the GPU at every head dim (gluon_bwd_check.py --check-dims 64,128,256); session 7
# (gluon-bwd-features-h200-2026-11-29-s7, D128 8K), time Gluon / portable: softcap 0.76, causal softcap 0.79,
# ALiBi 0.90, causal ALiBi 0.85; windows (left, 0) of 4096 and 1024 keys 0.86 / 0.91, of 256 keys 1.02: windows
# narrower than GLUON_BWD_MIN_WINDOW keep the portable one.
GLUON_BWD_MIN_KEYS = {(64, False): 512, (64, True): 512, (128, False): 512, (128, True): 512,
                      (256, False): 512, (256, True): 512}
GLUON_BWD_MIN_WINDOW = 1024
# (head dim, causal) -> the gluon_bwd_launch.VARIANTS entry for plain and causal dense calls (no window, softcap,
# ALiBi, bias or varlen: these variants refuse them, their tile loops would spill); "default" elsewhere. D64: 128-row
# query tiles with the row vectors folded into the accumulators. Session 12 (gluon-bwd-d64-bm128-h200-2026-11-30-s12),
# speed / cuDNN at 1K / 4K / 16K, default / d64-bm128 / d64-bm128-split: 0.87 / 0.89 / 0.92, 0.91 / 0.98 / 0.99,
# 0.92 / 0.98 / 1.01; causal 0.93 / 0.98 / 0.96, 0.93 / 1.02 / 1.00, 0.95 / 1.05 / 1.05.
GLUON_BWD_PLAIN = {(64, False): "d64-bm128-split", (64, True): "d64-bm128"}
# Up to this many query rows per dK/dV program (seqlen_q, or max_seqlen_q, times the query heads per KV head: the
# rows its tile loop walks), the D64 / D128 backward's dK / dV leave through shared memory as 16-byte row pieces
# (kernel STORE_VIA_SMEM) instead of the accumulators' 4-byte pieces: 3.5 -> 1.1 us per program at D128. Measured
# with Sq = Sk and one query head per KV head: backward +3-12 % at 512-1K rows, +1-2 % at 2K; at 4K mixed (causal
# D128 -1 to -4 %) and at 16K 1.5-2.5 % slower (three alternated runs). The cause is not found: the epilogue also moves
# the tile loops' code a little (D128: +0-5 SASS per full loop, +21 in one masked loop), a candidate. Longer programs
# keep the previous kernel (bwd-epilogue-h200-2026-11-30-s18).
GLUON_BWD_SMEM_EPILOGUE_MAX_ROWS = 2048
# The same for the D256 backward (kernel SPLIT_D: each warpgroup's half of dK / dV's columns through its half of V's
# buffer), without a limit: session 20's A/B (bwd-d256-epilogue-h200-2026-12-01-s20, two alternated runs, TFLOP/s)
# 512 / 1K / 2K / 4K / 8K / 16K 234 / 290-292 / 331 / 358 / 364-365 / 374-378 -> 259 / 307-309 / 340 / 356-362 /
# 364-368 / 373-374, causal 166 / 233-234 / 290 / 326-333 / 346-352 / 359-361 -> 183-184 / 253 / 309 / 334-342 /
# 355-356 / 366-368: faster or within the runs' spread at every length. (The README sweep after it,
# h200-2026-12-01-s20b, measured the plain 2K row at 301: not reproduced yet, see docs/perf-log.md.)
GLUON_BWD_SMEM_EPILOGUE_MAX_ROWS_D256 = 1 << 30
# Varlen (packed sequences) follows the same table by max_seqlen_k: session 9 (varlen-bwd-h200-2026-11-30-s9, 2K / 8K
# keys, D64 / D128, causal both) timed it 1.19-1.38x faster than the portable varlen backward, within 6 % of the
# dense Gluon backward on the same tokens.


def gluon_bwd_wanted(head_dim, causal, seqlen_k, window_span=None):
    """Whether the backward should take the Gluon kernel at this shape (where gluon_bwd_supported allows);
    window_span as for gluon_fwd_wanted; for packed sequences seqlen_k is their max_seqlen_k."""
    least = GLUON_BWD_MIN_KEYS.get((head_dim, causal))
    if window_span is not None and window_span < GLUON_BWD_MIN_WINDOW:
        return False
    return least is not None and seqlen_k >= least


def gluon_bwd_variant(head_dim, causal, plain):
    """The gluon_bwd_launch.VARIANTS entry for a backward the Gluon kernel serves: GLUON_BWD_PLAIN's for plain /
    causal dense calls (plain: no window, softcap, ALiBi, bias or varlen), "default" for the rest."""
    return GLUON_BWD_PLAIN.get((head_dim, causal), "default") if plain else "default"


def gluon_fwd_variant(head_dim, causal, seqlen_k, plain=False):
    """The gluon_variants.VARIANTS entry for a forward the Gluon kernel serves: GLUON_FWD_PERSISTENT for short rows of
    plain dense calls (plain as for gluon_fwd_wanted: the calls the persistent kernel takes), GLUON_FWD_LONG for long
    ones, else "default". GLUON_FWD_LONG's features (windows, softcap, sinks, ALiBi without softcap) and varlen calls
    run the one-tile kernel with its tiles (gluon_variants.takes_config gives a bias, dropout or ALiBi with softcap the
    default's tiles where a variant cannot serve them)."""
    for variant, least, most in GLUON_FWD_PERSISTENT.get((head_dim, causal), ()) if plain else ():
        if least <= seqlen_k <= most:
            return variant
    variant, least = GLUON_FWD_LONG.get((head_dim, causal), ("default", 0))
    return variant if seqlen_k >= least else "default"


def gluon_fwd_wanted(head_dim, causal, seqlen_k, window_span=None, plain=False):
    """Whether the forward should take the Gluon kernel at this shape (where gluon_supported allows);
    window_span: the keys one row's window covers (left + right + 1), None without a two-sided window; plain: a
    dense call without window, softcap, ALiBi, sink or bias (GLUON_FWD_MIN_KEYS_PLAIN).
    Varlen calls pass max_seqlen_k as seqlen_k and get the dense thresholds unchanged: the varlen kernel is the
    dense one plus four cu_seqlens loads per program and ragged (4-D) TMA boxes. Session 6 (gluon_check.py
    --bench-varlen): 0.97-1.01x the dense Gluon forward on the same tokens (8 x 2K, 2 x 8K), 1.16-1.28x the
    portable varlen kernel at D128; a mixed D64 batch (one long sequence among short ones) ran 0.89-0.91x the
    portable varlen kernel, since the short sequences sit below the thresholds the maximum is compared with."""
    least = (GLUON_FWD_MIN_KEYS_PLAIN if plain else GLUON_FWD_MIN_KEYS).get((head_dim, causal))
    if window_span is not None and window_span < GLUON_FWD_MIN_WINDOW:
        return False
    return least is not None and seqlen_k >= least


# The D256 backwards to compare (FLASHTILE_D256_BWD=<name> swaps one in on sm90 for 16-bit inputs; read once):
# "dv-dk" is the default above: dV and dK in two launches (BwdConfig.dkdv_split), each program holding one
# [128, 256] fp32 accumulator, so 128-key tiles fit: 5 matmuls per tile pair instead of 4 (the backward's 7 become
# 8), q/dO read as often as by 64-key tiles. Tiles from benchmarks/spills.py (triton 3.6, sm90; perf-log "D256
# backward: dV and dK apart"): dV 64x128/8w, dK 32x128/8w (0-8 B spill, 197 KB smem); the 16x128 dK measured
# slower (222-226 TFLOP/s non-causal). "desc": session 5's one-kernel 64x64/8w/2-stage tiles with q/dO through
# TMA descriptors (the default until session 7); "pointers": the pointer tiles that "desc" replaced (non-causal
# 64x64/8w/1 stage, causal 32x32/4w/2 stages).
_D256_DQ = TileConfig(128, 32, 8, 2)
_D256_DESC = BwdConfig(TileConfig(64, 64, 8, 2), _D256_DQ, "desc")
D256_BWD_VARIANTS = {
    "dv-dk": (_SM90_BWD[256], _SM90_BWD_LOCAL[256]),  # (non-causal, causal / window)
    "desc": (_D256_DESC, _D256_DESC),
    "pointers": (BwdConfig(TileConfig(64, 64, 8, 1), _D256_DQ),
                 BwdConfig(TileConfig(32, 32, 4, 2), _D256_DQ)),
}
D256_BWD = os.environ.get("FLASHTILE_D256_BWD", "")  # read once, at import
if D256_BWD and D256_BWD not in D256_BWD_VARIANTS:
    raise ValueError(f"FLASHTILE_D256_BWD={D256_BWD!r}: expected one of {sorted(D256_BWD_VARIANTS)}")

# Every other GPU: conservative tiles that fit ~100 KB of shared memory (Ampere/Ada class).
_GENERIC_FWD = {
    16: TileConfig(128, 64, 4, 2),
    32: TileConfig(128, 64, 4, 2),
    64: TileConfig(128, 64, 4, 2),
    128: TileConfig(128, 64, 8, 2),
    256: TileConfig(64, 32, 4, 1),
}
# fp32 tiles hold twice the bytes: at D128 the half-precision tiles need 164 KB of shared memory on sm80 before
# an additive bias adds its own pipelined tile (197 KB > 163 KB: tests/compile_check.py's TF32 case); 64 x 32 leaves
# room. fp32 runs these tables with TF32 on; without it (ieee dots), _IEEE_FWD below.
_GENERIC_FP32_FWD = {**_GENERIC_FWD, 128: TileConfig(64, 32, 4, 2)}
_GENERIC_BWD = {
    16: _bwd(32, 64, 64, 32, 4, 2),
    32: _bwd(32, 64, 64, 32, 4, 2),
    64: _bwd(32, 64, 64, 32, 4, 2),
    128: _bwd(32, 64, 64, 32, 4, 1),
    256: _bwd(16, 32, 32, 16, 4, 1),
}


# fp32 inputs at full precision (DOT_PRECISION "ieee": PyTorch's default, TF32 off) on any GPU. tl.dot is then a
# loop of FMAs whose operands and products all live in registers, so the tensor-core tiles above spill: compiled for
# sm90 (triton 3.6, ptxas -v, session 21) the generic fp32 forward spilled 4.4 KB per thread at D32, 54 KB at D64,
# 31 KB at D128 and 67 KB at D256 (ptxas left those three 32 registers); the backward 0.1-1.5 KB (D128's dK/dV
# 7.8-9.5 KB, 94 KB causal; dQ 6.3-7.9 KB), the decode kernel 1.1 / 3.5 KB at D128 / D256. The forwards here
# spill nothing plain or causal (`benchmarks/spills.py --dtype fp32 --configured`; tests/test_compile.py); with
# every score feature and dropout they spill 0-2.4 KB.
# On the H200 (benchmarks/fp32_tiles.py, docs/perf-log.md session 21) the forward took 0.08-0.19x the old tiles'
# time at D64-D256 (D32: 1.25x plain, 0.84x causal). TF32 (allow_tf32) keeps the tables above: tensor-core dots,
# which fit them. Offline counts: benchmarks/results/fp32-tiles-h200-2026-12-01-s21/offline-spills.txt.
_IEEE_FWD = {
    16: TileConfig(128, 64, 4, 2),
    32: TileConfig(64, 64, 8, 2),
    64: TileConfig(64, 32, 8, 2),
    128: TileConfig(64, 16, 8, 2),
    256: TileConfig(32, 16, 8, 1),
}
# The backward's generic tiles spill 0.1-1.5 KB except at D128 (see above). Spill-free tiles timed slower than them
# at D64 (16x64 / 64x32 with 8 warps: 1.3x the backward's time) and D256 (16x16 / 32x16, 8 warps: 1.44-1.45x), much
# faster at D128 (16x32 / 32x32, 8 warps: 0.93x, causal 0.29x), and 0.95-0.96x at D32 (32x64 at 8 warps / 64x32,
# one run, within what runs move): only D128 takes its own.
_IEEE_BWD = {**_GENERIC_BWD, 128: BwdConfig(TileConfig(16, 32, 8, 2), TileConfig(32, 32, 8, 2))}


# fp32 with TF32 off on precision.TF32X3_ARCHS (DOT_PRECISION "tf32x3", precision.py): each product is three TF32
# tensor-core products (a_hi b_hi + a_hi b_lo + a_lo b_hi), whose split operands take registers and shared memory:
# on the generic fp32 tables the forward spilled 0.7-1.6 KB per thread at D32 / D64 and 2.8-3.0 KB at D256, the
# backward 3.1-4.2 KB (dK/dV) and 1.1-1.2 KB (dQ) at D128 and 33-47 KB at D256 (`benchmarks/spills.py --dtype fp32
# --precision tf32x3`, session 22). On the H200 (B2, 2K, H 1024 / D; benchmarks/fp32_tiles.py --candidates,
# fp32-tf32x3-h200-2026-12-01-s22) the generic tiles stayed fastest for the D32 / D256 forward and the D32 / D64
# backward despite their spills; these took their place elsewhere: the D64 / D128 forward 0.66 / 0.62x the generic
# tiles' time (causal 0.64 / 0.61x), the D128 backward 1.02x (causal 0.84x), the D256 backward 0.08x (causal 0.07x).
_TF32X3_FWD = {**_GENERIC_FP32_FWD, 64: TileConfig(128, 64, 8, 2), 128: TileConfig(32, 32, 4, 2)}
_TF32X3_BWD = {**_GENERIC_BWD, 128: BwdConfig(TileConfig(16, 16, 4, 2), TileConfig(16, 32, 4, 2)),
               256: BwdConfig(TileConfig(32, 16, 8, 1), TileConfig(16, 32, 8, 1))}


def _is_fp32(dtype):
    return dtype is not None and dtype.itemsize == 4


def _table_for(arch, dtype, sm90, generic):
    # fp32 tiles (TF32 dots) take twice the shared memory: they get the conservative table everywhere.
    return sm90 if arch is not None and arch >= (9, 0) and not _is_fp32(dtype) else generic


def fwd_config(arch, head_dim_padded, local, dtype, interpreter=False, keys_per_row=None, precision="tf32"):
    """The forward tile configuration. arch is (major, minor) of the CUDA device, or None; keys_per_row: the
    most keys one query row attends to (min(Sk, window span)), None if unknown; precision: the kernels'
    DOT_PRECISION ("ieee": FMA dots, _IEEE_FWD for fp32 (ROCm's fp16 / bf16 pass "ieee" too: tensor-core dots on the
    generic tiles); "tf32x3": _TF32X3_FWD)."""
    if interpreter:
        return INTERPRETER_FWD
    if precision == "ieee" and _is_fp32(dtype):
        return _IEEE_FWD[head_dim_padded]
    if precision == "tf32x3":
        return _TF32X3_FWD[head_dim_padded]
    generic = _GENERIC_FP32_FWD if _is_fp32(dtype) else _GENERIC_FWD
    short = keys_per_row is not None and keys_per_row <= SHORT_KEYS
    return _table_for(arch, dtype, _SM90_FWD_SHORT if short else _SM90_FWD, generic)[head_dim_padded]


def bwd_config(arch, head_dim_padded, local, dtype, interpreter=False, precision="tf32"):
    """The backward tile configuration (dK/dV and dQ kernels); precision as fwd_config's."""
    if interpreter:
        if D256_BWD and head_dim_padded == 256:  # the variant's kernels at the interpreter's tiles
            chosen = D256_BWD_VARIANTS[D256_BWD][0]
            return replace(INTERPRETER_BWD, dkdv_variant=chosen.dkdv_variant, dkdv_split=chosen.dkdv_split)
        return INTERPRETER_BWD
    if precision == "ieee" and _is_fp32(dtype):
        return _IEEE_BWD[head_dim_padded]
    if precision == "tf32x3":
        return _TF32X3_BWD[head_dim_padded]
    table = _table_for(arch, dtype, _SM90_BWD_LOCAL if local else _SM90_BWD, _GENERIC_BWD)
    if D256_BWD and head_dim_padded == 256 and table is not _GENERIC_BWD:
        return D256_BWD_VARIANTS[D256_BWD][1 if local else 0]
    return table[head_dim_padded]


# Split-KV decoding (kernels/decode.py). Not yet measured on the H200: first guesses from the byte count.
# A decode tile holds group_size * Sq packed query rows (BLOCK_M >= 16 for tl.dot) and streams K/V tiles;
# the kernel is memory-bound, so the tiles are sized for several loads in flight per SM: at D=128 bf16 a
# BLOCK_N=64 K+V stage is 32 KB, and 3 stages (96 KB) leave room for two programs per SM.
DECODE_MAX_ROWS = 128  # packed rows (group_size * Sq) up to which the split-KV kernel replaces the forward
DECODE_MAX_BLOCK_M = 64
INTERPRETER_DECODE = TileConfig(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1)
_SM90_DECODE = {16: (128, 4, 3), 32: (128, 4, 3), 64: (128, 4, 3), 128: (64, 4, 3), 256: (64, 4, 2)}
_GENERIC_DECODE = {16: (64, 4, 2), 32: (64, 4, 2), 64: (64, 4, 2), 128: (64, 4, 2), 256: (32, 4, 2)}
# FMA dots (see _IEEE_FWD): at D256 the generic 32-key tiles spilled 3.5 KB and ran 6.1x the time of these 16-key
# ones (B8, 16K cache, H200); at D128 32-key tiles (no spill) ran 1.1-1.2x the time of the generic 64-key ones (1.1 KB).
_IEEE_DECODE = {**_GENERIC_DECODE, 256: (16, 4, 2)}
# tf32x3 dots (see _TF32X3_FWD): the generic tiles measured fastest (D128: 16 / 32-key tiles 1.31 / 1.01x their time,
# D256: 16-key 1.16x).
_TF32X3_DECODE = dict(_GENERIC_DECODE)
# Splits: enough programs for SPLIT_PROGRAMS_PER_SM resident programs on every SM, at most MAX_SPLITS (the
# combine kernel streams splits, so this only bounds the workspace), and no more than the key blocks.
MAX_SPLITS = 128
SPLIT_PROGRAMS_PER_SM = 2


def decode_config(arch, head_dim_padded, rows, dtype, interpreter=False, precision="tf32"):
    """The split-KV kernel's tiles for `rows` packed query rows (group_size * Sq); precision as fwd_config's."""
    if interpreter:
        return INTERPRETER_DECODE
    if precision == "ieee" and _is_fp32(dtype):
        table = _IEEE_DECODE
    elif precision == "tf32x3":
        table = _TF32X3_DECODE
    else:
        table = _table_for(arch, dtype, _SM90_DECODE, _GENERIC_DECODE)
    block_n, warps, stages = table[head_dim_padded]
    block_m = min(DECODE_MAX_BLOCK_M, max(16, 1 << (rows - 1).bit_length()))
    return TileConfig(block_m, block_n, warps, stages)


@functools.lru_cache(maxsize=4096)  # a decode step calls it with the same few shapes; the search is ~50 us
def num_splits_heuristic(programs, key_blocks, num_sms):
    """Splits of the key range for `programs` (batch * KV heads * row blocks) programs over `key_blocks`.

    One split when the programs already nearly fill the machine (the combine would be pure cost). Else the
    smallest split count whose last wave is nearly as full as the best one's: a wave holds num_sms *
    SPLIT_PROGRAMS_PER_SM programs, and a partly filled last wave idles the rest of the GPU.
    """
    slots = num_sms * SPLIT_PROGRAMS_PER_SM
    limit = min(MAX_SPLITS, key_blocks)
    if programs >= 0.8 * slots or limit <= 1:
        return 1

    def fill(splits):  # fraction of the launched waves' slots that hold a program
        waves = programs * splits / slots
        return waves / -(-waves // 1)

    best = max(fill(s) for s in range(1, limit + 1))
    return next(s for s in range(1, limit + 1) if fill(s) >= 0.85 * best)
