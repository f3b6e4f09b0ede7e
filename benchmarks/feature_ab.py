"""The cost of one feature (time with it / time without) for the flashtile whose src/ is first on PYTHONPATH.

Same shapes as the README's feature table (bf16, 16K tokens, hidden 2048: B = 16384 / S, H = 2048 / D), forward
and backward (through torch.autograd.grad), with and without the feature timed in turn in one process, `--repeats`
times, so the ratio sees the same clock. Compare source trees by running it once per tree, alternating:
    for c in A B; do mkdir -p bisect/$c && git archive $c src | tar -x -C bisect/$c; done
    # on the device (carry bisect):
    for r in 1 2; do for c in A B; do
        PYTHONPATH=bisect/$c/src python3 benchmarks/feature_ab.py $c dropout_p=0.1
    done; done
The feature: NAME=VALUE flash_attn_func keywords, or one of the bench's --feature specs (softcap:30, alibi, bias,
sink, dropout:0.1, window:L:R; flashtile.bench.features.parse) with the tensors the feature table uses;
--head-dims / --seqlen pick the shapes.
"""
import argparse
import ast

import torch
import triton

import flashtile
from flashtile import flash_attn_func
from flashtile.bench.features import parse as parse_feature


def table_inputs(head_dims, seqlen):
    """(head_dim, causal, q, k, v) of the feature table's shapes for head_dims ("64,128") and seqlen, both masks:
    bf16, 16K tokens (B = 16384 / S), hidden 2048 (H = 2048 / D), q, k, v requiring grad."""
    for head_dim in map(int, head_dims.split(",")):
        for causal in (False, True):
            batch, heads = max(1, 16384 // seqlen), 2048 // head_dim
            yield (head_dim, causal, *(torch.randn(batch, seqlen, heads, head_dim, device="cuda",
                                                   dtype=torch.bfloat16, requires_grad=True) for _ in range(3)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tag")
    parser.add_argument("feature", nargs="+", help="NAME=VALUE keywords of flash_attn_func, or a bench feature spec")
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument("--seqlen", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--compile-only", action="store_true",
                        help="one call of each case (fills triton's cache: trees can compile side by side), no timing")
    args = parser.parse_args()
    features = ["bias" if arg == "attn_bias=bench" else arg for arg in args.feature]  # session 24 call 1's spelling
    extra = {name: ast.literal_eval(value) for name, value in (arg.split("=", 1) for arg in features if "=" in arg)}
    specs = [arg for arg in features if "=" not in arg]
    bench_feature = parse_feature("+".join(specs)) if specs else None
    if "causal" in extra:
        parser.error("causal is swept (both values); give only the feature's keywords")
    print(f"{args.tag}: flashtile from {flashtile.__file__}", flush=True)  # the tree PYTHONPATH picked
    seqlen = args.seqlen
    for head_dim, causal, q, k, v in table_inputs(args.head_dims, seqlen):
        heads = q.shape[2]
        kwargs_case = dict(extra)
        if bench_feature is not None:
            kwargs_case.update(bench_feature.kwargs(heads, q.device, seqlen, seqlen, q.dtype))
        if args.compile_only:
            for kwargs in ({}, kwargs_case):
                out = flash_attn_func(q, k, v, causal=causal, **kwargs)
                torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
            torch.cuda.synchronize()
            continue
        times = {}
        for repeat in range(args.repeats):
            settings = (("none", {}), ("feature", kwargs_case))
            for name, kwargs in settings[::-1] if repeat % 2 else settings:  # each goes first in turn
                fwd = triton.testing.do_bench(lambda: flash_attn_func(q, k, v, causal=causal, **kwargs),
                                              warmup=25, rep=100)
                out = flash_attn_func(q, k, v, causal=causal, **kwargs)
                grad = torch.randn_like(out)
                bwd = triton.testing.do_bench(
                    lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True), warmup=25, rep=100)
                times.setdefault(name, []).append((fwd, bwd))
        none_f, none_b = min(t[0] for t in times["none"]), min(t[1] for t in times["none"])
        feat_f, feat_b = min(t[0] for t in times["feature"]), min(t[1] for t in times["feature"])
        print(f"{args.tag} {' '.join(args.feature)} d{head_dim} causal={int(causal)} S={seqlen}: fwd "
              f"{none_f:.3f} -> {feat_f:.3f} ms ({feat_f / none_f:.3f}x)  bwd {none_b:.3f} -> {feat_b:.3f} ms "
              f"({feat_b / none_b:.3f}x)", flush=True)


if __name__ == "__main__":
    main()
