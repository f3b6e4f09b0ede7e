"""FlexAttention pieces for the flex provider: the compiled function, masks and score mods.

All of them are built outside timing. Masks are bottom-right aligned like flash-attn: query i sits at
key position i + Sk - Sq.
"""
import torch

_FLEX = {}


def compiled_flex():
    """One compiled flex_attention for the whole run (dynamic=False recompiles per shape)."""
    if "fn" not in _FLEX:
        import torch._dynamo.config as dynamo_config
        from torch.nn.attention.flex_attention import flex_attention

        # Every (shape, head dim, causal, feature) is a recompile; without this dynamo gives up after 8
        # and silently falls back to the slow eager path.
        for key in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit",
                    "accumulated_cache_size_limit"):
            if hasattr(dynamo_config, key):
                setattr(dynamo_config, key, max(getattr(dynamo_config, key), 1024))
        _FLEX["fn"] = torch.compile(flex_attention, dynamic=False)
    return _FLEX["fn"]


def mask_mod_for(seqlen_q, seqlen_k, causal, feature):
    """A mask_mod for causal and/or the window of ``feature``, or None when every key is visible."""
    left, right = feature.window_size
    if causal:
        right = 0
    if left < 0 and right < 0:
        return None
    offset = seqlen_k - seqlen_q

    def mask_mod(b, h, q_idx, kv_idx):
        pos = q_idx + offset
        if right < 0:
            return kv_idx >= pos - left
        if left < 0:
            return kv_idx <= pos + right
        return (kv_idx <= pos + right) & (kv_idx >= pos - left)

    return mask_mod


def block_mask_for(seqlen_q, seqlen_k, causal, feature, device):
    """The BlockMask flex skips masked blocks with (None when nothing is masked)."""
    from torch.nn.attention.flex_attention import create_block_mask

    mask_mod = mask_mod_for(seqlen_q, seqlen_k, causal, feature)
    if mask_mod is None:
        return None
    return create_block_mask(mask_mod, None, None, seqlen_q, seqlen_k, device=device)


def score_mod_for(seqlen_q, seqlen_k, feature, slopes=None):
    """A score_mod for softcap then ALiBi (the kernels' order; flex has already scaled the score),
    or None. ``slopes``: fp32 (Hq,) on the device, needed when the feature has ALiBi."""
    softcap, offset = feature.softcap, seqlen_k - seqlen_q
    if not softcap and not feature.alibi:
        return None

    def score_mod(score, b, h, q_idx, kv_idx):
        if softcap:
            score = softcap * torch.tanh(score / softcap)
        if feature.alibi:
            score = score - slopes[h] * (q_idx + offset - kv_idx).abs()
        return score

    return score_mod
