"""The Gluon backward's additive bias (kernels/gluon_bwd.py reads it through a 4-D TMA tensor): the layouts it takes
(bias_tma_ok) and its descriptor. gluon_bwd_launch checks the shared memory its ring needs (bias_shared_ok) and
launches."""
import functools

import torch

from .gluon_launch import tma_descriptor

try:
    from triton.experimental.gluon import language as _gl
except Exception:  # noqa: BLE001  (no Gluon: gluon_bwd_launch refuses every call before a descriptor is made)
    _gl = None


def _broadcast(bias, dim):
    """Whether bias dim `dim` is broadcast: size 1, or expanded (stride 0)."""
    return bias.shape[dim] == 1 or bias.stride(dim) == 0


def bias_tma_ok(attn_bias, seqlen_q, seqlen_k):
    """Whether the dK/dV kernel reads attn_bias (4-D, broadcastable to (B, Hq, Sq, Sk)) as a 4-D TMA tensor: full
    Sq and Sk dims (a query- or key-broadcast bias has no TMA form), unit key stride, 16-byte aligned base and
    strides of the dims it steps (query rows; batch / heads where not broadcast), fp16 / bf16 / fp32. Also, to be
    safe with the driver's tensor-map checks (a failing launch disables the Gluon backward for the process), each
    stepped dim's stride covers the dims inside it (a row at least Sk, a head at least Sq rows, a batch at least
    its heads), as in any slice of a contiguous tensor; a permuted bias stays on the portable kernels."""
    if attn_bias.dtype not in (torch.float16, torch.bfloat16, torch.float32) or attn_bias.dim() != 4:
        return False
    shape, strides, size = attn_bias.shape, attn_bias.stride(), attn_bias.element_size()
    if shape[2] != seqlen_q or shape[3] != seqlen_k or (strides[3] != 1 and seqlen_k > 1):
        return False
    inner = seqlen_k  # elements the dims inside the current one span
    if seqlen_q > 1:
        if strides[2] < inner or strides[2] * size % 16:
            return False
        inner = strides[2] * seqlen_q
    for dim in (1, 0):
        if not _broadcast(attn_bias, dim):
            if strides[dim] < inner or strides[dim] * size % 16:
                return False
            inner = strides[dim] * shape[dim]
    return attn_bias.data_ptr() % 16 == 0


def _bias_descriptor(attn_bias, block_m, keys):
    """attn_bias as a 4-D (B or 1, Hq or 1, Sq, Sk) TMA tensor, boxes [1, 1, block_m, keys]: a broadcast dim has
    size 1 (read at coordinate 0; its stride is then any aligned value). A box past Sq or Sk is zero-filled."""
    shape, strides = list(attn_bias.shape), list(attn_bias.stride())
    aligned = 16 // attn_bias.element_size()  # elements per 16 bytes
    strides[3] = 1
    if shape[2] == 1:  # a single query row: its stride is never stepped
        strides[2] = -(-shape[3] // aligned) * aligned
    for dim in (1, 0):  # broadcast dims as if contiguous over the dims after them
        if _broadcast(attn_bias, dim):
            shape[dim], strides[dim] = 1, strides[dim + 1] * shape[dim + 1]
    layout = _bias_layout(block_m, keys, attn_bias.dtype)
    return tma_descriptor(attn_bias, shape, strides, [1, 1, block_m, keys], layout)


@functools.lru_cache(maxsize=None)
def _bias_layout(block_m, keys, dtype):
    """The bias box's NVMMA layout (128-byte swizzle), one object per (box, torch dtype): fast_launch keys layouts
    by identity, so a fresh one per call would miss its cache every time."""
    gl_dtype = {torch.float16: _gl.float16, torch.bfloat16: _gl.bfloat16, torch.float32: _gl.float32}[dtype]
    return _gl.NVMMASharedLayout.get_default_for([1, 1, block_m, keys], gl_dtype)


def _bias_args(attn_bias, block_m, keys):
    """(bias_desc, bias_batch, bias_heads) of the dK/dV kernel."""
    desc = _bias_descriptor(attn_bias, block_m, keys)
    return desc, desc.shape[0], desc.shape[1]
