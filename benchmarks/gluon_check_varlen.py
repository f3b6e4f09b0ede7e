"""benchmarks/gluon_check.py's varlen phases: flash_attn_varlen_func's packed layout through the Gluon forward
(ragged descriptors) against each sequence run alone, the varlen backward on it, and varlen against dense time
(issue 5). Run through gluon_check.py (--skip-varlen / --bench-varlen)."""
import os

import torch

from flashtile import gluon_launch, launch
from flashtile.reference import attention_ref
from gluon_check_inputs import DEVICE, LSE_ATOL, LSE_RTOL, _ms, describe, feature_args  # (this folder)
from gpu_check import ABS_FLOOR, guarded, max_err, say


def cu_of(seqlens):
    return torch.tensor([0] + torch.tensor(seqlens).cumsum(0).tolist(), dtype=torch.int32, device=DEVICE)


def packed_inputs(seqlens_q, seqlens_k, heads_q, heads_kv, head_dim, dtype=torch.bfloat16, seed=0, pad_k=0):
    """Packed (total, H, D) q / k / v; pad_k extra key rows past the last sequence (filled by the caller)."""
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    make = lambda rows, heads: torch.randn(rows, heads, head_dim, generator=gen, device=DEVICE).to(dtype)  # noqa
    return make(sum(seqlens_q), heads_q), make(sum(seqlens_k) + pad_k, heads_kv), make(sum(seqlens_k) + pad_k,
                                                                                        heads_kv)


# (name, seqlens_q, seqlens_k, heads_q, heads_kv): 0 and 1, lengths off the key block, Sq > Sk, GQA / MQA.
VARLEN_CASES = [
    ("mixed", [1, 17, 0, 300, 129, 64, 1000], [5, 1, 9, 300, 200, 0, 1000], 4, 2),
    ("equal-1000x3", [1000] * 3, [1000] * 3, 8, 8),
    ("q-gt-k-mqa", [257, 130, 1, 128], [130, 257, 1, 127], 8, 1),
]


