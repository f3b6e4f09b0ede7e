"""The script of call 7 (run as `PYTHONPATH=src python3 decode_host.py`): host time of an eager decode step."""
import cProfile
import io
import pstats
import time

import torch

import flashtile

B, L, Hq, Hk, D = 8, 4096, 32, 4, 128
q = torch.randn(B, 1, Hq, D, device='cuda', dtype=torch.bfloat16)
kc = torch.randn(B, L, Hk, D, device='cuda', dtype=torch.bfloat16)
vc = torch.randn_like(kc)
f = lambda: flashtile.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=L - 1, causal=True)  # noqa: E731
for _ in range(50):
    f()
torch.cuda.synchronize()
t = time.perf_counter()
for _ in range(500):
    f()
t1 = time.perf_counter()
torch.cuda.synchronize()
print('host us/call', (t1 - t) / 500 * 1e6)
pr = cProfile.Profile()
pr.enable()
for _ in range(300):
    f()
pr.disable()
torch.cuda.synchronize()
s = io.StringIO()
pstats.Stats(pr, stream=s).sort_stats('tottime').print_stats(25)
print(s.getvalue()[:6000])
s = io.StringIO()
pstats.Stats(pr, stream=s).sort_stats('cumulative').print_stats(30)
print(s.getvalue()[:6000])
