"""Block masks: which (query block, key block) pairs a mask leaves empty, partial or full.

The kernels visit only the listed blocks: partial ones evaluate the mask_mod per element, full ones skip
it, empty ones are never loaded, so the cost scales with the number of non-empty blocks.
"""
from dataclasses import dataclass

import torch

from ..cpu import mask_values
from .mods import MASK_ARGS, Mod

_CHUNK_ELEMENTS = 1 << 24  # mask elements evaluated at once by create_block_mask


@dataclass(frozen=True)
class BlockMask:
    """Block sparsity of a mask over (B, H, Sq, Sk) in blocks of block_size = (rows, cols), powers of two >= 16.

    kv_num_blocks / full_kv_num_blocks: int32 (B, H, ceil(Sq / rows)), the number of partial / full key
    blocks of each query block; kv_indices / full_kv_indices: int32 (B, H, ceil(Sq / rows), ceil(Sk / cols)),
    those key blocks first (the rest is padding). q_* are the transposed lists (for each key block, its
    query blocks), used by the dK/dV kernel. B and H may be 1, meaning the same for every batch / head.
    Blocks that reach past Sq or Sk are never full. mask_mod is the mask evaluated in partial blocks.
    """
    kv_num_blocks: torch.Tensor
    kv_indices: torch.Tensor
    full_kv_num_blocks: torch.Tensor
    full_kv_indices: torch.Tensor
    q_num_blocks: torch.Tensor
    q_indices: torch.Tensor
    full_q_num_blocks: torch.Tensor
    full_q_indices: torch.Tensor
    shape: tuple
    block_size: tuple
    mask_mod: Mod

    @staticmethod
    def from_blocks(partial, full, shape, block_size, mask_mod):
        """From boolean (B, H, query blocks, key blocks) tensors of partial and full blocks."""
        return BlockMask(*_lists(partial), *_lists(full), *_lists(partial.transpose(-1, -2)),
                         *_lists(full.transpose(-1, -2)), tuple(shape), tuple(block_size), mask_mod)

    @property
    def device(self):
        return self.kv_num_blocks.device

    def density(self):
        """Fraction of (batch, head, query block, key block) tiles that are not empty."""
        total = self.kv_indices.numel()
        return float((self.kv_num_blocks.sum() + self.full_kv_num_blocks.sum()) / total) if total else 0.0

    def __repr__(self):
        return (f"BlockMask(shape={self.shape}, block_size={self.block_size}, density={self.density():.3f}, "
                f"mask_mod={self.mask_mod!r})")


def _lists(blocks):
    """(count, indices) int32 of the True entries along the last dim, those indices first."""
    order = torch.argsort((~blocks).to(torch.int8), dim=-1, stable=True)
    return blocks.sum(-1, dtype=torch.int32).contiguous(), order.to(torch.int32).contiguous()


def check_block_size(block_size):
    try:
        rows, cols = block_size
    except (TypeError, ValueError):
        raise ValueError(f"block_size must be a pair (rows, cols), got {block_size!r}") from None
    for side in (rows, cols):
        if isinstance(side, bool) or not isinstance(side, int) or side < 16 or side & (side - 1):
            raise ValueError(f"block_size entries must be powers of two >= 16 (kernel tiles shrink to them or "
                             f"divide them), got {tuple(block_size)}")
    return rows, cols