def check_varlen_case(case, head_dim, causal, poison=None, spec=None, variant="default"):
    """One varlen case against each sequence run alone (float64 reference); poison: None, "next" (inf in the
    values of every sequence after the first: sequence 0 must stay exact) or "tail" (inf in key / value rows
    past the last sequence, which a ragged box must not read); spec: score features (feature_args)."""
    name, lens_q, lens_k, heads_q, heads_kv = case
    dtype = torch.bfloat16
    spec = spec or {}
    feats = feature_args(spec, len(lens_q), heads_q, max(lens_q), max(lens_k))
    label = (f"d{head_dim} {'causal' if causal else 'full  '} varlen-{name:<14} B{len(lens_q)} maxq{max(lens_q)} "
             f"maxk{max(lens_k)} H{heads_q}/{heads_kv}{' poison-' + poison if poison else ''} {describe(spec)} "
             f"[{variant}]")
    q, k, v = packed_inputs(lens_q, lens_k, heads_q, heads_kv, head_dim, dtype, pad_k=64 if poison == "tail" else 0)
    cu_q, cu_k = cu_of(lens_q), cu_of(lens_k)
    if poison == "tail":
        k[sum(lens_k):], v[sum(lens_k):] = float("inf"), float("inf")
    if poison == "next":
        v[lens_k[0]:] = float("inf")
    varlen = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_k))
    if not gluon_launch.gluon_supported(q, k, v, causal=causal, **varlen, **feats):
        say(f"FAIL {label}: gluon_supported() is False")
        return False
    out, lse = gluon_launch.gluon_forward(q, k, v, head_dim ** -0.5, causal, variant=variant, **varlen, **feats)
    torch.cuda.synchronize()
    problems, worst = [], 0.0
    if lse.shape != (heads_q, q.shape[0]):
        problems.append(f"lse shape {tuple(lse.shape)}")
    for b, (sq, sk) in enumerate(zip(lens_q, lens_k)):
        if sq == 0 or (poison == "next" and b > 0):
            continue
        qs, ks = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        o, lz = out[qs], lse[:, qs]
        if torch.isnan(o).any() or torch.isinf(o).any() or torch.isnan(lz).any():
            problems.append(f"seq {b} (q{sq} k{sk}): non-finite out / NaN lse (NaN = unwritten)")
            continue
        seq_feats = dict(feats)
        if feats.get("alibi_slopes") is not None and feats["alibi_slopes"].dim() == 2:
            seq_feats["alibi_slopes"] = feats["alibi_slopes"][b]
        if feats.get("attn_bias") is not None:  # (B or 1, H or 1, max_q, max_k): positions within the sequence
            bias = feats["attn_bias"]
            seq_feats["attn_bias"] = bias[b if bias.shape[0] > 1 else 0][None, :, :sq, :sk]
        if sk == 0:
            empty_lse = feats["sink"][:, None] if feats.get("sink") is not None else float("-inf")
            if not (torch.all(o == 0) and torch.all(lz == empty_lse)):
                problems.append(f"seq {b} (k0): expected out 0 / lse -inf (the sink with one)")
            continue
        seq = [x[s][None] for x, s in ((q, qs), (k, ks), (v, ks))]
        ref, ref_lse = attention_ref(*seq, causal=causal, return_lse=True, **seq_feats)
        low = attention_ref(*seq, causal=causal, upcast=False, **seq_feats)
        # Rows without keys (causal, Sq > Sk): the reference's NaN rows are 0 / -inf in the kernels.
        ref, low = ref.nan_to_num(0.0), low.nan_to_num(0.0)
        ref_lse = torch.where(torch.isnan(ref_lse), float("-inf"), ref_lse)
        err, bound = max_err(o[None], ref), 2 * max_err(low, ref) + max_err(ref.to(dtype), ref) + ABS_FLOOR[dtype]
        worst = max(worst, err / bound)
        if not err <= bound:
            problems.append(f"seq {b} (q{sq} k{sk}): out err {err:.3g} > {bound:.3g}")
        finite = torch.isfinite(ref_lse[0])
        if not torch.equal(torch.isfinite(lz), finite):
            problems.append(f"seq {b}: lse -inf rows differ")
        elif finite.any():
            lse_err = max_err(lz[finite], ref_lse[0][finite])
            if not lse_err <= LSE_ATOL + LSE_RTOL * ref_lse[0][finite].abs().max().item():
                problems.append(f"seq {b}: lse err {lse_err:.3g}")
    say(f"{'FAIL' if problems else 'PASS'} {label}: {'; '.join(problems) or f'worst err / bound {worst:.2f}'}")
    return not problems


def check_varlen_backward(head_dim, causal):
    """flash_attn_varlen_func with FLASHTILE_GLUON=1 against FLASHTILE_GLUON=0 (the portable forward): the varlen
    backward on the Gluon forward's out / lse (Hq, total_q)."""
    import flashtile
    lens = [1000, 1, 0, 517, 128]
    q, k, v = [t.requires_grad_() for t in packed_inputs(lens, lens, 4, 2, head_dim)]
    cu = cu_of(lens)
    dout = torch.randn_like(q)
    results = []
    for choice in ("1", "0"):
        os.environ["FLASHTILE_GLUON"] = choice
        try:
            out = flashtile.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=causal)
            results.append((out, *torch.autograd.grad(out, (q, k, v), dout)))
        finally:
            os.environ["FLASHTILE_GLUON"] = "0"
    parts, ok = [], True
    for name, got, port in zip(("out", "dq", "dk", "dv"), *results):
        err = max_err(got, port)
        ok &= bool(torch.isfinite(got).all().item()) and err <= (2e-2 if name == "out" else 5e-2)
        parts.append(f"{name} {err:.2e}")
    say(f"{'PASS' if ok else 'FAIL'} d{head_dim} {'causal' if causal else 'full  '} varlen backward-on-gluon-fwd "
        f"vs portable: max diff {', '.join(parts)}")
    return ok


