"""The Gluon kernels' grid order with a bias broadcast over the batch (GluonConfig / GluonBwdConfig.batch_inner):
forward and backward times of the default (batch-fastest grid: the batch's CTAs of one head and tile read each
bias box from HBM once between them) against "bias-batch-outer" (batch-slowest, the order before session 17),
with the plain call's time for the feature's cost, and a check that both orders give the same results.

    PYTHONPATH=src python3 benchmarks/bias_order.py [--head-dims 64,128] [--seqlen 8192] [--batch 2] [--heads 16]

Needs an sm90 GPU. Bias (1, H, S, S) bf16 as the bench's `bias` feature, and (B, H, S, S) (no broadcast: both
orders read the same bytes) as the control.
"""
import argparse

import torch
import triton

from flashtile import gluon_bwd_launch, gluon_launch


def _ms(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument("--seqlen", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--heads", type=int, default=16)
    args = parser.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    b, s, h = args.batch, args.seqlen, args.heads
    print(f"device {torch.cuda.get_device_name()}, triton {triton.__version__}; B{b} S{s} H{h} bf16")
    for d in (int(x) for x in args.head_dims.split(",")):
        q, k, v, dout = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=gen)
                         for _ in range(4))
        scale = d ** -0.5
        biases = {"(1,H)": torch.randn(1, h, s, s, device="cuda", generator=gen).to(torch.bfloat16),
                  "(B,H)": torch.randn(b, h, s, s, device="cuda", generator=gen).to(torch.bfloat16)}
        for causal in (False, True):
            tag = f"d{d} {'causal' if causal else 'full  '}"
            out, lse = gluon_launch.gluon_forward(q, k, v, scale, causal)
            plain_f = _ms(lambda: gluon_launch.gluon_forward(q, k, v, scale, causal))
            plain_b = _ms(lambda: gluon_bwd_launch.gluon_backward(dout, q, k, v, out, lse, scale, causal))
            print(f"{tag} plain            fwd {plain_f:7.3f} ms  bwd {plain_b:7.3f} ms")
            for name, bias in biases.items():
                res = {}
                for variant in ("default", "bias-batch-outer"):
                    o, lse_b = gluon_launch.gluon_forward(q, k, v, scale, causal, variant=variant, attn_bias=bias)
                    grads = gluon_bwd_launch.gluon_backward(dout, q, k, v, o, lse_b, scale, causal, variant=variant,
                                                            attn_bias=bias)
                    tf = _ms(lambda: gluon_launch.gluon_forward(q, k, v, scale, causal, variant=variant,
                                                                attn_bias=bias))
                    tb = _ms(lambda: gluon_bwd_launch.gluon_backward(dout, q, k, v, o, lse_b, scale, causal,
                                                                     variant=variant, attn_bias=bias))
                    res[variant] = (o, grads)
                    print(f"{tag} bias {name} {variant:<16} fwd {tf:7.3f} ms ({tf / plain_f:.2f}x plain)  "
                          f"bwd {tb:7.3f} ms ({tb / plain_b:.2f}x plain)")
                (o1, g1), (o2, g2) = res["default"], res["bias-batch-outer"]
                same = torch.equal(o1, o2) and torch.equal(g1[1], g2[1]) and torch.equal(g1[2], g2[2])
                dq_err = (g1[0].float() - g2[0].float()).abs().max().item()  # dQ: reduce-adds in another order
                print(f"{tag} bias {name} orders agree: out / dk / dv bitwise {same}, dq max diff {dq_err:.1e}")


if __name__ == "__main__":
    main()
