"""The sweep: shapes x providers x modes -> records, and the longest-sequence probe."""
import gc
import math
import sys
from dataclasses import asdict, dataclass, replace

import torch

from flashtile.bench.features import NONE, Feature, parse as parse_feature
from flashtile.bench.flops import attention_flops, tflops
from flashtile.bench.timing import bench_ms, free_bytes, peak_memory_mb

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
ACCURACY_ROWS = 1024


@dataclass(frozen=True)
class Shape:
    batch: int
    seqlen_q: int
    seqlen_k: int
    heads_q: int
    heads_kv: int
    head_dim: int
    causal: bool
    dtype: str
    features: str = NONE  # canonical --feature SPEC

    def label(self):
        causal = " causal" if self.causal else ""
        extra = "" if self.features == NONE else f" [{self.features}]"
        return (f"B{self.batch} S{self.seqlen_q}x{self.seqlen_k} H{self.heads_q}/{self.heads_kv} "
                f"D{self.head_dim}{causal}{extra}")


def make_shapes(cfg):
    """Every (head dim, causal, seqlen pair, feature) of the resolved config, in sweep order
    (features innermost, so one shape's settings run back to back on the same inputs)."""
    shapes = []
    for head_dim in cfg.head_dims:
        heads_q, heads_kv = cfg.heads_for(head_dim)
        for causal in cfg.causal:
            for seqlen_q, seqlen_k in zip(cfg.seqlens, cfg.seqlens_k):
                batch = cfg.batch or max(1, cfg.tokens // seqlen_q)
                for spec in getattr(cfg, "features", None) or [NONE]:
                    shapes.append(Shape(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, causal,
                                        cfg.dtype, spec))
    return shapes


def describe_error(exc):
    """One line for a record: exception type and the first line of its message."""
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0] if lines else ''}"
    return text[:200]


