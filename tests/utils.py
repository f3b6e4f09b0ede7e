"""The tolerance rule of DESIGN.md, and input makers shared by the tests."""
import torch

from flashtile.reference import attention_ref


ABS_FLOOR = {torch.float32: 1e-5, torch.float16: 1e-5, torch.bfloat16: 1e-4}
# The random cross-checks' GPU cases: batch * heads_q * seqlen_q * seqlen_k at most (the float64 reference's scores).
FUZZ_GPU_ELEMENTS = 1 << 24


def max_err(x, ref):
    return (x.double() - ref.double()).abs().max().item()


def assert_close_rule(name, got, ref64, ref_lowp, dtype, shift=None, slack=None):
    """got's max error vs the float64 reference <= 2 x the plain low-precision PyTorch error + a floor. shift
    (float64, ref64's shape): a deviation from ref64 the algorithm has by design and PyTorch's computation has not,
    computed by the caller: got is held to ref64 + shift. slack (float64, ref64's shape): an elementwise bound of
    such a deviation that cannot be computed exactly (rounding the algorithm has where PyTorch's cancels), taken off
    each element's error before the max.

    The floor is the error of merely rounding the value got is held to (ref64, or ref64 + shift) to dtype (half an
    ulp at its magnitude: got is stored in dtype; where ref64 is 0 and the shift is not, only the shift's rounding
    can be asked for) plus a small absolute term, so cases that are exact in PyTorch (dq = dk = 0 with a single key,
    where dP - delta cancels exactly) still pass when the kernel sums the same terms in another order:
    1e-5 for fp32 (the residue of a few dozen O(1) products), 1e-5 for fp16 and 1e-4 for bf16, far
    below one ulp at unit scale for the half types.
    """
    assert not torch.isnan(got).any(), f"{name}: NaN in output (unwritten elements are NaN-poisoned)"
    assert not torch.isinf(got).any(), f"{name}: Inf in output"
    assert slack is None or bool((slack >= 0).all()), f"{name}: a negative slack (a bug in the caller's bound)"
    target = ref64 if shift is None else ref64 + shift
    diff = (got.double() - target).abs()
    err = (diff if slack is None else (diff - slack).clamp(min=0.0)).max().item()
    err_lowp = max_err(ref_lowp, ref64)
    floor = max_err(target.to(dtype), target) + ABS_FLOOR[dtype]
    assert err <= 2 * err_lowp + floor, (
        f"{name}: max error {err:.3g}{' (after the shift)' if shift is not None else ''}"
        f"{f' (beyond a slack of up to {slack.max().item():.3g})' if slack is not None else ''} > 2 x PyTorch {dtype} "
        f"error {err_lowp:.3g} + floor {floor:.3g}")


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


def check_rows_from_4(out, q, k, v, bias):
    """out = attention(q, k, v) with an additive bias (broadcast to (..., Sq, Sk)) whose rows 0-3 see no key, fp32:
    those rows' out and dq are 0; out, dq of the rows 4.. and dk, dv match the float64 reference of rows 4.. alone
    (rows 0-3 output 0 whatever q, k and v are, so they add nothing to dk / dv, and the reference's softmax of a row
    of -inf would be NaN)."""
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).to(out.device)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    assert torch.all(out[:, :4] == 0) and torch.all(dq[:, :4] == 0)
    refs = references(q[:, 4:], k, v, dout[:, 4:], False, attn_bias=bias[..., 4:, :])
    for name, got, r64, rlow in zip(("out", "dq", "dk", "dv"), (out[:, 4:], dq[:, 4:], dk, dv), *refs):
        assert_close_rule(name, got, r64, rlow, torch.float32)


def alibi_slopes(heads, batch=None, device="cuda"):
    """ALiBi slopes 2^(-8 (h + 1) / H) of shape (H,), or (B, H) with batch b's scaled by 1 + 0.1 b."""
    slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)], device=device)
    return slopes if batch is None else torch.stack([slopes * (1.0 + 0.1 * b) for b in range(batch)])


def assert_varlen_matches_each_sequence(out, lse, q, k, v, lens_q, lens_k, cu_q, cu_k, causal, **features):
    """A packed (varlen) forward's out (total_q, Hq, D) and lse (Hq, total_q) against the float64 reference of each
    sequence alone (DESIGN.md's rule for out, 2e-3 for lse); a sequence without keys must give 0 and lse -inf, and
    causal rows without keys (Sq > Sk) likewise, where the reference has NaN. features: attention_ref keywords that
    hold for every sequence (e.g. (H,) ALiBi slopes)."""
    for b, (sq, sk) in enumerate(zip(lens_q, lens_k)):
        qs, ks = slice(cu_q[b].item(), cu_q[b + 1].item()), slice(cu_k[b].item(), cu_k[b + 1].item())
        if sq == 0:
            continue
        if sk == 0:
            assert torch.all(out[qs] == 0) and torch.all(lse[:, qs] == float("-inf"))
            continue
        seq = [x[s][None] for x, s in ((q, qs), (k, ks), (v, ks))]
        ref, lse_ref = attention_ref(*seq, causal=causal, return_lse=True, **features)
        if causal and sq > sk:
            ref, lse_ref = ref.nan_to_num(0.0), torch.where(torch.isnan(lse_ref), float("-inf"), lse_ref)
        low = attention_ref(*seq, causal=causal, upcast=False, **features).nan_to_num(0.0)
        assert_close_rule(f"sequence {b} out", out[qs][None], ref, low, q.dtype)
        torch.testing.assert_close(lse[:, qs].double(), lse_ref[0], atol=2e-3, rtol=1e-4)


def record_calls(monkeypatch, module, name):
    """Wrap module.name (for the test's duration) so each call appends its keyword arguments to the returned list,
    then runs the original: which path a dispatch took, and with what."""
    calls = []
    original = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *args, **kwargs: calls.append(kwargs) or original(*args, **kwargs))
    return calls


def record_constexpr(monkeypatch, module, name, key):
    """Wrap module.name, a launch-arguments function returning (grid, args, constexprs, options), so each call
    appends constexprs.get(key, False) to the returned list: which kernel a launch compiled."""
    flags = []
    original = getattr(module, name)

    def launch_args(*args, **kwargs):
        got = original(*args, **kwargs)
        flags.append(got[2].get(key, False))
        return got

    monkeypatch.setattr(module, name, launch_args)
    return flags


def train_step(causal):
    """flash_attn_func forward and backward on a fixed CUDA input (B2 S1024 H8 D128 bf16, seed 0, dout of ones):
    (out, dq, dk, dv). The same call twice compares one path of the launch machinery with another."""
    import flashtile

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 1024, 8, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    out = flashtile.flash_attn_func(q, k, v, causal=causal)
    out.backward(torch.ones_like(out))
    return out, q.grad, k.grad, v.grad


def count_read_backs(monkeypatch, cache_name, item=lambda tensor, value: tensor):
    """A list that gets item(tensor, value) for every store into flashtile.checks' read-back cache cache_name
    ("_VALUES" or "_TABLE_MAX"): one per device read-back that was kept."""
    from flashtile import checks

    stores = []

    class CountingCache(type(getattr(checks, cache_name))):
        def __setitem__(self, tensor, value):
            stores.append(item(tensor, value))
            super().__setitem__(tensor, value)

    monkeypatch.setattr(checks, cache_name, CountingCache())
    return stores


def strided(t):
    """t's values in a view whose last dim has stride 2 (an index tensor sliced out of a wider one)."""
    view = torch.stack([t, torch.full_like(t, -7)], -1)[..., 0]
    assert view.stride(-1) == 2 and torch.equal(view, t)
    return view
