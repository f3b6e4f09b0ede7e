"""CPU: the sink gradient as the preprocess computes it (delta from the bf16 output), error / the test rule's bound."""
import sys, torch
sys.path.insert(0, "tests"); sys.path.insert(0, "src")
import flashtile
from utils import make_qkv, max_err, ABS_FLOOR
dtype = torch.bfloat16
for seqlen in (1024, 1030, 520, 777):
  for causal in (False, True):
    for seed in range(3):
        q, k, v = make_qkv(2, seqlen, seqlen, 4, 2, 64, dtype, "cpu", seed=seed)
        sink = torch.tensor([0.5, -1.0, 2.0, 8.0], requires_grad=True)
        dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(1)).to(dtype=dtype)
        res = []
        for upcast in (True, False):
            ls = [x.detach().clone().requires_grad_() for x in (q, k, v, sink)]
            ref = flashtile.attention_ref(*ls[:3], causal=causal, upcast=upcast, sink=ls[3])
            res.append((ref, torch.autograd.grad(ref, ls, dout.to(ref.dtype))[3]))
        (o64, ds64), (_, dslow) = res
        # lse in float64 of the reference (sink included)
        scale = 64 ** -0.5
        kk = k.double().repeat_interleave(2, dim=2); s = torch.einsum("bqhd,bkhd->bhqk", q.double(), kk) * scale
        if causal:
            s = s.masked_fill(torch.ones(seqlen, seqlen, dtype=torch.bool).triu(1), float("-inf"))
        lse = torch.logaddexp(torch.logsumexp(s, -1), sink.double()[None, :, None])
        o_bf = o64.to(dtype).float()
        delta = (o_bf * dout.float()).sum(-1).transpose(1, 2)  # (B, H, S) fp32
        ds_sim = -(torch.exp(sink.double()[None, :, None] - lse.float().double()) * delta.double()).sum((0, 2))
        bound = 2 * max_err(dslow, ds64) + max_err(ds64.to(dtype), ds64) + ABS_FLOOR[dtype]
        print(f"S{seqlen} c{int(causal)} seed{seed}: dsink {ds64.tolist()} sim err {max_err(ds_sim, ds64):.4f} "
              f"torch-bf16 err {max_err(dslow, ds64):.4f} bound {bound:.4f} ratio {max_err(ds_sim, ds64) / bound:.2f}",
              flush=True)
