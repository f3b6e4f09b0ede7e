"""Session 26: which D64 sink backward goes wrong (test_sink_gradient_through_gluon[64-1030-full] failed in call 1).
Per (seqlen, causal, variant, sink): each gradient's max error / the test rule's bound (> 1 fails)."""
import os, sys
os.environ["FLASHTILE_POISON_OUTPUTS"] = "1"
import torch
import flashtile
from flashtile import configs
sys.path.insert(0, "tests")
from utils import make_qkv, max_err, ABS_FLOOR

dtype = torch.bfloat16
for seqlen in [int(s) for s in sys.argv[1].split(",")]:
    for causal in (False, True):
        for variant in sys.argv[2].split(","):
            for with_sink in (True, False):
                configs.GLUON_BWD_PLAIN[(64, causal)] = variant
                q, k, v = make_qkv(2, seqlen, seqlen, 4, 2, 64, dtype, "cuda")
                sink = torch.tensor([0.5, -1.0, 2.0, 8.0], device="cuda", requires_grad=True) if with_sink else None
                dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(1)).to(dtype=dtype, device="cuda")
                leaves = (q, k, v) + ((sink,) if with_sink else ())
                out = flashtile.flash_attn_func(q, k, v, causal=causal, sink=sink)
                grads = torch.autograd.grad(out, leaves, dout)
                refs = []
                for upcast in (True, False):
                    ls = [x.detach().clone().requires_grad_() for x in leaves]
                    ref = flashtile.attention_ref(*ls[:3], causal=causal, upcast=upcast, sink=ls[3] if with_sink else None)
                    refs.append(torch.autograd.grad(ref, ls, dout.to(ref.dtype)))
                msg = []
                for name, got, r64, rlow in zip(("dq", "dk", "dv", "dsink"), grads, *refs):
                    bad = torch.isnan(got).sum().item()
                    bound = 2 * max_err(rlow, r64) + max_err(r64.to(dtype), r64) + ABS_FLOOR[dtype]
                    e = max_err(got, r64)
                    where = ""
                    if e > bound and got.dim() == 4:
                        d = (got.double() - r64).abs()
                        idx = (d > bound).nonzero()
                        where = f" bad rows {idx[:, 1].unique().tolist()[:8]} heads {idx[:, 2].unique().tolist()} batch {idx[:, 0].unique().tolist()}"
                    msg.append(f"{name} {e / bound:.2f}{' NaN%d' % bad if bad else ''}{where}")
                print(f"S{seqlen} causal={int(causal)} {variant:16s} sink={int(with_sink)}: " + "  ".join(msg), flush=True)
