"""Block-sparse helpers of the Hopper Gluon kernels (flashtile.attention with a block mask): walking a block mask's
lists of key blocks (forward) or query blocks (backward, the transposed lists) tile by tile, and evaluating the
user's mask_mod on a partial tile's scores. The forward's kernel and consumers (gluon_fwd.py, gluon_fwd_consumer.py) and
the backward's (gluon_bwd.py, gluon_bwd_step.py, gluon_bwd_split_d.py) import them."""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def _list_tile_key(block_list, t, valid, BLOCK_N: gl.constexpr, SPARSE_N: gl.constexpr):
    """First key of tile t of the key blocks listed at block_list (SPARSE_N // BLOCK_N tiles per block); 0 where
    not valid."""
    TILES: gl.constexpr = SPARSE_N // BLOCK_N
    return gl.load(block_list + t // TILES, mask=valid, other=0) * SPARSE_N + (t % TILES) * BLOCK_N


@gluon.jit
def _sparse_tile_key(j, n_full, n_blocks, full_ptr, part_ptr, BLOCK_N: gl.constexpr, SPARSE_N: gl.constexpr):
    """First key of the block-sparse walk's key tile j: tiles [0, n_full) cover the full key blocks listed at
    full_ptr, then [n_full, n_blocks) the partial ones at part_ptr (as kernels/common._sparse_tile_start). Full
    blocks first, the reverse of the portable kernel's order, so the consumers' dense loop structure (unmasked
    tiles, then masked ones) walks it unchanged. 0 at j >= n_blocks (the loader's last look-ahead reads nothing)."""
    if j < n_full:
        key = _list_tile_key(full_ptr, j, True, BLOCK_N, SPARSE_N)
    else:
        key = _list_tile_key(part_ptr, j - n_full, j < n_blocks, BLOCK_N, SPARSE_N)
    return key


@gluon.jit
def _mask_mod_scores(s, key0, row0, seqlen_q, seqlen_k, off_b, off_h, aux0, aux1, aux2, aux3,
                     BLOCK_N: gl.constexpr, MASK_MOD: gl.constexpr, EVEN_N: gl.constexpr = False):
    """s: a warpgroup's [M, BLOCK_N] fp32 scores (M = its query rows). -inf where key key0 + c is past seqlen_k or
    MASK_MOD(b, h, q_idx, kv_idx, aux0..aux3) is False for row row0 + r (a partial block of a block mask).
    MASK_MOD is flashtile.flex's generated adapter, a @triton.jit function compiled with the caller's Gluon
    semantics: its index tensors carry the S accumulator's layout (slices of it, broadcast as [M, 1] and
    [1, BLOCK_N]). With aux tensors, positions past the ends are clamped to
    the last one (mods may index aux tensors with them), as kernels/common._scores does; without, they are left as
    they are (the D64 causal mask's partial loop: 934 -> 706 SASS instructions, the dense causal diagonal's 687).
    EVEN_N (Sk a multiple of the block mask's SPARSE_N): no listed tile reaches past seqlen_k, so the sequence-end
    select and the key clamp are left out (D64 partial loops: causal 706 -> 601, document 1021 -> 807, the
    unclamped keys' ids loaded in pairs); the row positions then pass through an identity asm (a mov ptxas removes).
    Why: LLVM's SLP vectorizer turns a mask's per-score compares into one 64-wide vector compare when both of its
    operand trees are vectorizable (row0 + r and key0 + c are), and NVPTX packs the <64 x i1> result into bit
    fields (SEL / LOP3 / SHF per score: the causal loop 796 without the asm). Opaque rows leave it nothing to gain;
    the keys stay transparent, so key-side arithmetic still folds with key0 (dilated: one value per tile)."""
    layout: gl.constexpr = s.type.layout
    cols = key0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, layout))  # [BLOCK_N]
    rows = row0 + gl.arange(0, s.shape[0], layout=gl.SliceLayout(1, layout))  # [M]
    if EVEN_N:
        rows = gl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [rows], dtype=gl.int32, is_pure=True,
                                         pack=1)  # [M]
    if MASK_MOD is not None:
        if aux0 is None:
            # A mask without aux tensors reads no memory: positions past the ends need no clamp (their scores are
            # masked below, or belong to rows that are never stored), and the compares fold with key0.
            q_idx = rows[:, None]  # [M, 1]
            kv_idx = cols[None, :]  # [1, BLOCK_N]
        else:
            q_idx = gl.minimum(rows, seqlen_q - 1)[:, None]  # [M, 1]
            if EVEN_N:
                kv_idx = cols[None, :]  # [1, BLOCK_N], every key < seqlen_k
            else:
                kv_idx = gl.minimum(cols, seqlen_k - 1)[None, :]  # [1, BLOCK_N]
        s = gl.where(MASK_MOD(off_b, off_h, q_idx, kv_idx, aux0, aux1, aux2, aux3), s, float("-inf"))
    if not EVEN_N:
        s = gl.where((cols < seqlen_k)[None, :], s, float("-inf"))
    return s  # [M, BLOCK_N]
