"""Sparse mode: block-sparse flashtile.attention against dense flashtile (every block computed) and
FlexAttention with the same mask, at one sequence length per run (default 16K tokens on a GPU).

Masks (--sparse-masks): window:W (causal sliding window of W keys), document:N (N packed documents of
random lengths, causal inside each), dilated:D (block-level dilation, density 1/D), causal. Each
provider's block mask is built outside timing with 128 x 128 blocks. ms are medians; speedup = dense
flashtile ms / provider ms; flex / flashtile = flex ms / block-sparse flashtile ms (> 1: flashtile faster).
"""
import os
import sys

import torch

import flashtile
from flashtile.bench.report import _fmt, _render
from flashtile.bench.sweep import DTYPES, _release, describe_error
from flashtile.bench.timing import bench_ms

GPU_DEFAULTS = dict(sparse_seqlens=[16384], sparse_masks=["window:2048", "document:8", "dilated:4", "causal"])
CPU_DEFAULTS = dict(sparse_seqlens=[512], sparse_masks=["window:128", "document:4", "dilated:4"])
# flashtile-sparse-portable: the same call with FLASHTILE_GLUON_SPARSE=0 (the portable Triton forward, and in
# fwd_bwd the portable backward: the variable stays set through torch.autograd.grad), so the Hopper Gluon
# block-sparse forward + backward and the portable ones time in one run.
PROVIDERS = ("flashtile-sparse", "flashtile-sparse-portable", "flashtile-dense", "flex")
BLOCK = 128


def parse_mask(spec):
    """'window:2048' -> ('window', 2048); raises ValueError on anything else."""
    name, _, value = spec.partition(":")
    if name == "causal" and not value:
        return name, 0
    if name not in ("window", "document", "dilated") or not value.isdigit() or int(value) < 1:
        raise ValueError(f"expected window:W, document:N, dilated:D or causal, got {spec!r}")
    return name, int(value)


