"""Random cases for tests/test_fuzz.py: a seed draws the shapes, layout (dense or varlen, contiguous or strided),
dtype and a combination of features (causal, window, softcap, ALiBi, sink, bias, dropout, scale, deterministic);
the case runs flash_attn_func or flash_attn_varlen_func (or their kv- / qkv-packed forms) forward and backward and
checks out, lse and every gradient against the float64 reference (DESIGN.md's tolerance rule), with dropout's mask
read from the returned S_dmask.
With fp16 / bf16 inputs the gradients are held to the float64 reference shifted by the deviation FlashAttention's
backward has by design and PyTorch's autograd has not (delta = rowsum(dO * O) from the stored, rounded O), computed in
float64 per case to first order (reference()), with an elementwise slack for that backward's fp32 sums and rounding
of dS where PyTorch's softmax backward cancels exactly (design_slack()); lse is held to 2x PyTorch's fp32 error
(assert_lse_rule).

Run more cases than the CI tier does (the GPU tier's campaign, or a reproduction of one id):
    FLASHTILE_FUZZ_CASES=400 [FLASHTILE_FUZZ_FIRST=0] python -m pytest -n 16 tests/test_fuzz.py
A case's id names everything it drew; its seed alone reproduces it (FLASHTILE_FUZZ_FIRST=seed, CASES=1)."""
import random
from dataclasses import dataclass

import torch

import flashtile
import fuzz_programmable
from flashtile import launch
from flashtile.reference import attention_ref
from test_varlen import cu as cu_seqlens
from test_varlen import paginate
from utils import FUZZ_GPU_ELEMENTS, assert_close_rule

# Shapes near the kernels' edges: one key / query, block multiples and one off them, the Gluon backward's 512 keys.
EDGE_LENGTHS = (1, 2, 63, 64, 65, 127, 128, 129, 255, 256, 257, 511, 512, 513, 1023, 1024, 1025)
CPU_ELEMENTS = 1 << 14  # the interpreter runs every program on the CPU


@dataclass(frozen=True)
class Case:
    seed: int
    varlen: bool
    seqlens_q: tuple  # one per sequence; dense: batch copies of seqlen_q
    seqlens_k: tuple
    heads_q: int
    heads_kv: int
    head_dim: int
    dtype: torch.dtype
    causal: bool = False
    window: tuple = (-1, -1)
    softcap: float = 0.0
    alibi: str = ""  # "", "h": slopes (H,), "bh": (B, H)
    sink: bool = False
    bias: tuple = ()  # () or (shape flags: which of (B, H, Sq, Sk) are broadcast, dtype, requires_grad)
    dropout_p: float = 0.0
    softmax_scale: float = None
    deterministic: bool = False
    backward: bool = True
    strided: bool = False
    plain_call: bool = False  # no return_attn_probs (the entry point's fast path); lse from a second call
    lse_grad: bool = False  # the loss takes lse too (its gradient flows into the backward)
    packed: str = ""  # "kv": k, v through the kv-packed entry point; "qkv": q, k, v through the qkv-packed one
    strided_grad: bool = False  # the output gradient a strided view (dims out of order, last stride 2)
    page_size: int = 0  # varlen through block_table: k, v in a paged cache of this page size (inference only)
    mods: tuple = ()  # flashtile.attention's case (fuzz_programmable.draw): (mask parts, and / or, score_mod, blocks)

    def name(self):
        parts = [f"s{self.seed}", "varlen" if self.varlen else "dense", f"b{len(self.seqlens_q)}"]
        if self.varlen:
            parts.append("q" + ".".join(map(str, self.seqlens_q)) + "-k" + ".".join(map(str, self.seqlens_k)))
        else:
            parts.append(f"q{self.seqlens_q[0]}-k{self.seqlens_k[0]}")
        parts += [f"h{self.heads_q}/{self.heads_kv}", f"d{self.head_dim}", str(self.dtype).split(".")[-1]]
        parts += [name for name, on in (("causal", self.causal), ("strided", self.strided),
                                        ("det", self.deterministic), ("fwd-only", not self.backward),
                                        ("plain-call", self.plain_call), ("lse-grad", self.lse_grad)) if on]
        parts += [f"{self.packed}packed"] if self.packed else []
        parts += ["strided-grad"] if self.strided_grad else []
        parts += [f"page{self.page_size}"] if self.page_size else []
        parts += fuzz_programmable.name_parts(self.mods) if self.mods else []
        parts += score_feature_parts(self.window, self.softcap, self.alibi, self.softmax_scale)
        if self.sink:
            parts.append("sink")
        if self.bias:
            flags, dtype, grad = self.bias
            dims = "".join(d if not f else "1" for d, f in zip("bhqk", flags))
            parts.append(f"bias-{dims}-{str(dtype).split('.')[-1]}{'-grad' if grad else ''}")
        if self.dropout_p:
            parts.append(f"drop{self.dropout_p:g}")
        return "-".join(parts)


