"""Ready-made masks and mask combinators. Each is a Mod: one definition serving the kernels (Triton form),
create_block_mask and the CPU path (PyTorch form). Integer parameters are written into generated source as
literals, so the compiler folds them; tensors (document ids) travel as aux tensors.

Positions follow FlexAttention: q_idx and kv_idx both count from 0, so causal_mask is q_idx >= kv_idx
(top-left aligned; flashtile's causal=True is bottom-right aligned, the same when Sq == Sk).

The kernels evaluate a mask on a [rows, 1] q_idx and a [1, keys] kv_idx broadcast to the score tile, so each mask
is written with its arithmetic on one side (q_idx - window: once per row) and only compares per score. Arithmetic on
both indices (q_idx - kv_idx) runs per score, and on the GPU LLVM's SLP vectorizer turns it and its compares into
64-wide vector ops whose boolean lanes NVPTX packs into bit fields: the Hopper forward's partial tiles of
sliding_window_mask cost 1027 SASS instructions per key block that way, 727 as written here (docs/perf-log.md).
"""
import functools
import numbers

import torch

from .mods import MASK_ARGS, Mod, combine, generate


@functools.lru_cache(maxsize=None)
def _mask_fn(name, expression, **constants):
    """A generated function (b, h, q_idx, kv_idx[, A0]) returning expression with constants inlined."""
    aux = "A0" in expression
    body = expression.format(**constants)
    source = f"def {name}({', '.join(MASK_ARGS)}{', A0' if aux else ''}):\n    return {body}\n"
    return generate(source, name, {})


_SHIFT_LIMIT = 2 ** 30  # a parameter below it shifts a position (< 2**30 in any sequence) without int32 overflow


def _positive(name, value, lowest=1):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < lowest:
        raise ValueError(f"{name} must be an int >= {lowest}, got {value!r}")
    return int(value)


causal_mask = Mod(_mask_fn("causal_mask", "q_idx >= kv_idx"))
causal_mask.__doc__ = "Query i sees keys j <= i (FlexAttention's causal mask)."


def sliding_window_mask(window, causal=True):
    """Query i sees keys i - window <= j <= i (causal), or |i - j| <= window (causal=False)."""
    window = _positive("window", window, 0)
    if causal:
        return Mod(_mask_fn("sliding_window_mask", "(q_idx >= kv_idx) & (kv_idx >= q_idx - {w})", w=window))
    if window >= _SHIFT_LIMIT:  # q_idx + window could wrap in int32: the difference form
        return Mod(_mask_fn("sliding_window_mask_wide", "(q_idx - kv_idx <= {w}) & (kv_idx - q_idx <= {w})",
                            w=window))
    return Mod(_mask_fn("sliding_window_mask_both", "(kv_idx >= q_idx - {w}) & (kv_idx <= q_idx + {w})",
                        w=window))


def document_mask(doc_ids):
    """Packed sequences: query i sees key j when both belong to the same document.

    doc_ids: integer tensor (S,) shared by every batch row, or (B, S) one row per batch element, giving
    each token's document (any ids; tokens of one document need not be contiguous). It is read by the
    kernels as an aux tensor, so it must be on the inputs' device. Combine with causal_mask for causal
    packed training: and_masks(causal_mask, document_mask(doc_ids)).
    """
    if not isinstance(doc_ids, torch.Tensor) or doc_ids.dim() not in (1, 2) or doc_ids.is_floating_point():
        what = f"{doc_ids.dtype} {tuple(doc_ids.shape)}" if isinstance(doc_ids, torch.Tensor) else type(doc_ids)
        raise ValueError(f"doc_ids must be an integer tensor of shape (S,) or (B, S), got {what}")
    doc_ids = doc_ids.contiguous()
    row = "b * {s} + " if doc_ids.dim() == 2 else ""
    expression = f"tl.load(A0 + {row}q_idx) == tl.load(A0 + {row}kv_idx)"
    extent = ("document_mask's doc_ids", doc_ids.shape[-1], doc_ids.shape[0] if doc_ids.dim() == 2 else None)
    return Mod(_mask_fn("document_mask", expression, s=doc_ids.shape[-1]), (doc_ids,), extents=(extent,))


def prefix_lm_mask(prefix_len):
    """Prefix-LM: every query sees the first prefix_len keys (bidirectional prefix), and causally after."""
    prefix_len = _positive("prefix_len", prefix_len, 0)
    return Mod(_mask_fn("prefix_lm_mask", "(kv_idx < {p}) | (q_idx >= kv_idx)", p=prefix_len))


def block_diagonal_mask(block):
    """Query i sees key j when both lie in the same run of `block` positions (i // block == j // block)."""
    block = _positive("block", block)
    if block >= _SHIFT_LIMIT:
        return Mod(_mask_fn("block_diagonal_mask_wide", "q_idx // {n} == kv_idx // {n}", n=block))
    # The run of query i is [i // block * block, i // block * block + block): bounds per query row, compares per score.
    return Mod(_mask_fn("block_diagonal_mask", "(kv_idx >= q_idx // {n} * {n}) & (kv_idx < q_idx // {n} * {n} + {n})",
                        n=block))


def dilated_mask(dilation, block=128):
    """Block-level dilation (the block-sparse patterns of the FlashAttention paper): query block i sees key
    block j when i = j (mod dilation), with blocks of `block` positions. Density 1 / dilation; with the
    block mask's block size equal to `block`, every block is full or empty (no per-element mask work)."""
    dilation, block = _positive("dilation", dilation), _positive("block", block)
    return Mod(_mask_fn("dilated_mask", "(q_idx // {n}) % {d} == (kv_idx // {n}) % {d}", n=block, d=dilation))


def strided_mask(stride):
    """Strided attention (Sparse Transformers): query i sees keys j <= i with (i - j) a multiple of stride."""
    stride = _positive("stride", stride)
    return Mod(_mask_fn("strided_mask", "(q_idx >= kv_idx) & ((q_idx - kv_idx) % {s} == 0)", s=stride))


def _as_masks(masks, name):
    if not masks:
        raise ValueError(f"{name} needs at least one mask")
    return [m if isinstance(m, Mod) else Mod(m, (), MASK_ARGS, f"{name} argument {i}") for i, m in enumerate(masks)]


def and_masks(*masks):
    """A mask visible where all of masks are (masks: Mods, @triton.jit or plain mask functions)."""
    return combine(_as_masks(masks, "and_masks"), "&", "and_masks")


def or_masks(*masks):
    """A mask visible where any of masks is."""
    return combine(_as_masks(masks, "or_masks"), "|", "or_masks")
