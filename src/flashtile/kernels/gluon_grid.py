"""Grid order of the Hopper Gluon kernels' causal launches and of their launches with a bias the batch shares
(kernels/gluon_fwd.py, gluon_fwd_persistent.py and gluon_bwd.py import it)."""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def _heavy_first_linear(linear, n_x, n_bh, GROUP: gl.constexpr):
    """(rank, head) of the linear-th program (or persistent tile) of n_x ranks x n_bh heads in heavy-first order
    (_heavy_first): groups of GROUP heads, in each group rank by rank, every head of the group at one rank."""
    span = GROUP * n_x
    group = linear // span
    heads = gl.minimum(n_bh - group * GROUP, GROUP)  # the last group may be smaller
    within = linear - group * span
    return within // heads, group * GROUP + within % heads


@gluon.jit
def _heavy_first(pid_x, pid_bh, n_x, n_bh, GROUP: gl.constexpr):
    """(rank, head) of the program at grid (pid_x, pid_bh) of (n_x, n_bh), for tiles whose work falls with their
    rank (causal: rank 0 the longest). The GPU starts programs in linear order, x fastest; a grid walked head by
    head starts the last heads' longest tiles near the end, which then run alone (the tail). Here the linear order
    walks groups of GROUP heads, and in each group rank by rank, every head of the group at one rank: the longest
    tiles start first (longest-processing-time order), while the tiles in flight still share a few heads' K / V
    (forward) or Q / dO (backward) in L2."""
    return _heavy_first_linear(pid_bh * n_x + pid_x, n_x, n_bh, GROUP)


@gluon.jit
def _batch_fast(pid_x, pid_bh, n_x, n_batch):
    """(rank, batch-fast head index h * n_batch + b) of the program at grid (pid_x, pid_bh) of (n_x, n_batch heads):
    the linear order (x fastest) walks the batch fastest, then the rank, then the head, so the n_batch programs of
    one (head, rank) start one after the other. A bias shared by the batch is then read by all of them while its
    tiles are in L2 (grid order by head, the batch's programs of one tile start a whole head's tiles apart)."""
    linear = pid_bh * n_x + pid_x
    b = linear % n_batch
    rest = linear // n_batch
    return rest % n_x, (rest // n_x) * n_batch + b


@gluon.jit
def _batch_and_head(pid_bh, heads, BATCH_FAST: gl.constexpr):
    """(batch, head) of the grid's second index over batch x heads: b * heads + h, or with BATCH_FAST (_batch_fast's
    numbering) h * batch + b."""
    if BATCH_FAST:
        batch = gl.num_programs(1) // heads
        off_b = pid_bh % batch
        off_h = pid_bh // batch
    else:
        off_b = pid_bh // heads
        off_h = pid_bh % heads
    return off_b, off_h
