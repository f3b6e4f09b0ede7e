"""Decode mode: a few new queries (1 token) over a long KV cache, contiguous or paged. Memory-bound, so
the figure of merit is bandwidth: bytes of K and V read per second, and its fraction of the device-copy
ceiling. Providers: flashtile.flash_attn_with_kvcache, SDPA (default dispatch, GQA), FlexAttention and
flash-attn's flash_attn_with_kvcache; SDPA and flex read only a contiguous cache (paged: skipped)."""
import importlib
import sys
from collections import defaultdict

import torch

from flashtile.bench.features import NONE
from flashtile.bench.flops import attention_flops, tflops
from flashtile.bench.report import _fmt, _render
from flashtile.bench.sweep import DTYPES, _release, describe_error, max_error
from flashtile.bench.timing import bench_ms

# Device-to-device copy bandwidth measured on an H200 (torch copy_ of a multi-GB bf16 tensor): about
# 4.3 TB/s, the practical ceiling for a kernel that streams the cache once (HBM3e peak is 4.8 TB/s).
COPY_CEILING_GBPS = 4300.0

GPU_DEFAULTS = dict(cache_lens=[4096, 16384, 65536, 131072], decode_batch=[8, 64])
CPU_DEFAULTS = dict(cache_lens=[512, 2048], decode_batch=[2])
PAGE_SIZES = [0, 16, 256]  # 0 = contiguous cache
HEADS_Q, GQA, HEAD_DIM = 32, 8, 128


def kv_bytes(batch, cache_len, heads_kv, head_dim, itemsize):
    """Bytes of K and V one decode step reads: 2 * B * cache_len * Hk * D * itemsize."""
    return 2 * batch * cache_len * heads_kv * head_dim * itemsize


def gbps(nbytes, ms):
    """GB/s (1e9 bytes) for ``nbytes`` moved in ``ms`` milliseconds (None when ms is missing or not positive)."""
    if ms is None or ms <= 0:
        return None
    return nbytes / (ms * 1e-3) / 1e9


def frac_of_copy(bandwidth, device):
    """bandwidth / COPY_CEILING_GBPS on a GPU; None on CPU (the ceiling is the H200's)."""
    if bandwidth is None or device.type != "cuda":
        return None
    return bandwidth / COPY_CEILING_GBPS


class Unsupported(Exception):
    """The provider cannot run this layout: recorded as 'skipped: ...'."""


def _flashtile(q, k, v, block_table, cache_len):
    from flashtile import flash_attn_with_kvcache

    return lambda: flash_attn_with_kvcache(q, k, v, cache_seqlens=cache_len, block_table=block_table, causal=True)


def _flash_attn(q, k, v, block_table, cache_len):
    func = importlib.import_module("flash_attn").flash_attn_with_kvcache
    seqlens = torch.full((q.shape[0],), cache_len, dtype=torch.int32, device=q.device)
    return lambda: func(q, k, v, cache_seqlens=seqlens, block_table=block_table, causal=True)


def _sdpa(q, k, v, block_table, cache_len):
    import torch.nn.functional as F

    if block_table is not None:
        raise Unsupported("paged KV cache not supported by SDPA")
    # One query sees every key (bottom-right causal), so no mask; transposes happen before timing.
    qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k[:, :cache_len], v[:, :cache_len]))
    fn = lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)  # noqa: E731
    return lambda: fn().transpose(1, 2)


def _flex(q, k, v, block_table, cache_len):
    from flashtile.bench.flex import compiled_flex

    if block_table is not None:
        raise Unsupported("paged KV cache not supported by the flex provider")
    flex = compiled_flex()
    qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k[:, :cache_len], v[:, :cache_len]))
    return lambda: flex(qt, kt, vt, enable_gqa=True).transpose(1, 2)


def _needs_cuda(device):
    return None if device.type == "cuda" else "needs a CUDA GPU"


def _flash_attn_unavailable(device):
    try:
        importlib.import_module("flash_attn").flash_attn_with_kvcache
    except Exception as e:  # a broken CUDA extension raises OSError/RuntimeError, not ImportError
        return f"flash_attn.flash_attn_with_kvcache not importable ({type(e).__name__}: {e})"
    return _needs_cuda(device)


# name -> (unavailable(device) -> reason or None, prepare(q, k_cache, v_cache, block_table, cache_len) -> fn)
PROVIDERS = {
    "flashtile": (lambda device: None, _flashtile),
    "sdpa": (lambda device: None, _sdpa),
    "flex": (_needs_cuda, _flex),
    "flash-attn": (_flash_attn_unavailable, _flash_attn),
}


def available(names, device):
    """The decode providers among ``names`` (None = all) that can run; prints a line for each skipped one."""
    chosen = []
    for name in (n for n in PROVIDERS if names is None or n in names):
        reason = PROVIDERS[name][0](device)
        if reason:
            print(f"skip decode {name}: {reason}")
        else:
            chosen.append(name)
    return chosen