def make_inputs(shape, device, seed=0):
    """Random q (B, Sq, Hq, D), k, v (B, Sk, Hk, D), no grad (providers make their own leaves)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    dtype = DTYPES[shape.dtype]

    def randn(seqlen, heads):
        size = (shape.batch, seqlen, heads, shape.head_dim)
        return torch.randn(size, generator=gen, device=device, dtype=torch.float32).to(dtype)

    return (randn(shape.seqlen_q, shape.heads_q), randn(shape.seqlen_k, shape.heads_kv),
            randn(shape.seqlen_k, shape.heads_kv))


def max_error(out, q, k, v, causal, feature=Feature()):
    """Max abs error of out (B, Sq, Hq, D) vs the float64 reference on a slice.

    The slice is batch 0, one or two query heads with their KV heads, and the *last* rows queries:
    with bottom-right causal alignment, the last m queries against all keys are exactly what
    attention_ref computes for a query block of length m, so no extra provider call is needed
    (windows and ALiBi distances are bottom-right aligned too). ``feature``: a Feature.
    None with dropout (a random output).
    """
    from flashtile.reference import attention_ref

    if feature.dropout:
        return None
    group = q.shape[2] // k.shape[2]
    heads_q = min(group, 2) if group > 1 else min(q.shape[2], 2)
    heads_kv = 1 if group > 1 else heads_q
    rows = min(q.shape[1], ACCURACY_ROWS)
    extra = feature.kwargs(q.shape[2], q.device, q.shape[1], k.shape[1], q.dtype, rows)
    for name in ("alibi_slopes", "sink", "attn_bias"):  # the slice's heads (and the bias's last rows)
        if name in extra:
            extra[name] = extra[name].detach()[..., :heads_q, :, :] if name == "attn_bias" else \
                extra[name].detach()[:heads_q]
    ref = attention_ref(q[:1, -rows:, :heads_q], k[:1, :, :heads_kv], v[:1, :, :heads_kv], causal=causal, **extra)
    got = out[:1, -rows:, :heads_q].to(torch.float64)
    if not torch.isfinite(got).all():
        return float("nan")
    return (got - ref).abs().max().item()


def _release(device, collect=False):
    """Give cached GPU memory back so free-memory checks and peaks stay honest; ``collect`` after
    errors, whose tracebacks can keep tensors in reference cycles."""
    if collect:
        gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _mode_fn(prep, mode, dout):
    """The closure timed for ``mode``; bwd reuses one forward graph (retain_graph) so only backward is timed."""
    if mode == "fwd":
        return prep.fn
    if mode == "bwd":
        out = prep.fn()
        return lambda: torch.autograd.grad(out, prep.inputs, dout, retain_graph=True)
    return lambda: torch.autograd.grad(prep.fn(), prep.inputs, dout)


def _skip_reason(provider, shape, device):
    feature = parse_feature(shape.features)
    unsupported = provider.unsupported(feature)
    if unsupported:
        return f"skipped: {unsupported}"
    need = provider.predicted_bytes(shape.batch, shape.heads_q, shape.seqlen_q, shape.seqlen_k,
                                    DTYPES[shape.dtype].itemsize, feature)
    free = free_bytes(device) if need else None
    if need and free is not None and need > free:
        return f"skipped: would need {need / 1e9:.1f} GB ({free / 1e9:.1f} GB free)"
    return None


def measure(provider, shape, inputs, modes, device, warmup, rep):
    """Records (one per mode) for ``provider`` on ``shape``; failures become the record's error."""
    base = dict(provider=provider.name, **asdict(shape), ms=None, tflops=None, peak_mem_mb=None,
                max_err=None, error=None)
    records = {mode: dict(base, mode=mode) for mode in modes}
    error = _skip_reason(provider, shape, device)
    if error is not None:
        for rec in records.values():
            rec["error"] = error
        return list(records.values())
    q, k, v = inputs
    feature = parse_feature(shape.features)
    prep = None
    try:
        prep = provider.prepare(q, k, v, shape.causal, feature)
        with prep.context():
            out = prep.fn()  # compile / warm-up, and the output for the accuracy check
            detached, dout = out.detach(), torch.randn_like(out)
            del out  # frees the autograd graph (score-sized for standard) before the reference runs
            err = max_error(prep.to_bshd(detached), q, k, v, shape.causal, feature)
            del detached
            for mode, rec in records.items():
                if err is not None and math.isnan(err):
                    rec["error"] = "non-finite values in the output"
                else:
                    rec["max_err"] = err
                _time_mode(rec, prep, dout, shape, device, warmup, rep)
            mem = _peak_memory(prep, dout, device)
            for rec in records.values():
                rec["peak_mem_mb"] = mem
    except Exception as e:
        for rec in records.values():
            rec["error"] = describe_error(e)
        _release(device, collect=True)
    finally:
        del prep
        _release(device)
    return list(records.values())


def _time_mode(rec, prep, dout, shape, device, warmup, rep):
    mode = rec["mode"]
    try:
        fn = _mode_fn(prep, mode, dout)
        fn()
        rec["ms"] = bench_ms(fn, device, warmup, rep)
        flops = attention_flops(shape.batch, shape.heads_q, shape.seqlen_q, shape.seqlen_k, shape.head_dim,
                                shape.causal, mode, parse_feature(shape.features).window_size)
        rec["tflops"] = tflops(flops, rec["ms"])
    except Exception as e:  # OOM, unsupported head dim, ...: record it and go on
        rec["error"] = describe_error(e)
        _release(device, collect=True)
    finally:
        fn = None  # drops the retained graph of bwd mode before the next measurement
        _release(device)


def _peak_memory(prep, dout, device):
    """Peak MB of one fwd+bwd, or None when it fails (the failure is already in the bwd record)."""
    try:
        keep = (*prep.inputs, dout)
        return peak_memory_mb(lambda: torch.autograd.grad(prep.fn(), prep.inputs, dout), device, keep)
    except Exception:
        _release(device, collect=True)
        return None


def _progress(total):
    """A tqdm bar on stderr, or plain progress lines when tqdm is not installed."""
    try:
        from tqdm.auto import tqdm

        return tqdm(total=total, file=sys.stderr, unit="run", dynamic_ncols=True)
    except ImportError:
        return _PlainProgress(total)