def _check_dims(B, H, seqlen_q, seqlen_k):
    for name, value, lowest in (("B", B, 1), ("H", H, 1), ("Sq", seqlen_q, 1), ("Sk", seqlen_k, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < lowest:
            raise ValueError(f"create_block_mask: {name} must be an int >= {lowest}, got {value!r}")


def _check_broadcast(mod, B, H, Sq, Sk):
    """B or H None claims the mask ignores b or h: check it on a 64 x 64 grid of positions spread over the
    matrix, so a per-batch/per-head mask built for all is refused instead of giving silently wrong blocks."""
    q_idx = torch.linspace(0, Sq - 1, min(Sq, 64)).long().view(1, 1, -1, 1)
    kv_idx = torch.linspace(0, Sk - 1, min(Sk, 64)).long().view(1, 1, 1, -1)
    device = mod.aux[0].device if mod.aux else torch.device("cpu")
    q_idx, kv_idx = q_idx.to(device), kv_idx.to(device)
    zero = torch.zeros((), dtype=torch.long, device=device)
    for name, count, args in (("B", B, lambda i: (i, zero)), ("H", H, lambda i: (zero, i))):
        if count is not None:
            continue
        try:
            grid = (1, 1, q_idx.shape[2], kv_idx.shape[3])  # (a constant mask gives a 0-dim result)
            same = torch.equal(torch.as_tensor(mod(*args(zero), q_idx, kv_idx)).broadcast_to(grid),
                               torch.as_tensor(mod(*args(zero + 1), q_idx, kv_idx)).broadcast_to(grid))
        except (IndexError, RuntimeError) as exc:  # e.g. a per-batch table read at b = 1
            raise ValueError(f"create_block_mask: {name}=None but the mask fails for {name.lower()} = 1 ({exc}); "
                             f"pass the real {name}") from exc
        if not same:
            raise ValueError(f"create_block_mask: {name}=None but the mask differs between {name.lower()} = 0 and "
                             f"{name.lower()} = 1; pass the real {name} (1 for a single batch row / head)")


def create_block_mask(mask_fn, B, H, Sq, Sk, block_size=(128, 128), device=None, aux=()):
    """Evaluate mask_fn(b, h, q_idx, kv_idx) block by block and record its block sparsity.

    mask_fn: a mask Mod (causal_mask, document_mask(...), and_masks(...)), a @triton.jit function, or a plain
    function of index tensors (vectorized PyTorch arithmetic, or Triton-style code with `tl.load` for aux
    tensors, passed as `aux` and as extra arguments). B, H: batch and head counts, or None for a mask that is
    the same for all (stored as size 1; a mask that depends on b or h needs the real count, and a mask found to
    differ between b (or h) = 0 and 1 on a sample of positions is refused). The mask is evaluated on at most
    2^24 elements at a time, never on the full Sq x Sk matrix. device: where the lists live (default: CUDA
    when available).
    Returns a BlockMask for `flashtile.attention(..., block_mask=...)`.
    """
    mod = mask_fn if isinstance(mask_fn, Mod) and not aux else Mod(mask_fn, aux, MASK_ARGS, "mask_fn")
    broadcast_b, broadcast_h = B is None, H is None
    B, H = 1 if broadcast_b else B, 1 if broadcast_h else H  # (0 is refused below, not taken for None)
    _check_dims(B, H, Sq, Sk)
    rows, cols = check_block_size(block_size)
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:  # "cuda" means the current device, as tensors record it
        device = torch.device("cuda", torch.cuda.current_device())
    for i, a in enumerate(mod.aux):
        if a.device != device:
            raise ValueError(f"aux tensor {i} of the mask is on {a.device} but the block mask is built on {device}")
    _check_broadcast(mod, None if broadcast_b else B, None if broadcast_h else H, Sq, Sk)
    n_q, n_k = -(-Sq // rows), -(-Sk // cols)
    partial = torch.zeros(B, H, n_q, n_k, dtype=torch.bool, device=device)
    full = torch.zeros_like(partial)
    col_chunk = max(1, min(n_k, _CHUNK_ELEMENTS // (B * H * rows * cols))) * cols
    row_chunk = max(1, _CHUNK_ELEMENTS // (B * H * rows * col_chunk)) * rows
    b = torch.arange(B, device=device).view(B, 1, 1, 1)
    h = torch.arange(H, device=device).view(1, H, 1, 1)
    with torch.no_grad():
        for r0 in range(0, n_q * rows, row_chunk):
            q_pos = torch.arange(r0, min(r0 + row_chunk, n_q * rows), device=device)
            for c0 in range(0, n_k * cols, col_chunk):
                k_pos = torch.arange(c0, min(c0 + col_chunk, n_k * cols), device=device)
                # Indices past the ends are clamped (masks may index tables with them) and then masked out.
                visible = mod(b, h, q_pos.clamp(max=Sq - 1).view(1, 1, -1, 1),
                              k_pos.clamp(max=Sk - 1).view(1, 1, 1, -1))
                visible = mask_values(visible, "mask_fn").to(device)
                visible = visible & (q_pos < Sq).view(-1, 1) & (k_pos < Sk).view(1, -1)
                tiles = visible.expand(B, H, len(q_pos), len(k_pos)).reshape(
                    B, H, len(q_pos) // rows, rows, len(k_pos) // cols, cols)
                any_, all_ = tiles.any(5).any(3), tiles.all(5).all(3)
                qs, ks = slice(r0 // rows, r0 // rows + any_.shape[2]), slice(c0 // cols, c0 // cols + any_.shape[3])
                full[:, :, qs, ks] = all_
                partial[:, :, qs, ks] = any_ & ~all_
    return BlockMask.from_blocks(partial, full, (B, H, Sq, Sk), (rows, cols), mod)


def dense_block_mask(mask_mod, Sq, Sk, device, block_size=(128, 128)):
    """Every block partial: the mask_mod is evaluated everywhere and no block is skipped (what attention uses
    when it gets a mask_mod but no block mask)."""
    n_q, n_k = -(-Sq // block_size[0]), -(-Sk // block_size[1])
    partial = torch.ones(1, 1, n_q, n_k, dtype=torch.bool, device=device)
    return BlockMask.from_blocks(partial, torch.zeros_like(partial), (1, 1, Sq, Sk), block_size, mask_mod)
