"""fp32 (tf32x3 dots) before / after the two-level sums (kernels/common._dot_add): speed and accuracy, one version per
process (the version is whichever flashtile PYTHONPATH finds first).
    PYTHONPATH=<src>:tests python3 fp32_ab.py LABEL [warm]
warm: each speed shape's calls once, untimed (compiles, beside another job), and no accuracy rows.
Speed: B 2, 2048 tokens, H 1024 / D, forward and forward + backward ms (median of do_bench), causal 0 / 1.
Accuracy: B 1, H 2, long rows (8K queries and keys, and 1 query row block of 128 against 16K keys with dropout-free
sums), per tensor the max error against float64 and the ratio to DESIGN's bound (2 x PyTorch fp32's error + floor)."""
import sys

import torch
from triton.testing import do_bench

import flashtile
from flashtile.reference import attention_ref
from utils import ABS_FLOOR, max_err

label, warm = sys.argv[1], sys.argv[2:] == ["warm"]
print(label, flashtile.__file__, flush=True)
for d in (32, 64, 128, 256):
    for causal in (False, True):
        b, s, h = 2, 2048, 1024 // d
        q, k, v = (torch.randn(b, s, h, d, device="cuda", requires_grad=True) for _ in range(3))
        do = torch.randn_like(q)

        def step():
            return torch.autograd.grad(flashtile.flash_attn_func(q, k, v, causal=causal), (q, k, v), do)
        if warm:
            step()
            continue
        fwd = do_bench(lambda: flashtile.flash_attn_func(q, k, v, causal=causal))
        both = do_bench(step)
        print(f"{label} speed D{d} causal={int(causal)} fwd {fwd:.3f} ms fwd+bwd {both:.3f} ms", flush=True)
for sq, sk, d in () if warm else ((8192, 8192, 64), (8192, 8192, 128), (128, 16384, 256), (4096, 4096, 256)):
    torch.manual_seed(0)
    q = torch.randn(1, sq, 2, d, device="cuda", requires_grad=True)
    k, v = (torch.randn(1, sk, 2, d, device="cuda", requires_grad=True) for _ in range(2))
    do = torch.randn_like(q)
    got = [flashtile.flash_attn_func(q, k, v)]
    got += torch.autograd.grad(got[0], (q, k, v), do)
    refs = []
    for upcast in (True, False):
        leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
        out = attention_ref(*leaves, upcast=upcast)
        refs.append([out.detach(), *torch.autograd.grad(out, leaves, do.to(out.dtype))])
        del out, leaves
    parts = []
    for name, g, r64, r32 in zip(("out", "dq", "dk", "dv"), got, *refs):
        err, low = max_err(g, r64), max_err(r32, r64)
        parts.append(f"{name} {err:.3g} ({err / (2 * low + ABS_FLOOR[torch.float32]):.2f}x bound)")
    print(f"{label} accuracy q{sq} k{sk} D{d}: " + ", ".join(parts), flush=True)
    got = refs = None  # free the float64 tensors before the next shape
    torch.cuda.empty_cache()
