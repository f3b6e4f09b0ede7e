"""Session 46: the Gluon backward (dK/dV kernel) with a bias the batch shares ((1, H, S, S) bf16, no gradient), grid by
head ("default-bias-by-head") against the batch fastest ("default", GluonBwdConfig.batch_fast_bias), interleaved
rounds, hidden 2048, 16K tokens; the plain backward (no bias) as the yardstick; dk / dv compared bit for bit.
    PYTHONPATH=src:benchmarks python3 benchmarks/results/h200-2026-12-04-s46/bwd_bias_order.py"""
import functools
import statistics

import torch

from gluon_check_inputs import _ms, make_bias, make_inputs
from flashtile import gluon_bwd_launch, gluon_launch

SHAPES = [(128, 2, 8192), (128, 8, 2048), (64, 2, 8192)]  # (D, B, S)
ROUNDS = 3
for head_dim, batch, seqlen in SHAPES:
    heads = 2048 // head_dim
    q, k, v = make_inputs(batch, seqlen, seqlen, heads, heads, head_dim, torch.bfloat16)
    dout = torch.randn_like(q)
    bias = make_bias("h", "bf16", batch, heads, seqlen, seqlen)
    for causal in (False, True):
        out0, lse0 = gluon_launch.gluon_forward(q, k, v, head_dim ** -0.5, causal)
        out, lse = gluon_launch.gluon_forward(q, k, v, head_dim ** -0.5, causal, attn_bias=bias)
        bwd = functools.partial(gluon_bwd_launch.gluon_backward, dout, q, k, v, softmax_scale=head_dim ** -0.5,
                                causal=causal)
        rows = {"plain": functools.partial(bwd, out=out0, lse=lse0),
                "bias/by-head": functools.partial(bwd, out=out, lse=lse, attn_bias=bias,
                                                  variant="default-bias-by-head"),
                "bias/batch-fast": functools.partial(bwd, out=out, lse=lse, attn_bias=bias, variant="default")}
        a, b = rows["bias/by-head"](), rows["bias/batch-fast"]()
        same = torch.equal(a[1], b[1]) and torch.equal(a[2], b[2])
        times = {name: [] for name in rows}
        for r in range(ROUNDS):
            for name in (list(rows) if r % 2 == 0 else list(rows)[::-1]):
                times[name].append(_ms(rows[name]))
        mean = {name: statistics.mean(t) for name, t in times.items()}
        print(f"bwd d{head_dim} B{batch} S{seqlen} H{heads} {'causal' if causal else 'plain '} dk/dv same bits {same}  "
              + "  ".join(f"{n} {mean[n]:.3f} ms ({' / '.join(f'{t:.3f}' for t in times[n])})" for n in rows)
              + f"  | bias/plain {mean['bias/by-head'] / mean['plain']:.3f}x -> "
              f"{mean['bias/batch-fast'] / mean['plain']:.3f}x, "
              f"fast/by-head {mean['bias/batch-fast'] / mean['bias/by-head']:.3f}", flush=True)