def phase_varlen():
    os.environ["FLASHTILE_POISON_OUTPUTS"] = "1"
    passed = failed = 0
    jobs = [(check_varlen_case, (case, d, c)) for d in (64, 128, 256) for c in (False, True) for case in VARLEN_CASES]
    jobs += [(check_varlen_case, (VARLEN_CASES[0], 128, c, p)) for c in (False, True) for p in ("next", "tail")]
    # Score features in varlen: windows leave rows without keys per sequence; ALiBi (B, H) slopes per sequence.
    jobs += [(check_varlen_case, (case, d, False, None, spec)) for case, d, spec in (
        (VARLEN_CASES[0], 128, dict(window=(64, 0), softcap=30.0, alibi="bh", sink=True)),
        (VARLEN_CASES[2], 128, dict(window=(100, 20), alibi="h")),
        (VARLEN_CASES[0], 64, dict(softcap=30.0, sink=True)))]
    jobs += [(check_varlen_case, (VARLEN_CASES[2], 256, True, None, dict(alibi="bh", sink=True)))]
    # A (B, H, max_q, max_k) bias in varlen: rows / keys at positions within each sequence.
    jobs += [(check_varlen_case, (case, 128, c, None, dict(bias=("bh", "bf16")))) for case, c in (
        (VARLEN_CASES[0], False), (VARLEN_CASES[2], True))]
    jobs += [(check_varlen_case, (VARLEN_CASES[0], 64, False, None, dict(bias=("h", "bf16"), softcap=30.0)))]
    jobs += [(check_varlen_backward, (128, c)) for c in (False, True)]
    for fn, job in jobs:
        ok = guarded(fn, *job, what=f"varlen {fn.__name__} {job[1:]}")
        passed, failed = passed + bool(ok), failed + (not ok)
    say(f"INFO correctness varlen: {passed} passed, {failed} failed")
    return failed == 0


def _varlen_flops(lens, heads, head_dim, causal):
    return sum(4 * heads * s * s * head_dim / (2 if causal else 1) for s in lens)


def phase_bench_varlen():
    """Issue 5: varlen prefill within 10 % of the dense kernel's TFLOP/s on the same tokens. 16K tokens, hidden
    2048, bf16: equal lengths S (B = 16K / S) as varlen Gluon, dense Gluon (B, S) and the portable varlen
    kernel; then a mixed batch (dense Gluon on its longest sequence alone for scale)."""
    os.environ.pop("FLASHTILE_POISON_OUTPUTS", None)
    mixed = [8192, 3000, 2048, 1500, 1024, 513, 100, 17, 1, 91]  # 16384 tokens
    for head_dim in (64, 128):
        heads = 2048 // head_dim
        for causal in (False, True):
            scale = head_dim ** -0.5
            for lens in ([2048] * 8, [8192] * 2, mixed):
                name = f"{len(lens)}x{lens[0]}" if len(set(lens)) == 1 else "mixed16K"
                q, k, v = packed_inputs(lens, lens, heads, heads, head_dim)
                cu = cu_of(lens)
                varlen = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(lens), max_seqlen_k=max(lens))
                flops = _varlen_flops(lens, heads, head_dim, causal)
                providers = {
                    "gluon-varlen": lambda: gluon_launch.gluon_forward(q, k, v, scale, causal, **varlen),
                    "triton-varlen": lambda: launch._flash_attn_forward(q, k, v, scale, -1, 0 if causal else -1, 0.0,
                                                                        None, None, cu, cu, max(lens), max(lens)),
                }
                if len(set(lens)) == 1:
                    qd, kd, vd = (t.view(len(lens), lens[0], heads, head_dim) for t in (q, k, v))
                    providers["gluon-dense"] = lambda: gluon_launch.gluon_forward(qd, kd, vd, scale, causal)
                results = {}
                for provider, fn in providers.items():
                    try:
                        results[provider] = flops / (_ms(fn) * 1e-3) / 1e12
                        say(f"TIME varlen d{head_dim} {'causal' if causal else 'full  '} {name:<9} {provider:<14} "
                            f"{results[provider]:6.1f} TFLOP/s")
                    except Exception as exc:  # noqa: BLE001
                        say(f"ERROR time varlen d{head_dim} causal={causal} {name} {provider}: "
                            f"{type(exc).__name__}: {exc}")
                g, d, t = (results.get(p, float("nan")) for p in ("gluon-varlen", "gluon-dense", "triton-varlen"))
                flag = "  BELOW 0.90" if g / d < 0.90 else ""
                say(f"INFO ratio varlen d{head_dim} {'causal' if causal else 'full  '} {name:<9} gluon-varlen / "
                    f"gluon-dense {g / d:.2f}x{flag}  gluon-varlen / triton-varlen {g / t:.2f}x")
