# Kernel time (torch.profiler) vs API time (do_bench) for narrow windows and 512-token calls, plus tile variants.
import torch, triton, torch.nn.functional as F
from torch.profiler import profile, ProfilerActivity
from torch.nn.attention import SDPBackend, sdpa_kernel
import flashtile
from flashtile import configs
from flashtile.configs import TileConfig as T

def kernel_us(f, n=20):
    try:
        return _kernel_us(f, n)
    except Exception as exc:
        return float("nan"), repr(exc)[:120]

def _kernel_us(f, n):
    for _ in range(3): f()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(n): f()
        torch.cuda.synchronize()
    evs = [e for e in p.key_averages() if e.device_type.name == "CUDA"]
    tot = sum(e.device_time_total for e in evs) / n
    names = ", ".join(f"{e.key[:40]}:{e.device_time_total / n:.0f}" for e in sorted(evs, key=lambda e: -e.device_time_total)[:3])
    return tot, names

for (B, S, H, D), kws in (((2, 8192, 16, 128), [{}, dict(window_size=(256, 0)), dict(window_size=(1024, 0)), dict(causal=True)]),
                           ((32, 512, 16, 128), [{}, dict(causal=True)])):
    q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    for kw in kws:
        for cfg in (None, T(64, 64, 4, 3), T(128, 64, 8, 2), T(64, 128, 4, 2), T(128, 128, 8, 2)):
            if cfg is not None:
                configs._SM90_FWD[128] = cfg
            f = lambda: flashtile.flash_attn_func(q, k, v, **kw)
            tot, names = kernel_us(f)
            ms = triton.testing.do_bench(f, warmup=25, rep=100)
            print(f"B{B} S{S} {kw} cfg={cfg} api {ms * 1e3:.0f} us kernels {tot:.0f} us [{names}]", flush=True)
        configs._SM90_FWD[128] = T(128, 64, 8, 3)
        if "window_size" not in kw:
            qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                g = lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=kw.get("causal", False))
                tot, names = kernel_us(g)
                ms = triton.testing.do_bench(g, warmup=25, rep=100)
            print(f"B{B} S{S} {kw} cudnn api {ms * 1e3:.0f} us kernels {tot:.0f} us [{names}]", flush=True)