class _PlainProgress:
    def __init__(self, total):
        self.total, self.n = total, 0

    def set_postfix_str(self, text):
        print(f"[{self.n + 1}/{self.total}] {text}", file=sys.stderr, flush=True)

    def update(self, n=1):
        self.n += n

    def close(self):
        pass


def _compile_pass(shapes, providers, modes, device, seed):
    """One call of every provider on every shape (with its backward where a mode times it) before any timing, on
    CUDA: compiles, launch plans and tile lists are made here. In sessions 14-15 the first shape timed after a
    kernel's compile measured 0.4-0.8x its speed in other runs: calls host-bound at 512 keys, whose host time per
    call right after a compile was up to 1.7x the same call's later in the process (benchmarks/host_time.py, pass
    1 against pass 2; cuDNN's too). 100 ms of calls before each timing did not help. Failures are left to
    measure(), which records them."""
    if device.type != "cuda":
        return
    backward = any(mode != "fwd" for mode in modes)
    print(f"compiling: one call of {len(providers)} provider(s) on {len(shapes)} shape(s) before the timings",
          file=sys.stderr, flush=True)
    for i, shape in enumerate(shapes):
        inputs = make_inputs(shape, device, seed=seed + i)
        for provider in providers:
            if _skip_reason(provider, shape, device) is not None:
                continue
            try:
                prep = provider.prepare(*inputs, shape.causal, parse_feature(shape.features))
                with prep.context():
                    out = prep.fn()
                    if backward:
                        torch.autograd.grad(out, prep.inputs, torch.randn_like(out))
                    del out
            except Exception:  # noqa: BLE001  (measure() records it)
                _release(device, collect=True)
            finally:
                prep = None
                _release(device)
        inputs = None
    torch.cuda.synchronize(device)


def run_sweep(cfg, providers, device):
    """Measure every provider on every shape of ``cfg`` (after one call of each: _compile_pass); returns the list of
    records."""
    shapes = make_shapes(cfg)
    _compile_pass(shapes, providers, cfg.modes, device, cfg.seed)
    records = []
    bar = _progress(len(shapes) * len(providers))
    base, inputs, i = None, None, -1
    try:
        for shape in shapes:
            if replace(shape, features=NONE) != base:  # feature settings share their shape's inputs
                base, inputs, i = replace(shape, features=NONE), None, i + 1
                _release(device)
                inputs = make_inputs(shape, device, seed=cfg.seed + i)
            for provider in providers:
                bar.set_postfix_str(f"{provider.name} {shape.label()}")
                records += measure(provider, shape, inputs, cfg.modes, device, cfg.warmup, cfg.rep)
                bar.update(1)
        inputs = None
        _release(device)
    finally:
        bar.close()
    return records


def probe_max_seqlen(provider, cfg, device, start=1024):
    """Longest seqlen (doubling from ``start`` up to cfg.probe_cap) for which one causal fwd+bwd fits at batch 1."""
    head_dim = cfg.head_dims[0]
    heads_q, heads_kv = cfg.heads_for(head_dim)
    result = dict(provider=provider.name, batch=1, heads_q=heads_q, heads_kv=heads_kv, head_dim=head_dim,
                  causal=True, dtype=cfg.dtype, cap=cfg.probe_cap, max_seqlen=None, stopped=None)
    seqlen = start
    while seqlen <= cfg.probe_cap:
        shape = Shape(1, seqlen, seqlen, heads_q, heads_kv, head_dim, True, cfg.dtype)
        reason = _skip_reason(provider, shape, device)
        if reason is not None:
            result["stopped"] = f"at {seqlen}: {reason}"
            return result
        prep = None
        try:
            q, k, v = make_inputs(shape, device)
            prep = provider.prepare(q, k, v, True)
            with prep.context():
                out = prep.fn()
                torch.autograd.grad(out, prep.inputs, torch.randn_like(out))
                del out
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            result["max_seqlen"] = seqlen
        except Exception as e:
            result["stopped"] = f"at {seqlen}: {describe_error(e)}"
            return result
        finally:
            q = k = v = prep = None
            _release(device, collect=True)
        seqlen *= 2
    result["stopped"] = f"at the cap {cfg.probe_cap}"
    return result
