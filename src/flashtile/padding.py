"""Helpers for users coming from padded batches with an attention mask (as flash_attn.bert_padding)."""
import torch


def unpad_input(hidden_states, attention_mask):
    """Drop padding tokens: hidden_states (batch, seqlen, ...), attention_mask (batch, seqlen), nonzero = keep.

    Returns (hidden_states (total, ...), indices (total,) int64 into the flattened batch * seqlen axis,
    cu_seqlens (batch + 1,) int32, max_seqlen_in_batch int, seqlens_in_batch (batch,) int32), ready for
    flash_attn_varlen_func. Differentiable in hidden_states.
    """
    if attention_mask.shape != hidden_states.shape[:2]:
        raise ValueError(f"attention_mask must have shape {tuple(hidden_states.shape[:2])} (batch, seqlen), "
                         f"got {tuple(attention_mask.shape)}")
    keep = attention_mask.bool()
    seqlens = keep.sum(dim=1, dtype=torch.int32)
    indices = torch.nonzero(keep.flatten(), as_tuple=False).flatten()
    cu_seqlens = torch.nn.functional.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    flat = hidden_states.reshape(-1, *hidden_states.shape[2:])
    return flat[indices], indices, cu_seqlens, int(seqlens.max().item()), seqlens


def pad_input(hidden_states, indices, batch, seqlen):
    """Inverse of unpad_input: (total, ...) -> (batch, seqlen, ...) with zeros at padding. Differentiable."""
    out = hidden_states.new_zeros(batch * seqlen, *hidden_states.shape[1:])
    out = out.index_put((indices,), hidden_states)
    return out.reshape(batch, seqlen, *hidden_states.shape[1:])
