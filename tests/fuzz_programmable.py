"""Random flashtile.attention cases for tests/test_fuzz.py: a seed draws a mask (one or two ready-made masks, and-ed
or or-ed, with random parameters), an optional score_mod with its gradient (a softcap, a per-head ALiBi read from an
aux table, a relative-position bias table), block-sparse through create_block_mask at random block sizes or the
mask evaluated in every block, causal, scale, GQA, dtype and shapes. fuzz_cases checks them like its own cases
(its Case with `mods` set: the spec drawn here; materialize() builds the mods on the device)."""
import random

import torch
import triton.language as tl

import flashtile
from flashtile.flex import tanh
from flashtile.flex.mods import SCORE_ARGS, Mod
from utils import FUZZ_GPU_ELEMENTS

# Globals a Triton function reads must be constexprs (the interpreter takes plain ones, the compiler does not).
CAP = tl.constexpr(20.0)
REL_SPAN = tl.constexpr(32)  # relative positions -31..32 have their own bias; farther ones share the end buckets


def softcap_mod(score, b, h, q_idx, kv_idx):
    return CAP * tanh(score / CAP)


def softcap_grad(score, b, h, q_idx, kv_idx):
    t = tanh(score / CAP)
    return 1.0 - t * t


def alibi_mod(score, b, h, q_idx, kv_idx, slopes):
    return score - tl.load(slopes + h) * tl.abs(q_idx - kv_idx).to(tl.float32)


def rel_bias_mod(score, b, h, q_idx, kv_idx, table):
    return score + tl.load(table + h * 64 + tl.minimum(tl.maximum(q_idx - kv_idx, -31), REL_SPAN) + 31)


def unit_grad(score, b, h, q_idx, kv_idx, aux):  # alibi_mod's and rel_bias_mod's derivative
    return score * 0.0 + 1.0


SCORES = {"softcap": (softcap_mod, softcap_grad), "alibi": (alibi_mod, unit_grad),
          "relbias": (rel_bias_mod, unit_grad)}
MASKS = ("causal", "window", "window-both", "document", "prefix", "blockdiag", "dilated", "strided")


def draw(seed, gpu):
    """Case keywords (fuzz_cases.Case) of seed's programmable case; its own stream, so the other families keep
    theirs."""
    rng = random.Random(seed * 1_000_003 + 17)
    chance = rng.random
    if gpu:
        dtype = rng.choices([torch.bfloat16, torch.float16, torch.float32], [45, 45, 10])[0]
        head_dim = rng.choice([64, 128, 256]) if chance() < 0.8 else rng.choice([40, 96, 160])
        longest = 2048
    else:
        dtype = rng.choice([torch.float16, torch.float32])
        head_dim = rng.choice([8, 16, 32, 40])
        longest = 96
    seqlen_q = rng.randint(1, longest)
    seqlen_k = seqlen_q if chance() < 0.6 else rng.randint(1, longest)
    heads_kv = rng.choice([1, 2])
    heads_q = heads_kv * rng.choice([1, 2, 4])
    batch = rng.randint(1, 2)
    while gpu and batch * heads_q * seqlen_q * seqlen_k > FUZZ_GPU_ELEMENTS:
        seqlen_q, seqlen_k = (seqlen_q + 1) // 2, (seqlen_k + 1) // 2
    span = max(seqlen_q, seqlen_k)
    parts = []
    for _ in range(1 if chance() < 0.6 else 2):
        kind = rng.choice(MASKS)
        parts.append((kind, rng.randint(1, span)))
    combine = rng.choice(["and", "or"])
    score = rng.choice(["", "softcap", "alibi", "relbias"])
    if chance() < 0.75:  # block-sparse; GPU cases mostly at the Gluon sparse path's 128 x 128
        sizes = [16, 32, 64, 128]
        block = (128, 128) if gpu and chance() < 0.6 else (rng.choice(sizes), rng.choice(sizes))
    else:
        block = ()
    causal = not block and chance() < 0.3
    scale = round(rng.uniform(0.05, 0.5), 4) if chance() < 0.2 else None
    return dict(seed=seed, varlen=False, seqlens_q=(seqlen_q,) * batch, seqlens_k=(seqlen_k,) * batch,
                heads_q=heads_q, heads_kv=heads_kv, head_dim=head_dim, dtype=dtype, causal=causal,
                softmax_scale=scale, strided=chance() < 0.2, backward=chance() < 0.85,
                mods=(tuple(parts), combine, score, block))


def name_parts(mods):
    parts, combine, score, block = mods
    words = [f"{combine}-" * (len(parts) > 1) + "+".join(kind + str(n) * (kind != "causal") for kind, n in parts)]
    words += [f"smod-{score}"] if score else []
    return words + [f"blocks{block[0]}x{block[1]}" if block else "no-block-mask"]


def _mask(kind, n, seqlen, device):
    if kind == "causal":
        return flashtile.causal_mask
    if kind in ("window", "window-both"):
        return flashtile.sliding_window_mask(n, causal=kind == "window")
    if kind == "document":  # about n tokens per document, one id tensor for both batches
        ids = torch.arange(seqlen, device=device) // n
        return flashtile.document_mask(ids.to(torch.int32))
    if kind == "prefix":
        return flashtile.prefix_lm_mask(n)
    if kind == "blockdiag":
        return flashtile.block_diagonal_mask(n)
    if kind == "dilated":
        return flashtile.dilated_mask(1 + n % 4, block=16 * (1 + n % 8))
    return flashtile.strided_mask(1 + n % 7)


def materialize(case, device):
    """(flashtile.attention keywords, the reference's mask_mod and score_mod as Mods)."""
    parts, combine, score, block = case.mods
    seqlen_q, seqlen_k = case.seqlens_q[0], case.seqlens_k[0]
    gen = torch.Generator().manual_seed(case.seed + 5)
    masks = [_mask(kind, n, max(seqlen_q, seqlen_k), device) for kind, n in parts]
    mask = masks[0] if len(masks) == 1 else (flashtile.and_masks if combine == "and" else flashtile.or_masks)(*masks)
    kwargs = dict(softmax_scale=case.softmax_scale, causal=case.causal)
    if block:
        kwargs["block_mask"] = flashtile.create_block_mask(mask, len(case.seqlens_q), case.heads_q, seqlen_q, seqlen_k,
                                                           block_size=block, device=device)
    else:
        kwargs["mask_mod"] = mask
    score_ref = None
    if score:
        fn, grad = SCORES[score]
        aux = ()
        if score == "alibi":
            aux = ((torch.rand(case.heads_q, generator=gen) * 0.5).to(device),)
        elif score == "relbias":
            aux = ((torch.randn(case.heads_q, 64, generator=gen) * 0.5).to(device),)
        kwargs.update(score_mod=fn, score_mod_grad=grad, aux=aux)
        score_ref = Mod(fn, aux, SCORE_ARGS, "score_mod")
    mask_ref = mask if isinstance(mask, Mod) else Mod(mask)
    return kwargs, (mask_ref, score_ref)