def score_feature_parts(window, softcap, alibi, softmax_scale):
    """A case id's words for the score features both fuzz families draw."""
    parts = [] if window == (-1, -1) else [f"win{window[0]}_{window[1]}"]
    parts += [f"cap{softcap:g}"] if softcap else []
    parts += [f"alibi-{alibi}"] if alibi else []
    return parts + ([] if softmax_scale is None else [f"scale{softmax_scale:.3g}"])


def draw(seed, gpu):
    """The case of seed: GPU cases reach the Hopper kernels' shapes (head dims 64 / 128 / 256, bf16, >= 512 keys);
    CPU cases stay small and in fp16 / fp32 (the interpreter has no bf16 arithmetic)."""
    rng = random.Random(seed)
    chance = rng.random
    if gpu:
        dtype = rng.choices([torch.bfloat16, torch.float16, torch.float32], [45, 45, 10])[0]
        head_dim = rng.choice([64, 128, 256]) if chance() < 0.7 else rng.choice([8, 24, 40, 72, 96, 160, 192, 248])
    else:
        dtype = rng.choice([torch.float16, torch.float32])
        head_dim = rng.choice([8, 16, 24, 32, 40, 64])

    def length():
        if not gpu:
            return rng.randint(1, 8) if chance() < 0.3 else rng.randint(9, 90)
        roll = chance()
        if roll < 0.3:
            return rng.choice(EDGE_LENGTHS)
        return rng.randint(1, 64) if roll < 0.45 else rng.randint(65, 2300)

    varlen = chance() < 0.3
    batch = rng.randint(1, 5 if varlen else 3)
    heads_kv = rng.choice([1, 2, 3])
    heads_q = heads_kv * rng.choice([1, 1, 2, 4])
    if varlen:  # some sequences empty on either side (not all: empty tensors are refused, as in the dense call)
        seqlens_q = [0 if chance() < 0.1 else length() for _ in range(batch)]
        seqlens_k = [0 if chance() < 0.1 else length() for _ in range(batch)]
        for lens in (seqlens_q, seqlens_k):
            if not sum(lens):
                lens[0] = length()
    else:
        seqlen_q = length()
        seqlen_k = seqlen_q if chance() < 0.4 else length()
        seqlens_q, seqlens_k = [seqlen_q] * batch, [seqlen_k] * batch
    limit = FUZZ_GPU_ELEMENTS if gpu else CPU_ELEMENTS
    while batch * heads_q * max(max(seqlens_q), 1) * max(max(seqlens_k), 1) > limit:
        longer = seqlens_q if max(seqlens_q) >= max(seqlens_k) else seqlens_k
        longer[:] = [(n + 1) // 2 for n in longer]
    max_k = max(max(seqlens_k), 1)
    features = {}
    features["causal"] = chance() < 0.4
    if chance() < 0.25:
        side = lambda: rng.choice([-1, 0, rng.randint(1, max_k)])  # noqa: E731
        features["window"] = (side(), side())
    if chance() < 0.2:
        features["softcap"] = rng.choice([2.0, 10.0, 30.0, 50.0])
    if chance() < 0.2:
        features["alibi"] = rng.choice(["h", "bh"])
    features["sink"] = chance() < 0.15
    backward = chance() < 0.85
    if chance() < 0.2:
        flags = (chance() < 0.5, chance() < 0.5, chance() < 0.25, chance() < 0.1)
        bias_dtypes = [torch.float16, torch.float32] + ([torch.bfloat16] if gpu else [])
        bias_dtype = dtype if chance() < 0.6 else rng.choice(bias_dtypes)
        features["bias"] = (flags, bias_dtype, backward and chance() < 0.5)
    if chance() < 0.2:
        features["dropout_p"] = rng.choice([0.1, 0.25, 0.5, 0.9])
    if chance() < 0.2:
        features["softmax_scale"] = round(rng.uniform(0.05, 0.5), 4)
    features["deterministic"] = chance() < 0.15
    features["strided"] = chance() < 0.2
    features["plain_call"] = not features.get("dropout_p") and chance() < 0.3
    features["lse_grad"] = backward and not features["plain_call"] and chance() < 0.2
    # Drawn last, so every other seed keeps what earlier campaigns drew for it. qkv-packed needs q, k and v alike
    # (one cu_seqlens, one head count): some packed cases make them so (varlen lengths rarely come out equal);
    # packing makes its own strided views, so not with `strided`.
    if not features["strided"] and chance() < 0.25:
        if chance() < 0.3:
            seqlens_k, heads_kv = list(seqlens_q), heads_q
            while batch * heads_q * max(max(seqlens_q), 1) ** 2 > limit:
                seqlens_q = seqlens_k = [(n + 1) // 2 for n in seqlens_q]
        alike = seqlens_q == seqlens_k and heads_q == heads_kv
        features["packed"] = "qkv" if alike and chance() < 0.8 else "kv"
    features["strided_grad"] = backward and chance() < 0.2
    if features.get("softmax_scale") and chance() < 0.25:  # uniform (0), reversed or sharp (large logits) softmax
        features["softmax_scale"] = rng.choice([0.0, -features["softmax_scale"], round(4 / head_dim ** 0.5, 4)])
    paged_ok = varlen and not features.get("dropout_p") and not features.get("bias") and not features.get("packed")
    if paged_ok and chance() < 0.3:  # inference only: this seed's backward is dropped
        features["page_size"] = rng.choice([1, 16, 64, rng.randint(2, 40)]) if gpu else rng.randint(1, 16)
        backward = features["lse_grad"] = features["strided_grad"] = False
    return Case(seed, varlen, tuple(seqlens_q), tuple(seqlens_k), heads_q, heads_kv, head_dim, dtype,
                backward=backward, **features)


def _tensor(gen, shape, dtype, device, strided):
    """randn of shape; strided: a view whose dims other than the last are out of order in memory (unit last stride)."""
    if not strided:
        return torch.randn(shape, generator=gen).to(device=device, dtype=dtype)
    order = list(range(len(shape) - 1))[::-1] + [len(shape) - 1]  # store the leading dims reversed
    base = torch.randn([shape[i] for i in order], generator=gen).to(device=device, dtype=dtype)
    return base.permute([order.index(i) for i in range(len(shape))])


def inputs(case, device):
    """(q, k, v, dout, dlse or None, call keywords, leaves that take a gradient by name, cu_seqlens or None)."""
    gen = torch.Generator().manual_seed(case.seed)
    batch, max_q, max_k = len(case.seqlens_q), max(case.seqlens_q), max(case.seqlens_k)
    if case.varlen:
        shape_q, shape_k = (sum(case.seqlens_q), case.heads_q), (sum(case.seqlens_k), case.heads_kv)
    else:
        shape_q, shape_k = (batch, max_q, case.heads_q), (batch, max_k, case.heads_kv)
    q, k, v = (_tensor(gen, (*shape, case.head_dim), case.dtype, device, case.strided)
               for shape in (shape_q, shape_k, shape_k))
    if case.strided_grad:  # leading dims out of order, and every other element of a wider last dim
        dout = _tensor(gen, (*shape_q, 2 * case.head_dim), case.dtype, device, True)[..., ::2]
    else:
        dout = torch.randn((*shape_q, case.head_dim), generator=gen).to(device=device, dtype=case.dtype)
    lse_shape = (case.heads_q, shape_q[0]) if case.varlen else (batch, case.heads_q, max_q)
    dlse = torch.randn(lse_shape, generator=gen).to(device) if case.lse_grad else None
    leaves = {"q": q, "k": k, "v": v}
    kwargs = dict(dropout_p=case.dropout_p, softmax_scale=case.softmax_scale, causal=case.causal,
                  window_size=case.window, softcap=case.softcap, deterministic=case.deterministic,
                  return_attn_probs=not case.plain_call)
    if case.mods:  # flashtile.attention's keywords, and the reference's mask / score Mods
        kwargs, mods_ref = fuzz_programmable.materialize(case, device)
        kwargs["mods_ref"] = mods_ref
    if case.alibi:
        kwargs["alibi_slopes"] = (torch.rand((batch, case.heads_q) if case.alibi == "bh" else (case.heads_q,),
                                             generator=gen) * 0.5).to(device)
    if case.sink:
        leaves["sink"] = kwargs["sink"] = torch.randn(case.heads_q, generator=gen).to(device)
    if case.bias:
        flags, bias_dtype, grad = case.bias
        full = (batch, case.heads_q, max_q, max_k)
        bias = (2 * torch.randn([1 if f else n for f, n in zip(flags, full)], generator=gen)).to(device, bias_dtype)
        kwargs["attn_bias"] = bias
        if grad:
            leaves["attn_bias"] = bias
    for x in leaves.values():
        x.requires_grad_(case.backward)
    cu = [cu_seqlens(lens, device) for lens in (case.seqlens_q, case.seqlens_k)] if case.varlen else None
    return q, k, v, dout, dlse, kwargs, leaves, cu


def _loss_parts(out, lse, dout, dlse):
    """The outputs and output gradients of the case's loss: out . dout (+ lse . dlse)."""
    return ([out], [dout]) if dlse is None else ([out, lse], [dout, dlse])


def run(case, device):
    """flashtile's out, lse, S_dmask (None without dropout) and gradients by leaf name."""
    q, k, v, dout, dlse, kwargs, leaves, cu = inputs(case, device)

    if case.packed:  # the packed tensor a leaf in place of the tensors it holds (their gradients: its slices)
        held = ("q", "k", "v") if case.packed == "qkv" else ("k", "v")
        packed = torch.stack([leaves.pop(n).detach() for n in held], dim=-3).requires_grad_(case.backward)
        leaves = {case.packed: packed, **leaves}

    def call(**extra):
        torch.manual_seed(case.seed)
        args = dict(kwargs, **extra)
        lens = max(case.seqlens_q), max(case.seqlens_k)
        if case.packed == "qkv":
            if case.varlen:
                return flashtile.flash_attn_varlen_qkvpacked_func(packed, cu[0], lens[0], **args)
            return flashtile.flash_attn_qkvpacked_func(packed, **args)
        if case.packed == "kv":
            if case.varlen:
                return flashtile.flash_attn_varlen_kvpacked_func(q, packed, cu[0], cu[1], *lens, **args)
            return flashtile.flash_attn_kvpacked_func(q, packed, **args)
        if case.page_size:
            k_pages, table = paginate(k, case.seqlens_k, case.page_size, case.seed)
            v_pages, _ = paginate(v, case.seqlens_k, case.page_size, case.seed)
            return flashtile.flash_attn_varlen_func(q, k_pages, v_pages, cu[0], cu[1], *lens, block_table=table,
                                                    **args)
        if case.varlen:
            return flashtile.flash_attn_varlen_func(q, k, v, cu[0], cu[1], *lens, **args)
        return flashtile.flash_attn_func(q, k, v, **args)

    if case.mods:
        args = {name: arg for name, arg in kwargs.items() if name != "mods_ref"}
        out, lse = flashtile.attention(q, k, v, return_lse=True, **args)
        probs = None
    elif case.plain_call:
        out = call()
        with torch.no_grad():  # the same forward (deterministic) for lse
            _, lse, probs = call(return_attn_probs=True)
    else:
        out, lse, probs = call()
    grads = {}
    if case.backward:
        names = [n for n, x in leaves.items() if x.requires_grad]
        outputs, grad_outputs = _loss_parts(out, lse, dout, dlse)
        grads = dict(zip(names, torch.autograd.grad(outputs, [leaves[n] for n in names], grad_outputs)))
        if case.packed:
            grads.update(zip(held, grads.pop(case.packed).unbind(-3)))
    return out, lse, probs, grads


def reference(case, device, keep, dtype, got=None, backward=True):
    """attention_ref's out, lse and gradients for the case, computed in dtype (float64: the reference; the inputs'
    dtype: PyTorch's own low-precision computation; float32: the yardstick of lse); varlen: each sequence alone, with
    its slice of the bias, the slopes and the dropout mask (padded layouts).

    got (float64, fp16 / bf16 inputs): flashtile's out; then also, per gradient, the deviation FlashAttention's
    backward has by design, to first order: it takes delta_i = rowsum(dO * O) from the stored O, rounded to the
    inputs' dtype, where autograd takes rowsum(P * dP), so its dS = P * (dP - delta) is off by -P_ij d_i, d_i =
    rowsum(dO * (O_got - O)) (large where dP - delta cancels: one visible key, dropout's 1 / (1 - p) making O
    inexact, sums over rows such as the sink's or a broadcast bias's gradient). As d lse_i / d s_ij = P_ij (the sink
    included), that is the gradient of lse with output gradient -d. (O_got - O is the rounding to fp16 / bf16 there:
    the forward's own fp32 error is far below it. With fp32 inputs O is stored as computed, consistent with the P
    the backward recomputes, so there is no such term; none is added.)"""
    q, k, v, dout, dlse, kwargs, leaves, cu = inputs(case, device)
    if dtype != case.dtype:  # leaves in dtype too, so the gradients are not rounded back to the inputs' dtype
        cast = {name: x.detach().to(dtype).requires_grad_(x.requires_grad) for name, x in leaves.items()}
        q, k, v = cast["q"], cast["k"], cast["v"]
        kwargs.update((name, cast[name]) for name in ("sink", "attn_bias") if name in cast)
        if "attn_bias" in kwargs and "attn_bias" not in cast:
            kwargs["attn_bias"] = kwargs["attn_bias"].to(dtype)
        leaves = cast
    mask_ref, score_ref = kwargs.get("mods_ref", (None, None))
    features = dict(window_size=case.window, softcap=case.softcap, alibi_slopes=kwargs.get("alibi_slopes"),
                    sink=kwargs.get("sink"), attn_bias=kwargs.get("attn_bias"), dropout_p=case.dropout_p,
                    dropout_mask=keep, mask_mod=mask_ref, score_mod=score_ref)
    common = dict(causal=case.causal, softmax_scale=case.softmax_scale, upcast=dtype == torch.float64,
                  return_lse=True)
    if not case.varlen:
        out, lse = attention_ref(q, k, v, **common, **features)
    else:
        outs, lses = [], []
        for b, (sq, sk) in enumerate(zip(case.seqlens_q, case.seqlens_k)):
            seq = [x[cu[i][b]:cu[i][b + 1]][None] for x, i in ((q, 0), (k, 1), (v, 1))]
            per_seq = dict(features)
            for name in ("attn_bias", "dropout_mask"):
                per_seq[name] = _seq_slice(per_seq[name], b, sq, sk)
            if case.alibi == "bh":
                per_seq["alibi_slopes"] = per_seq["alibi_slopes"][b]
            out_b, lse_b = attention_ref(*seq, **common, **per_seq)
            outs.append(out_b[0])
            lses.append(lse_b[0])
        out, lse = torch.cat(outs), torch.cat(lses, dim=-1)  # [total_q, Hq, D], [Hq, total_q]
    grads, design = {}, {}
    if case.backward and backward:
        names = [n for n, x in leaves.items() if x.requires_grad]
        dlse = None if dlse is None else dlse.to(lse.dtype)
        outputs, grad_outputs = _loss_parts(out, lse, dout.to(out.dtype), dlse)
        grads = dict(zip(names, torch.autograd.grad(outputs, [leaves[n] for n in names], grad_outputs,
                                                    retain_graph=got is not None)))
        if got is not None:
            d = (dout.double() * (got.detach().double() - out.detach())).sum(-1)  # [B, Sq, Hq] / [total_q, Hq]
            d = d.transpose(-1, -2) if case.varlen else d.permute(0, 2, 1)  # lse's layout
            terms = torch.autograd.grad(lse, [leaves[n] for n in names], -d, allow_unused=True)
            design = {n: torch.zeros_like(grads[n]) if t is None else t for n, t in zip(names, terms)}
    lse = torch.nan_to_num(lse.detach(), nan=float("-inf"), posinf=float("inf"), neginf=float("-inf"))
    return out.detach(), lse, grads, design


# Unit roundoff of the inputs' dtype, where the kernels round dS before its two products (dq = dS K, dk = dS^T Q).
_ROUNDOFF = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8, torch.float32: 0.0}  # fp32: no shift, no term
# The error of the fp32 sums dP_ij = dO_i . V_j and delta_i = dO_i . O_i, in units of 2^-24 times the sum of the
# terms' magnitudes: an estimate, not a worst case (a D-term sum's is D units); tensor cores sum in blocks and may
# truncate, and fp32 inputs on NVIDIA GPUs take tf32x3's products, each within ~2^-22 of exact.
_FP32_SUM_UNITS = 4.0
# The roundings of a row's lse between the forward's online softmax and the backward's exponent (lse_rows).
_LSE_UNITS = 3.0


def _with_zero(case, q, k, v, slopes, bias, sink, mods_ref, dtype, **dropout):
    """(zero, out, lse) of attention_ref in dtype with a zero [B, H, Sq, Sk] added to the scores after every score
    feature and score_mod: d lse_i / d zero_ij is P_ij (the sink's share in the denominator), the loss's gradient
    there is dS_ij. dropout: attention_ref's dropout_p and dropout_mask, or none."""
    q, k, v = (x.detach().to(dtype) for x in (q, k, v))
    zero = torch.zeros(q.shape[0], q.shape[2], q.shape[1], k.shape[1], dtype=dtype, device=q.device,
                       requires_grad=True)
    mask_ref, score_ref = mods_ref

    def score_mod(score, b, h, q_idx, kv_idx):
        return (score if score_ref is None else score_ref(score, b, h, q_idx, kv_idx)) + zero[b, h, q_idx, kv_idx]
    out, lse = attention_ref(q, k, v, causal=case.causal, softmax_scale=case.softmax_scale, return_lse=True,
                             upcast=dtype == torch.float64, window_size=case.window, softcap=case.softcap,
                             alibi_slopes=slopes, sink=None if sink is None else sink.detach().to(dtype),
                             attn_bias=None if bias is None else bias.detach().to(dtype), score_mod=score_mod,
                             mask_mod=mask_ref, **dropout)
    return zero, out, lse


def _probs(case, q, k, v, slopes, bias, sink, mods_ref, dtype):
    """The undropped softmax probabilities [B, H, Sq, Sk] of one batch of equal-length sequences, computed in dtype
    (float64: the reference; the inputs' dtype: PyTorch's own), as d lse_i / d zero_ij (_with_zero)."""
    zero, _, lse = _with_zero(case, q, k, v, slopes, bias, sink, mods_ref, dtype)
    return torch.autograd.grad(lse, zero, torch.isfinite(lse).to(lse.dtype))[0].nan_to_num(0.0)


def _score_grad(case, q, k, v, dout, dlse, keep, slopes, bias, sink, mods_ref):
    """(P, dS, lse) in float64 of one batch of equal-length sequences, from one _with_zero graph: P the undropped
    probabilities (as _probs: lse does not see dropout), dS [B, H, Sq, Sk] the loss's gradient at the final scores
    (dropout's mask applied), lse [B, H, Sq] (0 for rows that see no key)."""
    dropout = dict(dropout_p=case.dropout_p, dropout_mask=keep) if keep is not None else {}
    zero, out, lse = _with_zero(case, q, k, v, slopes, bias, sink, mods_ref, torch.float64, **dropout)
    probs = torch.autograd.grad(lse, zero, torch.isfinite(lse).to(lse.dtype), retain_graph=True)[0]
    outputs, grad_outputs = _loss_parts(out, lse, dout.double(), None if dlse is None else dlse.double())
    ds = torch.autograd.grad(outputs, zero, grad_outputs)[0]
    return probs.nan_to_num(0.0), ds.nan_to_num(0.0), torch.nan_to_num(lse.detach(), nan=0.0, posinf=0.0, neginf=0.0)


def _slack_one(case, q, k, v, dout, dlse, out_got, out64, keep, slopes, bias, sink, mods_ref=(None, None)):
    """design_slack for one batch of equal-length sequences (dense: the whole batch; varlen: one sequence)."""
    probs, ds, lse = _score_grad(case, q, k, v, dout, dlse, keep, slopes, bias, sink, mods_ref)
    q, k, v, dout, out_got, out64 = (x.detach().double() for x in (q, k, v, dout, out_got, out64))
    group = q.shape[2] // k.shape[2]
    k_exp, v_exp = (x.repeat_interleave(group, dim=2) for x in (k, v))
    units = _FP32_SUM_UNITS * 2.0 ** -24
    # Errors of dS_ij = P_ij (dP_ij - delta_i) independent from key to key: dP's sum and dS's rounding (of the
    # shift's part; PyTorch rounds the rest too), and the one delta_i's sum carries into the whole row.
    dp_sum = torch.einsum("bqhd,bkhd->bhqk", dout.abs(), v_exp.abs())
    p_used = probs  # the probabilities dV takes: dropout's kept ones, rescaled
    if keep is not None:
        dp_sum = dp_sum * keep.double() / (1.0 - case.dropout_p)
        p_used = probs * keep.double() / (1.0 - case.dropout_p)
    rounding = ((dout * (out_got - out64)).sum(-1).abs() * _ROUNDOFF[case.dtype]).transpose(1, 2)[..., None]
    each = probs * (units * dp_sum + rounding)
    row = (units * (dout.abs() * out_got.abs()).sum(-1)).transpose(1, 2)[..., None]  # [B, H, Sq, 1]
    bias_row_summed = probs * row  # a bias gradient summed over keys: sum_j dS_ij cancels in every row
    if case.dtype == torch.float32:  # PyTorch's fp32 sums err as much but where a row sees one key (exactly 0)
        one_key = (probs >= 1.0 - 1e-9).any(-1, keepdim=True)  # (any: a sequence may have no key)
        each, row = each * one_key, row * one_key
    # The backward's P_ij = exp(s_ij - lse_i) with lse_i in fp32: one relative error per row, lse_rows (below); a
    # bias gradient summed over keys takes the row's sum (spread over its keys, which sum_to_size adds up again).
    lse_err = lse_rows(lse)[..., None]
    lse_ds = lse_err * ds.abs()
    lse_ds_summed = lse_err * ds.sum(-1, keepdim=True).abs() / ds.shape[-1]
    scale = abs(case.softmax_scale) if case.softmax_scale is not None else case.head_dim ** -0.5  # a bound: |scale|
    # Independent errors add in quadrature; the row's shared one linearly along the row (each term's softcap factor
    # 1 - t^2 is <= 1, hence |K|; so is every fuzz score_mod's derivative, which the lse terms' |dS| leaves out too).
    dq = scale * (torch.einsum("bhqk,bkhd->bqhd", each ** 2, k_exp ** 2).sqrt()
                  + row.transpose(1, 2) * torch.einsum("bhqk,bkhd->bqhd", probs, k_exp.abs()))
    dk = torch.einsum("bhqk,bqhd->bkhd", each ** 2 + (probs * row) ** 2 + lse_ds ** 2, q ** 2)
    dk = scale * dk.unflatten(2, (k.shape[2], group)).sum(3).sqrt()
    dv = torch.einsum("bhqk,bqhd->bkhd", (lse_rows(lse)[..., None] * p_used) ** 2, dout ** 2)
    dv = dv.unflatten(2, (k.shape[2], group)).sum(3).sqrt()
    # The sink's term takes no lse part: lse_i >= sink, so a row whose |lse| is large has a negligible P_sink.
    p_sink = (1.0 - probs.sum(-1, keepdim=True)).clamp(min=0.0)
    dsink = ((p_sink * row) ** 2).sum((0, 2, 3))
    return dict(q=dq, k=dk, v=dv, sink=dsink, bias_each=each ** 2, bias_row=probs * row,
                bias_row_summed=bias_row_summed + lse_ds_summed.expand_as(ds), bias_lse_each=lse_ds ** 2)


def lse_rows(lse):
    """The relative error of a row's probabilities that the backward's P = exp(s - lse) takes from lse rounded to
    fp32 (FlashAttention's design; PyTorch's softmax subtracts the row's max and keeps no lse): _LSE_UNITS fp32
    units of |lse| (the forward's lse in log2 units, its store in natural ones, the backward's conversion back;
    cpu.py rounds once; the Gluon backward's ROWS_IN_ACC variant rounds a fourth time, lse2 * fold_scale, where
    plain dense calls keep |lse| small). A bound: a simulation of the three roundings (the session 44 review) gives
    at most 2.1 units per row and 0.5 on average, so in the quadrature sums (dk, dv, a bias) it over-covers, by up
    to ~2x the rule's bound where |lse| is large; 3 is what the H200 checked (docs/gpu-tests.md, session 44).
    Of the bound's size only where |lse| is large, e.g. scores with a large offset shared by the row."""
    return _LSE_UNITS * 2.0 ** -24 * lse.abs()


def _seq_slice(t, b, sq, sk):
    """Sequence b's part [1, H, sq, sk] of a padded (B or 1, H, max_q, max_k) tensor (a bias, a keep mask), or None."""
    return None if t is None else t[b if t.shape[0] > 1 else 0][None, :, :sq, :sk]


def _padded(case, pieces, dtype, device):
    """Per-sequence [H, sq, sk] pieces in the padded (B, H, max_q, max_k) layout, zero past each sequence."""
    grid = torch.zeros(len(case.seqlens_q), case.heads_q, max(case.seqlens_q), max(case.seqlens_k), dtype=dtype,
                       device=device)
    for b, (sq, sk) in enumerate(zip(case.seqlens_q, case.seqlens_k)):
        grid[b, :, :sq, :sk] = pieces[b]
    return grid


def reference_probs(case, device, dtype):
    """_probs in S_dmask's layout: (B, H, Sq, Sk); varlen: (B, H, max_q, max_k), zero past each sequence."""
    q, k, v, _, _, kwargs, _, cu = inputs(case, device)
    slopes, bias, sink = kwargs.get("alibi_slopes"), kwargs.get("attn_bias"), kwargs.get("sink")
    mods_ref = kwargs.get("mods_ref", (None, None))
    if not case.varlen:
        return _probs(case, q, k, v, slopes, bias, sink, mods_ref, dtype)
    pieces = []
    for b, (sq, sk) in enumerate(zip(case.seqlens_q, case.seqlens_k)):
        rows, cols = slice(cu[0][b], cu[0][b + 1]), slice(cu[1][b], cu[1][b + 1])
        pieces.append(_probs(case, q[rows][None], k[cols][None], v[cols][None],
                             slopes[b] if case.alibi == "bh" else slopes, _seq_slice(bias, b, sq, sk), sink,
                             mods_ref, dtype)[0])
    return _padded(case, pieces, dtype, device)


def design_slack(case, device, keep, got, out64, lse64, grads64):
    """Per gradient, an elementwise estimate of what FlashAttention's backward deviates from the float64 reference
    beyond reference()'s shift, by design: dS_ij = P_ij (dP_ij - delta_i) from two fp32 sums (dO_i . V_j in the tensor
    cores, delta_i = dO_i . O_i) that cancel exactly in PyTorch's softmax backward where a row sees one key, and dS
    rounded to the inputs' dtype with the shift's part -P_ij d_i in it (d_i as in reference()). Each sum's error is
    _FP32_SUM_UNITS fp32 units of its terms' magnitudes; errors independent of each other (from key to key, from row
    to row) add in quadrature through dq = scale dS K, dk = scale dS^T Q, the bias's gradient (dS) and the sink's
    (-sum_i P_sink,i delta_i); delta_i's error, shared by its row, adds linearly along it. dV takes no dS.
    fp16 / bf16: everywhere (0.03-0.4 % of the rule's bound in ordinary cases, so no cover for a real error). fp32,
    where it would be of the bound's size (PyTorch's fp32 sums err alike): only rows that see one key, where PyTorch
    gets 0 exactly, and a bias gradient summed over keys (sum_j dS_ij, in which delta cancels).
    Every dtype: the backward recomputes P_ij = exp(s_ij - lse_i) from lse_i in fp32, one relative error per row
    (lse_rows: 3 |lse_i| 2^-24) where PyTorch's softmax has none; it scales the row's contributions to every gradient:
    dq_i by exactly that factor (lse64, grads64: the reference's), dk / dv / the bias's from rows independently.
    Under an fp32 bound only where |lse| is large (H200 seeds 269, 294 of the programmable family: an ALiBi score_mod
    not aligned bottom-right, lse ~ -600; seed 246: a bias broadcast over batch and queries). The sink's term does
    not take it."""
    q, k, v, dout, dlse, kwargs, leaves, cu = inputs(case, device)
    slopes, bias, sink = kwargs.get("alibi_slopes"), kwargs.get("attn_bias"), kwargs.get("sink")
    if not case.varlen:
        parts = _slack_one(case, q, k, v, dout, dlse, got, out64, keep, slopes, bias, sink,
                           kwargs.get("mods_ref", (None, None)))
        row_err = lse_rows(lse64).nan_to_num(0.0, 0.0, 0.0).permute(0, 2, 1)  # [B, Sq, H]
    else:
        per_seq = []
        for b, (sq, sk) in enumerate(zip(case.seqlens_q, case.seqlens_k)):
            rows, cols = slice(cu[0][b], cu[0][b + 1]), slice(cu[1][b], cu[1][b + 1])
            slopes_b = slopes[b] if case.alibi == "bh" else slopes
            dlse_b = None if dlse is None else dlse[:, rows][None]
            per_seq.append(_slack_one(case, q[rows][None], k[cols][None], v[cols][None], dout[rows][None], dlse_b,
                                      got[rows][None], out64[rows][None], _seq_slice(keep, b, sq, sk), slopes_b,
                                      _seq_slice(bias, b, sq, sk), sink))
        parts = {n: torch.cat([p[n][0] for p in per_seq]) for n in ("q", "k", "v")}
        parts["sink"] = sum(p["sink"] for p in per_seq)
        row_err = lse_rows(lse64).nan_to_num(0.0, 0.0, 0.0).transpose(0, 1)  # [total_q, H]
        for name in ("bias_each", "bias_row", "bias_row_summed", "bias_lse_each"):  # the padded (B, H, max_q, max_k)
            parts[name] = _padded(case, [p[name][0] for p in per_seq], torch.float64, device)
    parts["sink"] = parts["sink"].sqrt()
    if "q" in grads64:  # the row's factor on dq_i, exactly
        parts["q"] = parts["q"] + row_err[..., None] * grads64["q"].abs()
    if "attn_bias" in leaves:  # dS summed over the bias's broadcast dims
        shape = leaves["attn_bias"].shape
        summed = shape[-1] == 1  # over keys: the lse term of the row's sum, in bias_row_summed
        row = parts["bias_row_summed" if summed else "bias_row"]
        each = parts["bias_each"] if summed else parts["bias_each"] + parts["bias_lse_each"]
        parts["attn_bias"] = each.sum_to_size(shape).sqrt() + row.sum_to_size(shape)
    return {n: parts[n] for n in leaves if leaves[n].requires_grad}


def assert_lse_rule(name, lse, lse64, lse32, slack=0.0):
    """lse (fp32 whatever the inputs: the kernels' scores are fp32 sums of exact products) against float64: -inf
    exactly where the reference has it, elsewhere at most 2x the error of the same computation by PyTorch in fp32
    (the inputs cast to fp32) + 4 fp32 ulps of its magnitude + 1e-6 + slack (the GPU's approximate tanh)."""
    empty = torch.isinf(lse64)
    assert torch.equal(torch.isinf(lse) & (lse < 0), empty), f"{name}: -inf exactly for the rows that see no key"
    if bool(empty.all()):
        return
    got, ref, ref32 = lse[~empty].double(), lse64[~empty], lse32[~empty].double()
    err, err32 = (got - ref).abs().max().item(), (ref32 - ref).abs().max().item()
    floor = 4 * 2.0 ** -23 * max(1.0, ref.abs().max().item()) + 1e-6
    assert err <= 2 * err32 + floor + slack, (
        f"{name}: max error {err:.3g} > 2 x PyTorch fp32 error {err32:.3g} + floor {floor:.3g} + {slack:.3g}")


def tanh_slack(q, softcap):
    """The lse slack for softcap where the kernels take the GPU's tanh.approx.f32 (relative error ~2^-11, so a score
    moves by up to softcap * 2^-11; twice that)."""
    return softcap * 2.0 ** -10 if softcap and launch._approx_tanh(q) else 0.0


def check(case, device):
    out, lse, probs, grads = run(case, device)
    if case.deterministic and grads:  # deterministic=True: a second run's gradients bit for bit
        again = run(case, device)[3]
        for name, got in grads.items():
            assert torch.equal(got, again[name]), f"d{name}: deterministic=True, yet a second run differs"
    keep = None if probs is None else ~torch.signbit(probs)
    if case.dropout_p:  # S_dmask: the probabilities, the dropped ones negated
        assert probs is not None and probs.shape[-2:] == (max(case.seqlens_q), max(case.seqlens_k))
        assert_close_rule("S_dmask", probs.abs(), reference_probs(case, device, torch.float64),
                          reference_probs(case, device, case.dtype), case.dtype)
    rounded = case.dtype != torch.float32
    out64, lse64, grads64, design = reference(case, device, keep, torch.float64, got=out if rounded else None)
    out_low, lse_low, grads_low, _ = reference(case, device, keep, case.dtype)
    lse32 = reference(case, device, keep, torch.float32, backward=False)[1] if rounded else lse_low
    assert out.shape == out64.shape and out.dtype == case.dtype
    assert_close_rule("out", out, out64, out_low, case.dtype)
    assert lse.shape == lse64.shape and lse.dtype == torch.float32
    q = torch.empty(0, dtype=case.dtype, device=device)
    assert_lse_rule("lse", lse, lse64, lse32, tanh_slack(q, case.softcap))
    assert grads.keys() == grads64.keys()
    slack = design_slack(case, device, keep, out, out64, lse64, grads64) if grads else {}
    for name, got in grads.items():
        assert got.shape == grads64[name].shape, name
        assert_close_rule(f"d{name}", got, grads64[name], grads_low[name], got.dtype, design.get(name),
                          slack.get(name))
