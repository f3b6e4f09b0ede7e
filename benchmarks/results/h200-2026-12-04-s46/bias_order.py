"""Session 46: the Gluon forward with a bias shared by the batch ((1, H, S, S) bf16), grid by head ("default") against
the batch fastest ("default-bb", GluonConfig.batch_fast_bias), interleaved rounds (A B, B A, ...), hidden 2048.
Also the plain forward (no bias) as the yardstick, and a check that both variants write the same bits.
    PYTHONPATH=src:benchmarks python3 benchmarks/results/h200-2026-12-04-s46/bias_order.py
(Run at 1681232; since 507f54c the batch-fast order is "default" and the order by head "default-bias-by-head".)"""
import functools
import statistics

import torch

from gluon_check_inputs import _ms, make_bias, make_inputs
from flashtile import gluon_launch

SHAPES = [(128, 2, 8192), (128, 4, 4096), (128, 8, 2048), (64, 2, 8192), (256, 2, 8192)]  # (D, B, S): 16K tokens
ROUNDS = 3
for head_dim, batch, seqlen in SHAPES:
    heads = 2048 // head_dim
    q, k, v = make_inputs(batch, seqlen, seqlen, heads, heads, head_dim, torch.bfloat16)
    bias = make_bias("h", "bf16", batch, heads, seqlen, seqlen)
    for causal in (False, True):
        fwd = functools.partial(gluon_launch.gluon_forward, q, k, v, head_dim ** -0.5, causal)
        rows = {"plain": functools.partial(fwd, variant="default"),
                "bias/default": functools.partial(fwd, attn_bias=bias, variant="default"),
                "bias/default-bb": functools.partial(fwd, attn_bias=bias, variant="default-bb")}
        a, b = rows["bias/default"](), rows["bias/default-bb"]()
        same = all(torch.equal(x, y) for x, y in zip(a, b))
        times = {name: [] for name in rows}
        for r in range(ROUNDS):
            for name in (list(rows) if r % 2 == 0 else list(rows)[::-1]):
                times[name].append(_ms(rows[name]))
        mean = {name: statistics.mean(t) for name, t in times.items()}
        print(f"d{head_dim} B{batch} S{seqlen} H{heads} {'causal' if causal else 'plain '} same bits {same}  "
              + "  ".join(f"{n} {mean[n]:.3f} ms ({' / '.join(f'{t:.3f}' for t in times[n])})" for n in rows)
              + f"  | bias/plain {mean['bias/default'] / mean['plain']:.3f}x -> "
              f"{mean['bias/default-bb'] / mean['plain']:.3f}x, "
              f"bb/default {mean['bias/default-bb'] / mean['bias/default']:.3f}", flush=True)
