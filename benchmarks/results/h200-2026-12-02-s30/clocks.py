"""SM clock and board power while one attention forward runs back to back for a few seconds (nvidia-smi sampled
every 50 ms), with its TFLOP/s over the same window: does a kernel's sustained speed come with a lower clock?
    PYTHONPATH=src python3 bisect/s30/clocks.py [--seconds 4]"""
import argparse
import subprocess
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashtile import flash_attn_func, gluon_launch


def window(fn, seconds):
    """(start, end, ms per call) of fn run back to back for `seconds` after a 1 s warm-up."""
    t_end = time.time() + 1.0
    while time.time() < t_end:
        fn()
    torch.cuda.synchronize()
    start, calls = time.time(), 0
    ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ev0.record()
    while time.time() - start < seconds:
        for _ in range(10):
            fn()
        calls += 10
    ev1.record()
    torch.cuda.synchronize()
    return start, time.time(), ev0.elapsed_time(ev1) / calls


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=4.0)
    args = parser.parse_args()
    log = open("/tmp/smi.csv", "w")
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                            "-lms", "50"], stdout=subprocess.PIPE, text=True)
    samples = []

    import threading

    def reader():
        for line in smi.stdout:
            samples.append((time.time(), line.strip()))
            log.write(f"{time.time():.3f},{line}")
    threading.Thread(target=reader, daemon=True).start()
    gen = torch.Generator(device="cuda").manual_seed(0)
    cases = []
    for d, s, causal in ((128, 16384, False), (128, 16384, True), (128, 4096, False), (256, 16384, False)):
        b, h = 16384 // s, 2048 // d
        q, k, v = (torch.randn(b, s, h, d, generator=gen, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        flops = 4 * b * h * s * s * d / (2 if causal else 1)

        def cudnn(qt=qt, kt=kt, vt=vt, causal=causal):
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
        runs = [("flashtile", lambda q=q, k=k, v=v, causal=causal: flash_attn_func(q, k, v, causal=causal)),
                ("cudnn", cudnn)]
        if d == 128 and s == 4096:
            runs += [(name, lambda q=q, k=k, v=v, name=name: gluon_launch.gluon_forward(q, k, v, variant=name))
                     for name in ("persistent-tma-q2", "persistent-tma-q2-lr")]
        for name, fn in runs + runs[::-1]:  # each twice, in both orders
            start, end, ms = window(fn, args.seconds)
            cases.append((f"d{d} s{s} {'causal' if causal else 'full'} {name}", start, end, ms, flops))
            time.sleep(1.0)  # a pause between windows, as between separate calls
    smi.terminate()
    for label, start, end, ms, flops in cases:
        got = [tuple(map(float, line.split(","))) for t, line in samples if start + 0.5 <= t <= end and "," in line]
        clock = sum(c for c, _ in got) / max(len(got), 1)
        power = sum(p for _, p in got) / max(len(got), 1)
        print(f"{label:<40} {ms * 1e3:9.1f} us  {flops / ms / 1e9:6.0f} TFLOP/s  SM {clock:6.0f} MHz  "
              f"{power:5.0f} W  ({len(got)} samples)", flush=True)


if __name__ == "__main__":
    main()
