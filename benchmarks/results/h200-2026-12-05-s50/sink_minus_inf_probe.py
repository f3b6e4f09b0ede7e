"""Session 50: does a sink of -inf (one head's sink turned off) give NaN where rows or whole key blocks see no key, on
the Hopper Gluon kernels (from 512 keys)? Head 0's sink is -inf: its out / lse must equal a call without a sink, and
nothing may be NaN. Prints one line per case. PYTHONPATH=src python3 sink_minus_inf_probe.py"""
import torch

import flashtile


def case(name, sq, sk, d, causal=False, window=(-1, -1), bias_rows=None, varlen=False):
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, s, 4, d, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
               for s in (sq, sk, sk))
    sink = torch.tensor([float("-inf"), 0.5, -1.0, 2.0], device="cuda", requires_grad=True)
    bias = None
    if bias_rows is not None:
        bias = torch.zeros(1, 4, sq, sk, device="cuda", dtype=torch.bfloat16)
        bias[..., :bias_rows, :] = float("-inf")
        bias[..., :sk // 2] = float("-inf")
    kw = dict(causal=causal, window_size=window, attn_bias=bias, return_attn_probs=True)
    if varlen:
        cu_q = torch.tensor([0, sq, 2 * sq], dtype=torch.int32, device="cuda")
        cu_k = torch.tensor([0, sk, 2 * sk], dtype=torch.int32, device="cuda")
        flat = [t.flatten(0, 1) for t in (q, k, v)]
        kw.pop("attn_bias")
        run = lambda s: flashtile.flash_attn_varlen_func(*flat, cu_q, cu_k, sq, sk, sink=s, **kw)
    else:
        run = lambda s: flashtile.flash_attn_func(q, k, v, sink=s, **kw)
    out, lse, _ = run(sink)
    plain, plain_lse, _ = run(None)
    o0, p0 = out[..., 0, :].float(), plain[..., 0, :].float()
    l0, pl0 = lse[..., 0, :] if not varlen else lse[0], plain_lse[..., 0, :] if not varlen else plain_lse[0]
    grads = torch.autograd.grad(out.float().square().sum() + lse[torch.isfinite(lse)].sum(), (q, k, v, sink))
    print(f"{name}: nan out {out.isnan().any().item()} nan lse {lse.isnan().any().item()} "
          f"head0 max|out - no sink| {(o0 - p0).abs().max().item():.3g} "
          f"head0 lse equal {torch.equal(l0, pl0)} (-inf rows {torch.isneginf(l0).sum().item()}) "
          f"nan grads {[g.isnan().any().item() for g in grads]} dsink {grads[3].tolist()}", flush=True)


for d in (64, 128):
    for args in (dict(name="causal q>k", sq=1536, sk=1024, causal=True),
                 dict(name="window 1024", sq=2048, sk=2048, window=(1024, 0)),
                 dict(name="bias -inf", sq=1024, sk=1024, bias_rows=8),
                 dict(name="varlen causal q>k", sq=1536, sk=1024, causal=True, varlen=True)):
        try:
            case(d=d, **{**args, "name": f"D{d} {args['name']}"})
        except Exception as e:  # noqa: BLE001 - a probe: report and go on
            print(f"D{d} {args['name']}: {type(e).__name__}: {str(e)[:200]}", flush=True)
