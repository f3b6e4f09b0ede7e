"""The tolerance rule of DESIGN.md, and input makers shared by the tests."""
import torch

from flashtile.reference import attention_ref


ABS_FLOOR = {torch.float32: 1e-5, torch.float16: 1e-5, torch.bfloat16: 1e-4}


def max_err(x, ref):
    return (x.double() - ref.double()).abs().max().item()


def assert_close_rule(name, got, ref64, ref_lowp, dtype):
    """got's max error vs the float64 reference <= 2 x the plain low-precision PyTorch error + a floor.

    The floor is the error of merely rounding the reference to dtype (half an ulp at its magnitude)
    plus a small absolute term, so cases that are exact in PyTorch (dq = dk = 0 with a single key,
    where dP - delta cancels exactly) still pass when the kernel sums the same terms in another order:
    1e-5 for fp32 (the residue of a few dozen O(1) products), 1e-5 for fp16 and 1e-4 for bf16, far
    below one ulp at unit scale for the half types.
    """
    assert not torch.isnan(got).any(), f"{name}: NaN in output (unwritten elements are NaN-poisoned)"
    assert not torch.isinf(got).any(), f"{name}: Inf in output"
    err = max_err(got, ref64)
    err_lowp = max_err(ref_lowp, ref64)
    floor = max_err(ref64.to(dtype), ref64) + ABS_FLOOR[dtype]
    assert err <= 2 * err_lowp + floor, (
        f"{name}: max error {err:.3g} > 2 x PyTorch {dtype} error {err_lowp:.3g} + floor {floor:.3g}")


def make_qkv(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, device, requires_grad=True, seed=0):
    gen = torch.Generator().manual_seed(seed)
    shapes = ((batch, seqlen_q, heads_q, head_dim), (batch, seqlen_k, heads_kv, head_dim),
              (batch, seqlen_k, heads_kv, head_dim))
    return [torch.randn(s, generator=gen).to(dtype=dtype, device=device).requires_grad_(requires_grad)
            for s in shapes]


def references(q, k, v, dout, causal, softmax_scale=None, **features):
    """(out, dq, dk, dv) in float64, and the same computed by plain PyTorch in q's dtype.

    features: window_size, softcap, alibi_slopes, as flash_attn_func takes them.
    """
    results = []
    for upcast in (True, False):
        leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
        out = attention_ref(*leaves, causal=causal, softmax_scale=softmax_scale, upcast=upcast, **features)
        grads = torch.autograd.grad(out, leaves, dout.to(out.dtype))
        results.append((out.detach(), *grads))
    return results