def paged(k, v, page_size, gen):
    """k, v (B, L, Hk, D) as a paged cache (num_pages, page_size, Hk, D) in shuffled page order, and the
    int32 block_table (B, pages per row) that maps row b's tokens back; the last page is zero-padded."""
    batch, length = k.shape[:2]
    per_row = -(-length // page_size)
    pad = per_row * page_size - length
    perm = torch.randperm(batch * per_row, generator=gen, device="cpu").to(k.device)
    table = torch.empty_like(perm)
    table[perm] = torch.arange(batch * per_row, device=k.device)  # page i of the layout lives at table[i]

    def pages(x):
        x = torch.nn.functional.pad(x, (0, 0, 0, 0, 0, pad)).reshape(batch * per_row, page_size, *x.shape[2:])
        return x[perm].contiguous()  # stored page j = layout page perm[j]

    return pages(k), pages(v), table.view(batch, per_row).to(torch.int32)


def run_decode(args, names, device):
    """Records for every (batch, cache_len, page size, provider) of the resolved decode config."""
    dtype = DTYPES[args.dtype]
    heads_q, heads_kv, head_dim = args.decode_heads
    records = []
    for i, (batch, cache_len) in enumerate((b, n) for b in args.decode_batch for n in args.cache_lens):
        gen = torch.Generator(device="cpu").manual_seed(args.seed + i)

        def randn(length, heads):
            return torch.randn((batch, length, heads, head_dim), generator=gen).to(device=device, dtype=dtype)

        q, k, v = randn(1, heads_q), randn(cache_len, heads_kv), randn(cache_len, heads_kv)
        nbytes = kv_bytes(batch, cache_len, heads_kv, head_dim, dtype.itemsize)
        flops = attention_flops(batch, heads_q, 1, cache_len, head_dim)
        for page_size in args.page_size:
            layout = (k, v, None) if page_size == 0 else paged(k, v, page_size, gen)
            for name in names:
                rec = dict(provider=name, mode="decode", batch=batch, seqlen_q=1, seqlen_k=cache_len,
                           heads_q=heads_q, heads_kv=heads_kv, head_dim=head_dim, causal=True, dtype=args.dtype,
                           features=NONE, cache_len=cache_len, page_size=page_size, ms=None, tflops=None,
                           gbps=None, frac_of_copy=None, peak_mem_mb=None, max_err=None, error=None)
                print(f"decode {name} B{batch} L{cache_len} page {page_size} ...", file=sys.stderr)
                fn = None
                try:
                    with torch.no_grad():
                        fn = PROVIDERS[name][1](q, *layout[:2], layout[2], cache_len)
                        err = max_error(fn(), q, k, v, True)
                        if err != err:
                            rec["error"] = "non-finite values in the output"
                        else:
                            rec["max_err"] = err
                        rec["ms"] = bench_ms(fn, device, args.warmup, args.rep)
                    rec["tflops"] = tflops(flops, rec["ms"])
                    rec["gbps"] = gbps(nbytes, rec["ms"])
                    rec["frac_of_copy"] = frac_of_copy(rec["gbps"], device)
                except Unsupported as e:
                    rec["error"] = f"skipped: {e}"
                except Exception as e:
                    rec["error"] = describe_error(e)
                    _release(device, collect=True)
                finally:
                    fn = None
                records.append(rec)
            layout = None
            _release(device)
        q = k = v = None
        _release(device)
    return annotate(records)


def annotate(records):
    """vs_best_other / best_other on flashtile records: best other provider's ms / flashtile ms (> 1 means
    flashtile is faster), at the same (batch, cache_len, page size); a paged layout no other provider ran
    compares with the best other on the contiguous cache (best_other then says '(contig)')."""
    groups = defaultdict(dict)
    for rec in records:
        rec["vs_best_other"] = rec["best_other"] = rec["speedup_vs_standard"] = None
        groups[(rec["batch"], rec["cache_len"], rec["page_size"])][rec["provider"]] = rec
    for (batch, cache_len, page_size), group in groups.items():
        ours = group.get("flashtile")
        others = [r for n, r in group.items() if n != "flashtile" and r["ms"]]
        suffix = ""
        if not others and page_size:
            others = [r for n, r in groups.get((batch, cache_len, 0), {}).items() if n != "flashtile" and r["ms"]]
            suffix = " (contig)"
        if ours and ours["ms"] and others:
            best = min(others, key=lambda r: r["ms"])
            ours["vs_best_other"] = best["ms"] / ours["ms"]
            ours["best_other"] = best["provider"] + suffix
    return records


def format_table(records):
    """The decode table: one row per (provider, batch, cache_len, page size)."""
    header = ("provider", "B", "cache_len", "page", "Hq", "Hk", "D", "ms", "GB/s", "of 4.3 TB/s",
              "best other ms / flashtile ms", "max err", "error")
    rows = []
    for rec in records:
        best = "-" if rec["vs_best_other"] is None else f"{rec['vs_best_other']:.2f}x {rec['best_other']}"
        error = rec["error"] or ""
        rows.append((rec["provider"], rec["batch"], rec["cache_len"], rec["page_size"] or "contig",
                     rec["heads_q"], rec["heads_kv"], rec["head_dim"], _fmt(rec["ms"], ".3f"),
                     _fmt(rec["gbps"], ".1f"), _fmt(rec["frac_of_copy"], ".0%"), best,
                     _fmt(rec["max_err"], ".1e"), error if len(error) <= 60 else error[:57] + "..."))
    return "== decode (1 query token, causal; GB/s = K+V bytes read / time) ==\n" + _render(header, rows)
