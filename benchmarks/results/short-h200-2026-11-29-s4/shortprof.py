# Forward kernel time of tile variants where rows see few keys: D64/D256 at 512 tokens, D128 at 1K and 2K.
import torch, triton
from torch.profiler import profile, ProfilerActivity
import flashtile
from flashtile import configs
from flashtile.configs import TileConfig as T

def kernel_us(f, n=20):
    for _ in range(3): f()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(n): f()
        torch.cuda.synchronize()
    return sum(e.device_time_total for e in p.key_averages() if e.device_type.name == "CUDA") / n

FWD = configs.fwd_config
CANDS = {64: [None, T(64, 64, 4, 3), T(64, 64, 4, 4), T(128, 64, 4, 2), T(64, 128, 4, 2)],
         128: [None, T(64, 64, 4, 3), T(64, 64, 4, 4), T(64, 32, 4, 3)],
         256: [None, T(64, 64, 4, 2), T(64, 32, 4, 3), T(64, 64, 8, 2), T(64, 32, 4, 2)]}
for D, S in ((64, 512), (256, 512), (128, 512), (128, 1024), (128, 2048), (64, 1024)):
    B, H = 16384 // S, 2048 // D
    q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    for causal in (False, True):
        for cfg in CANDS[D]:
            configs.fwd_config = FWD if cfg is None else (lambda *a, _c=cfg, **kw: _c)
            f = lambda: flashtile.flash_attn_func(q, k, v, causal=causal)
            try:
                us = kernel_us(f)
                print(f"D{D} S{S} causal={int(causal)} cfg={cfg or 'default'} kernel {us:.0f} us", flush=True)
            except Exception as exc:
                print(f"D{D} S{S} causal={int(causal)} cfg={cfg} error {str(exc)[:80]}", flush=True)
        configs.fwd_config = FWD
