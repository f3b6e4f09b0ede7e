"""benchmarks/gluon_check.py's inputs and reference forwards: q / k / v, score-feature specs (windows, softcap,
ALiBi, sinks, biases) as keywords, the portable and the dispatched forward, and the timer."""
import os

os.environ["FLASHTILE_GLUON"] = "0"  # the portable path, except where a check routes to Gluon

import torch  # noqa: E402
import triton  # noqa: E402

from flashtile import gluon_launch, launch  # noqa: E402
from gpu_check import alibi_slopes  # noqa: E402  (this folder)

LSE_ATOL, LSE_RTOL = 2e-3, 1e-4
DEVICE = "cuda"


def make_inputs(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, packed=False, seed=0):
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    if packed:  # q, k, v as views of one (B, S, 3, H, D) tensor: row stride 3 * H * D
        qkv = torch.randn(batch, seqlen_q, 3, heads_q, head_dim, generator=gen, device=DEVICE).to(dtype)
        return qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    return [torch.randn(b, s, h, head_dim, generator=gen, device=DEVICE).to(dtype)
            for b, s, h in ((batch, seqlen_q, heads_q), (batch, seqlen_k, heads_kv), (batch, seqlen_k, heads_kv))]


def triton_forward(q, k, v, scale, causal, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, sink=None,
                   attn_bias=None):
    """The portable Triton forward (FLASHTILE_GLUON=0 is set above), with flash-attn's window convention."""
    _, _, left, right = gluon_launch.mask_mode(causal, window_size)
    return launch._flash_attn_forward(q, k, v, scale, left, right, softcap, alibi_slopes, sink, attn_bias=attn_bias)


def dispatched_forward(q, k, v, scale, causal, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, sink=None,
                       attn_bias=None):
    """launch._flash_attn_forward with FLASHTILE_GLUON=1: the Gluon forward where gluon_supported allows, else the
    portable one (how a refused bias layout is served)."""
    os.environ["FLASHTILE_GLUON"] = "1"
    try:
        return triton_forward(q, k, v, scale, causal, window_size, softcap, alibi_slopes, sink, attn_bias)
    finally:
        os.environ["FLASHTILE_GLUON"] = "0"


BIAS_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def make_bias(layout, dtype, batch, heads_q, seqlen_q, seqlen_k, seed=2):
    """An additive bias N(0, 1) * 2 (dtype a BIAS_DTYPES key): layout 'h' (1, H, Sq, Sk), 'b' (B, 1, Sq, Sk), 'bh'
    (B, H, Sq, Sk), 'expanded' (1, 1, Sq, Sk) expanded to (B, H, Sq, Sk) (stride 0), 'q1' (1, H, 1, Sk) (Sq
    broadcast: refused by the Gluon forward); rows padded to a multiple of 8 keys (16-byte rows)."""
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    shape = {"h": (1, heads_q, seqlen_q), "b": (batch, 1, seqlen_q), "bh": (batch, heads_q, seqlen_q),
             "expanded": (1, 1, seqlen_q), "q1": (1, heads_q, 1)}[layout]
    padded = -(-seqlen_k // 8) * 8
    bias = (2 * torch.randn(*shape, padded, generator=gen, device=DEVICE)).to(BIAS_DTYPES[dtype])[..., :seqlen_k]
    return bias.expand(batch, heads_q, -1, -1) if layout == "expanded" else bias


def bias_refused(spec):
    """Whether gluon_supported must refuse spec's bias (kept on the portable kernel): fp32, or Sq broadcast."""
    return bool(spec.get("bias")) and (spec["bias"][1] == "fp32" or spec["bias"][0] == "q1")


def feature_args(spec, batch, heads_q, seqlen_q=0, seqlen_k=0):
    """gluon_forward / attention_ref keywords of a feature spec: window (left, right), softcap, alibi ('h' for
    (H,) slopes, 'bh' for (B, H)), sink (True: logits N(0, 1) * 2, seeded), bias ((layout, dtype): make_bias)."""
    args = dict(window_size=spec.get("window", (-1, -1)), softcap=spec.get("softcap", 0.0))
    if spec.get("alibi"):
        args["alibi_slopes"] = alibi_slopes(heads_q, batch if spec["alibi"] == "bh" else None)
    if spec.get("sink"):
        args["sink"] = 2 * torch.randn(heads_q, generator=torch.Generator(device=DEVICE).manual_seed(1),
                                       device=DEVICE)
    if spec.get("bias"):
        args["attn_bias"] = make_bias(*spec["bias"], batch, heads_q, seqlen_q, seqlen_k)
    return args


def describe(spec):
    parts = []
    if "window" in spec:
        parts.append(f"win{spec['window'][0]},{spec['window'][1]}")
    if spec.get("softcap"):
        parts.append(f"cap{spec['softcap']:g}")
    if spec.get("alibi"):
        parts.append(f"alibi-{spec['alibi']}")
    if spec.get("sink"):
        parts.append("sink")
    if spec.get("bias"):
        parts.append(f"bias-{spec['bias'][0]}-{spec['bias'][1]}")
    return "+".join(parts) or "plain"


def _ms(fn):
    with torch.no_grad():
        return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
