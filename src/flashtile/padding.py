"""Helpers for users coming from padded batches with an attention mask (as flash_attn.bert_padding)."""
import torch

from .checks import _is_int


def _tensor(name, t, min_dim):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() < min_dim:
        raise ValueError(f"{name} must have at least {min_dim} dimensions, got shape {tuple(t.shape)}")


def unpad_input(hidden_states, attention_mask):
    """Drop padding tokens: hidden_states (batch, seqlen, ...), attention_mask (batch, seqlen), nonzero = keep.

    Returns (hidden_states (total, ...), indices (total,) int64 into the flattened batch * seqlen axis,
    cu_seqlens (batch + 1,) int32, max_seqlen_in_batch int, seqlens_in_batch (batch,) int32), ready for
    flash_attn_varlen_func. Differentiable in hidden_states.
    """
    _tensor("hidden_states", hidden_states, 2)
    _tensor("attention_mask", attention_mask, 2)
    if attention_mask.shape != hidden_states.shape[:2]:
        raise ValueError(f"attention_mask must have shape {tuple(hidden_states.shape[:2])} (batch, seqlen), "
                         f"got {tuple(attention_mask.shape)}")
    if attention_mask.device != hidden_states.device:
        raise ValueError(f"attention_mask is on {attention_mask.device} but hidden_states is on "
                         f"{hidden_states.device}")
    if hidden_states.shape[0] == 0:
        raise ValueError("unpad_input needs a batch of at least one sequence, got batch 0")
    keep = attention_mask.bool()
    seqlens = keep.sum(dim=1, dtype=torch.int32)
    indices = torch.nonzero(keep.flatten(), as_tuple=False).flatten()
    cu_seqlens = torch.nn.functional.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    flat = hidden_states.reshape(-1, *hidden_states.shape[2:])
    return flat[indices], indices, cu_seqlens, int(seqlens.max().item()), seqlens


def pad_input(hidden_states, indices, batch, seqlen):
    """Inverse of unpad_input: (total, ...) -> (batch, seqlen, ...) with zeros at padding. Differentiable.
    indices: unpad_input's (total,) int64 positions in the flattened batch * seqlen axis (int32 also taken)."""
    _tensor("hidden_states", hidden_states, 1)
    _tensor("indices", indices, 1)
    for name, n in (("batch", batch), ("seqlen", seqlen)):
        if not _is_int(n) or n < 0:
            raise ValueError(f"{name} must be an int >= 0, got {n!r}")
    if indices.dim() != 1 or indices.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"indices must be a 1-D int64 or int32 tensor (unpad_input gives int64), got {indices.dtype} "
                         f"{tuple(indices.shape)}")
    if indices.shape[0] != hidden_states.shape[0]:
        raise ValueError(f"indices has {indices.shape[0]} entries but hidden_states has {hidden_states.shape[0]} "
                         f"rows (total tokens)")
    if indices.device != hidden_states.device:
        raise ValueError(f"indices is on {indices.device} but hidden_states is on {hidden_states.device}")
    if indices.device.type == "cpu" and indices.numel() and not torch.compiler.is_compiling():
        # (on a GPU this would cost a sync per call: there index_put's own device-side check reports it)
        low, high = int(indices.min()), int(indices.max())
        if low < 0 or high >= batch * seqlen:
            raise ValueError(f"indices must lie in [0, batch * seqlen) = [0, {batch * seqlen}), got [{low}, {high}]")
    out = hidden_states.new_zeros(batch * seqlen, *hidden_states.shape[1:])
    out = out.index_put((indices,), hidden_states)
    return out.reshape(batch, seqlen, *hidden_states.shape[1:])
