"""Host-side tile lists for the persistent Gluon forward's causal launches (kernels/gluon_fwd_persistent.py,
SCHEDULE; GluonConfig.schedule).

A persistent grid whose CTAs take every grid-th tile balances causal tiles (their work falls with their rank) only
by luck: with the tiles in heavy-first order by groups of heads, a grid just above a multiple of a group's tile
count deals a CTA tiles of nearly the same rank round after round, and the CTA that got the heavy ones finishes
last. Session 14 measured that order swing from 0.76x to 0.99x cuDNN between group sizes at one shape. Here each
CTA gets a list instead: the same heavy-first order dealt by list scheduling (longest processing time first), each
tile to the CTA that frees first in a model of the tiles' costs (key blocks plus TILE_OVERHEAD). That is what a
dynamic scheduler (the GPU's block scheduler for a one-tile-per-program grid) does, without a device-side counter.

A list depends only on the tiles (their counts, the grid, the group and each rank's key blocks), so it is built once
per such shape and device and kept for good: a captured CUDA graph or a launch plan holds its address, so it is never
freed (4 bytes per tile; a new shape costs about 2 ms of Python per 2K tiles, once). A launch during a CUDA graph
capture that has no list yet runs the grid's stride order, and the call keeps no launch plan (plans.dont_keep).
"""
import heapq
import math

import torch

from . import plans

TILE_OVERHEAD = 1.0  # a tile's fixed cost beyond its key blocks, in key blocks (the Q load and the epilogue)
_kept = {}  # (n_m, n_bh, ctas, group, key blocks per rank, device) -> int32 tensor, never freed


def heavy_first_tiles(n_m, n_bh, group):
    """(pid_m, pid_bh) of every tile in kernels/gluon_grid._heavy_first_linear's order: groups of group heads, in
    each group rank by rank (rank 0: the last query tile, the longest causal one), every head of the group at one
    rank."""
    order = []
    for first in range(0, n_bh, group):
        heads = range(first, min(first + group, n_bh))
        order.extend((n_m - 1 - rank, bh) for rank in range(n_m) for bh in heads)
    return order


def causal_blocks(pid_m, seqlen_q, seqlen_k, block_m, block_n):
    """Key blocks a causal (bottom-right) query tile visits (kernels/gluon_fwd_persistent._tile_blocks)."""
    last_key = min(seqlen_k, pid_m * block_m + block_m + seqlen_k - seqlen_q)
    return max(0, math.ceil(last_key / block_n))


def rank_blocks(n_m, seqlen_q, seqlen_k, block_m, block_n):
    """causal_blocks of every rank's query tile, pid_m 0 to n_m - 1."""
    return tuple(causal_blocks(m, seqlen_q, seqlen_k, block_m, block_n) for m in range(n_m))


def list_schedule(costs, ctas):
    """Each item (in order) to the CTA that frees first (ties: the lowest CTA): the lists of item indices."""
    free = [(0.0, cta) for cta in range(ctas)]
    lists = [[] for _ in range(ctas)]
    for item, cost in enumerate(costs):
        at, cta = heapq.heappop(free)
        lists[cta].append(item)
        heapq.heappush(free, (at + cost, cta))
    return lists


def schedule_table(n_m, n_bh, ctas, group, seqlen_q, seqlen_k, block_m, block_n):
    """The kernel's Schedule as a list of ints: ctas + 1 offsets into the listed tiles, then the tiles
    (pid_m * n_bh + pid_bh), each CTA's in the order it runs them."""
    return _table(n_bh, ctas, group, rank_blocks(n_m, seqlen_q, seqlen_k, block_m, block_n))


def _table(n_bh, ctas, group, blocks):
    """schedule_table of n_m = len(blocks) query tiles whose rank m visits blocks[m] key blocks."""
    n_m = len(blocks)
    tiles = heavy_first_tiles(n_m, n_bh, group)
    lists = list_schedule([blocks[m] + TILE_OVERHEAD for m, _ in tiles], ctas)
    offsets, listed = [0], []
    for items in lists:
        listed.extend(tiles[i][0] * n_bh + tiles[i][1] for i in items)
        offsets.append(len(listed))
    return offsets + listed


def persistent_schedule(device, n_m, n_bh, ctas, group, seqlen_q, seqlen_k, block_m, block_n):
    """schedule_table's int32 tensor on device, built on a shape's first launch and kept; None under a CUDA graph
    capture that would have to build one (the caller launches the static order)."""
    blocks = rank_blocks(n_m, seqlen_q, seqlen_k, block_m, block_n)
    key = (n_bh, ctas, group, blocks, device)
    table = _kept.get(key)
    if table is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            plans.dont_keep()  # a later call outside the capture builds the list
            return None  # a host-to-device copy is not allowed while capturing
        table = plans.constant(torch.tensor(_table(n_bh, ctas, group, blocks), dtype=torch.int32, device=device))
        _kept[key] = table
    return table
