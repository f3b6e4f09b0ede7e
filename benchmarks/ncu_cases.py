"""One attention call run twice (the first compiles), for Nsight Compute to profile the second launch.

    ncu --clock-control none --section SpeedOfLight --section WarpStateStats -k regex:_attn_fwd \
        --launch-skip 1 --launch-count 1 python3 benchmarks/ncu_cases.py fwd-256-512-causal

CASE (shapes of the bench: bf16, 16K tokens, hidden 2048; decode: B64, 4K cache, Hq 32 / Hk 4, D 128):
- decode, decode-16, decode-256: flash_attn_with_kvcache over a contiguous cache or pages of 16 / 256 tokens;
- sdpa-decode: SDPA's default dispatch on the same cache, (B, H, S, D)-contiguous;
- fwd-D-S-causal / fwd-D-S-full: flash_attn_func's forward at head dim D, S tokens per sequence;
  bias-fwd-D-S-..., softcap-..., alibi-...: the same with a (1, H, S, S) bf16 bias, softcap 30 or ALiBi;
- sdpa-fwd-D-S-causal: SDPA's cuDNN backend on the same shape;
- bwd-D-S-causal / sdpa-bwd-D-S-causal: the same forward, then its backward (dO = 1), e.g. with the regex
  _attn_bwd_dkdv_hopper for flashtile's dK/dV kernel, bprop for cuDNN's;
- gluon-VARIANT-D-S-causal: one Gluon forward variant (gluon_variants.VARIANTS), e.g.
  gluon-persistent-sched4-256-512-causal.
ncu runs on the H200 machines (Firecracker; --clock-control none leaves the clocks alone, see the device notes).
Session 19's runs: benchmarks/results/ncu-h200-2026-11-30-s19."""
import sys

import torch
import torch.nn.functional as F

from flashtile import flash_attn_func, flash_attn_with_kvcache
from flashtile.bench.decode import paged

case = sys.argv[1]
gen = torch.Generator(device="cuda").manual_seed(0)
bf = dict(device="cuda", dtype=torch.bfloat16)
if case.startswith("decode") or case.startswith("sdpa-decode"):
    batch, cache_len = 64, 4096
    q = torch.randn(batch, 1, 32, 128, generator=gen, **bf)
    k, v = (torch.randn(batch, cache_len, 4, 128, generator=gen, **bf) for _ in range(2))
    if case.startswith("sdpa"):
        kt, vt, qt = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous(), q.transpose(1, 2)
        run = lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)  # noqa: E731
    else:
        page = int(case.split("-")[1]) if "-" in case else 0
        table = None
        if page:
            k, v, table = paged(k, v, cache_len, page, gen)
        run = lambda: flash_attn_with_kvcache(q, k, v, block_table=table, cache_seqlens=cache_len, causal=True)  # noqa
else:  # fwd-D-S-causal, sdpa-fwd-D-S-causal, FEATURE-fwd-D-S-causal
    parts = case.split("-")
    feature = parts.pop(0) if parts[0] in ("bias", "softcap", "alibi") else None  # bias-fwd-128-8192-full
    if feature and parts[0] not in ("fwd", "bwd"):
        sys.exit(f"{case}: a FEATURE- prefix goes with fwd- / bwd- cases (flash_attn_func)")
    sdpa = parts[0] == "sdpa"
    d, s, causal = int(parts[-3]), int(parts[-2]), parts[-1] == "causal"
    b, h = 16384 // s, 2048 // d
    backward = "bwd" in parts[:2]  # bwd-D-S-causal, sdpa-bwd-D-S-causal: forward then backward
    q, k, v = (torch.randn(b, s, h, d, generator=gen, **bf).requires_grad_(backward) for _ in range(3))
    extra = {}  # flash_attn_func's keywords for the FEATURE prefix
    if feature == "bias":
        extra = dict(attn_bias=torch.randn(1, h, s, s, generator=gen, **bf))
    elif feature == "softcap":
        extra = dict(softcap=30.0)
    elif feature == "alibi":
        extra = dict(alibi_slopes=torch.rand(h, generator=gen, device="cuda"))
    if parts[0] == "gluon":  # gluon-VARIANT-D-S-causal: one Gluon forward variant
        from flashtile import gluon_launch
        variant = "-".join(parts[1:-3])
        run = lambda: gluon_launch.gluon_forward(q, k, v, causal=causal, variant=variant)  # noqa: E731
    elif sdpa:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

        def run():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
    else:
        run = lambda: flash_attn_func(q, k, v, causal=causal, **extra)  # noqa: E731
    if backward:
        forward = run
        run = lambda: forward().backward(torch.ones_like(q) if not sdpa else torch.ones_like(qt))  # noqa: E731
for _ in range(2):
    run()
torch.cuda.synchronize()