def build(spec, seqlen, device, seed):
    """(flashtile mask Mod, the same mask as a plain PyTorch mask_mod for FlexAttention)."""
    name, value = parse_mask(spec)
    if name == "window":
        return (flashtile.sliding_window_mask(value),
                lambda b, h, q, kv: (q >= kv) & (q - kv <= value))
    if name == "dilated":
        return (flashtile.dilated_mask(value, block=BLOCK),
                lambda b, h, q, kv: (q // BLOCK) % value == (kv // BLOCK) % value)
    if name == "causal":
        return flashtile.causal_mask, lambda b, h, q, kv: q >= kv
    gen = torch.Generator().manual_seed(seed)
    cuts = torch.sort(torch.randperm(seqlen - 1, generator=gen)[:value - 1] + 1).values
    ids = torch.zeros(seqlen, dtype=torch.int64)
    ids[cuts] = 1
    ids = ids.cumsum(0).to(device)
    return (flashtile.and_masks(flashtile.causal_mask, flashtile.document_mask(ids)),
            lambda b, h, q, kv: (ids[q] == ids[kv]) & (q >= kv))


def _prepare(name, q, k, v, mask, flex_mask, seqlen):
    """(leaf inputs, a zero-argument function giving the output as (B, S, H, D)); block masks are built here,
    outside timing. FlexAttention gets contiguous (B, H, S, D) leaves, its own layout."""
    if name == "flashtile-dense":
        return (q, k, v), lambda: flashtile.flash_attn_func(q, k, v)
    if name == "flashtile-sparse":
        bm = flashtile.create_block_mask(mask, None, None, seqlen, seqlen, block_size=(BLOCK, BLOCK), device=q.device)
        return (q, k, v), lambda: flashtile.attention(q, k, v, block_mask=bm)
    if name == "flashtile-sparse-portable":
        bm = flashtile.create_block_mask(mask, None, None, seqlen, seqlen, block_size=(BLOCK, BLOCK), device=q.device)
        return (q, k, v), lambda: _portable(lambda: flashtile.attention(q, k, v, block_mask=bm))
    from torch.nn.attention.flex_attention import create_block_mask

    from flashtile.bench.flex import compiled_flex

    bm = create_block_mask(flex_mask, None, None, seqlen, seqlen, device=q.device, BLOCK_SIZE=BLOCK)
    flex = compiled_flex()
    leaves = tuple(x.detach().transpose(1, 2).contiguous().requires_grad_(True) for x in (q, k, v))
    return leaves, lambda: flex(*leaves, block_mask=bm).transpose(1, 2)


def _portable(fn):
    """fn() with FLASHTILE_GLUON_SPARSE=0 (launch.py reads it per call), the variable restored after."""
    old = os.environ.get("FLASHTILE_GLUON_SPARSE")
    os.environ["FLASHTILE_GLUON_SPARSE"] = "0"
    try:
        return fn()
    finally:
        if old is None:
            del os.environ["FLASHTILE_GLUON_SPARSE"]
        else:
            os.environ["FLASHTILE_GLUON_SPARSE"] = old


def run_sparse(args, names, device):
    """Records for every (seqlen, mask, provider, mode in fwd / fwd_bwd)."""
    dtype = DTYPES[args.dtype]
    head_dim = args.head_dims[0] if args.head_dims else 128
    heads = args.heads or max(1, (args.hidden or 2048) // head_dim)
    records = []
    for seqlen in args.sparse_seqlens:
        gen = torch.Generator().manual_seed(args.seed)
        q, k, v = (torch.randn(1, seqlen, heads, head_dim, generator=gen).to(device, dtype).requires_grad_()
                   for _ in range(3))
        dout = torch.randn_like(q)
        for spec in args.sparse_masks:
            mask, flex_mask = build(spec, seqlen, device, args.seed)
            density = flashtile.create_block_mask(mask, None, None, seqlen, seqlen, block_size=(BLOCK, BLOCK),
                                                  device=device).density()
            outputs = {}
            for name in names:
                for mode in ("fwd", "fwd_bwd"):
                    rec = dict(provider=name, mode=mode, mask=spec, batch=1, seqlen_q=seqlen, seqlen_k=seqlen,
                               heads_q=heads, heads_kv=heads, head_dim=head_dim, dtype=args.dtype, density=density,
                               ms=None, error=None, max_diff=None)
                    print(f"sparse {name} {spec} {mode} S{seqlen} ...", file=sys.stderr)
                    try:
                        leaves, fn = _prepare(name, q, k, v, mask, flex_mask, seqlen)
                        if mode == "fwd":
                            with torch.no_grad():
                                outputs[name] = fn()
                                rec["ms"] = bench_ms(fn, device, args.warmup, args.rep)
                        else:
                            step = lambda fn=fn, leaves=leaves: torch.autograd.grad(fn(), leaves, dout)  # noqa: E731
                            if name == "flashtile-sparse-portable":  # the backward reads the variable too
                                step = lambda step=step: _portable(step)  # noqa: E731
                            step()
                            rec["ms"] = bench_ms(step, device, args.warmup, args.rep)
                    except Exception as e:
                        rec["error"] = describe_error(e)
                        _release(device, collect=True)
                    records.append(rec)
            ours = outputs.get("flashtile-sparse")
            for rec in records[-2 * len(names):]:
                got = outputs.get(rec["provider"])
                if ours is not None and got is not None and rec["provider"] != "flashtile-dense":
                    rec["max_diff"] = (got.float() - ours.float()).abs().max().item()
            outputs = None
            _release(device)
    return annotate(records)


def annotate(records):
    """speedup (dense flashtile ms / ms) and, on flashtile-sparse(-portable) rows, flex ms / flashtile ms."""
    index = {(r["seqlen_q"], r["mask"], r["mode"], r["provider"]): r for r in records}
    for rec in records:
        key = (rec["seqlen_q"], rec["mask"], rec["mode"])
        dense, flex = index.get((*key, "flashtile-dense")), index.get((*key, "flex"))
        rec["speedup_vs_dense"] = dense["ms"] / rec["ms"] if dense and dense["ms"] and rec["ms"] else None
        rec["flex_over_flashtile"] = (flex["ms"] / rec["ms"] if rec["provider"].startswith("flashtile-sparse")
                                      and flex and flex["ms"] and rec["ms"] else None)
    return records


def format_table(records):
    header = ("mask", "S", "mode", "provider", "density", "ms", "speedup vs dense", "flex / flashtile",
              "max diff vs sparse", "error")
    rows = [(r["mask"], r["seqlen_q"], r["mode"], r["provider"], _fmt(r["density"], ".3f"), _fmt(r["ms"], ".3f"),
             _fmt(r["speedup_vs_dense"], ".2f"), _fmt(r["flex_over_flashtile"], ".2f"), _fmt(r["max_diff"], ".1e"),
             (r["error"] or "")[:60]) for r in records]
    return ("== sparse (block masks of 128 x 128; dense = flash_attn_func without a mask) ==\n"
            + _render(header, rows))
