"""Decode mode: a few new queries (1 token) over a long KV cache, contiguous or paged. Memory-bound, so
the figure of merit is bandwidth: bytes of K and V read per second, and its fraction of the device-copy
ceiling. Providers: flashtile.flash_attn_with_kvcache, SDPA (default dispatch, GQA), FlexAttention and
flash-attn's flash_attn_with_kvcache; SDPA and flex read only a contiguous cache (paged: skipped).

What is timed, per provider (one call, inputs prepared once outside the timed region):
- flashtile / flash-attn: the library call on the (B, capacity, Hk, D) cache or its paged view, int
  cache_seqlens (flashtile) or a prebuilt int32 tensor (flash-attn). flashtile's paged path checks the
  block table's bounds (aminmax + one device sync) inside every call: that is part of the library call.
- sdpa: F.scaled_dot_product_attention(q, k, v, enable_gqa=True) on (B, H, L, D) copies of the cache made
  once outside timing; no mask (one query sees every key). With enable_gqa the flash backend reads the Hk
  heads in place; the math fallback expands K/V to Hq heads (repeat_interleave) inside every call. Which
  backend the default dispatch picks is recorded in each sdpa record's note. Paged caches are skipped (an
  SDPA user would gather the pages into a contiguous cache first; that gather is not measured).
- flex: torch.compile(flex_attention, dynamic=False), so every new shape is a recompile (seconds each).

The sweep: one generator for the run, random caches made directly on the device, once per (batch,
cache_len) and kept while that batch runs; paged layouts are views of the same memory (the cache's capacity
is a multiple of every page size) with a random page table, so no layout copies anything. Order: one batch
at a time, the contiguous cache for every length first, then each page size. Every record is printed as one
line and appended to decode.jsonl as soon as it is measured; a time budget (deadline) or SIGINT/SIGTERM
stops the sweep cleanly with what it has."""
import importlib
import json
import math
import signal
import time
from collections import defaultdict

import torch

from flashtile.bench.features import NONE
from flashtile.bench.flops import attention_flops, tflops
from flashtile.bench.report import _fmt, _render
from flashtile.bench.sweep import DTYPES, _release, describe_error, max_error
from flashtile.bench.timing import bench_ms, free_bytes

# Device-to-device copy bandwidth measured on an H200 (torch copy_ of a multi-GB bf16 tensor): about
# 4.3 TB/s, the practical ceiling for a kernel that streams the cache once (HBM3e peak is 4.8 TB/s).
COPY_CEILING_GBPS = 4300.0

GPU_DEFAULTS = dict(cache_lens=[4096, 16384, 65536, 131072], decode_batch=[8, 64])
CPU_DEFAULTS = dict(cache_lens=[512, 2048], decode_batch=[2])
PAGE_SIZES = [0, 16, 256]  # 0 = contiguous cache
HEADS_Q, GQA, HEAD_DIM = 32, 8, 128
# do_bench budget (ms) unless --warmup/--rep are given: a decode call takes 10 us - 4 ms, so 20 ms of
# repetitions is 5-2000 calls; the dense defaults (25/100 ms) would make the sweep 4x slower for nothing.
GPU_TIMING = {"warmup": 5, "rep": 20}
CPU_TIMING = {"warmup": 0, "rep": 50}


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

    def fn():
        return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)

    def call():
        return fn().transpose(1, 2)

    call.note = "backend " + sdpa_backend(qt, kt, vt)
    return call


_SDPA_BACKENDS = {  # torch._C._SDPBackend values -> (name, can_use function, enabled flag, GQA note)
    1: ("flash", "can_use_flash_attention", "flash_sdp_enabled", "reads the Hk heads in place"),
    2: ("efficient", "can_use_efficient_attention", "mem_efficient_sdp_enabled", ""),
    3: ("cudnn", "can_use_cudnn_attention", "cudnn_sdp_enabled", "reads the Hk heads in place"),
}


def sdpa_backend(q, k, v):
    """The backend SDPA's default dispatch picks for (q, k, v, enable_gqa=True), with what it does about
    GQA: the first enabled backend in torch's priority order whose can_use_* accepts the inputs, else math
    (which expands K/V to Hq heads inside every call). 'unknown' where torch cannot say."""
    math_note = "math (expands K/V to Hq heads in every call)"
    if q.device.type != "cuda":
        return "cpu dispatch" + ("" if q.shape[1] == k.shape[1] else " (GQA)")
    try:
        cuda = torch.backends.cuda
        params = cuda.SDPAParams(q, k, v, None, 0.0, False, True)
        for backend in torch._C._get_sdp_priority_order():
            backend = int(backend)
            if backend == 0:
                return math_note
            if backend not in _SDPA_BACKENDS:
                continue
            name, can_use, enabled, note = _SDPA_BACKENDS[backend]
            if getattr(cuda, enabled)() and getattr(cuda, can_use)(params):
                return f"{name} ({note})" if note else name
        return math_note
    except Exception as e:  # an older torch without these hooks
        return f"unknown ({type(e).__name__})"


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


def capacity_for(cache_len, page_sizes):
    """Tokens per cache row: cache_len rounded up to a multiple of every page size, so each paged layout is
    a view of the same memory (the tokens past cache_len are never read)."""
    step = math.lcm(*(p for p in page_sizes if p > 0)) if any(p > 0 for p in page_sizes) else 1
    return -(-cache_len // step) * step


def paged(k, v, cache_len, page_size, gen):
    """k, v (B, capacity, Hk, D) as a paged cache without copying: the views (B * capacity / page_size,
    page_size, Hk, D) of the same memory, and an int32 block_table (B, ceil(cache_len / page_size)) that
    gives each row's logical pages as a random permutation of all physical pages (so a row's pages are
    scattered over the whole cache, as after many allocations). Row b's logical cache is
    k_pages[block_table[b]].flatten(0, 1)[:cache_len]; see logical_row."""
    batch, capacity = k.shape[:2]
    if capacity % page_size:
        raise ValueError(f"the cache capacity {capacity} is not a multiple of the page size {page_size}")
    per_row, needed = capacity // page_size, -(-cache_len // page_size)
    perm = torch.randperm(batch * per_row, generator=gen, device=gen.device).to(k.device)
    table = perm.view(batch, per_row)[:, :needed].to(torch.int32).contiguous()
    def view(x):
        return x.view(batch * per_row, page_size, *x.shape[2:])
    return view(k), view(v), table


def logical_row(cache, block_table, cache_len, row=0):
    """(1, cache_len, Hk, D): row ``row``'s keys (or values) as the kernel sees them, from a contiguous
    (B, capacity, Hk, D) cache (block_table None) or a paged one."""
    if block_table is None:
        return cache[row:row + 1, :cache_len]
    return cache[block_table[row].long()].flatten(0, 1)[None, :cache_len]


class _Stop(Exception):
    """The time budget ran out or the run was interrupted: stop the sweep, keep the records."""


def _on_sigterm(signum, frame):
    raise KeyboardInterrupt


def _jsonable(value):
    return None if isinstance(value, float) and not math.isfinite(value) else value


def stream_line(rec, elapsed):
    """The one-line form of a record printed as soon as it is measured."""
    page = rec["page_size"] or "contig"
    head = f"decode {rec['provider']:>10} B={rec['batch']:<3} L={rec['cache_len']:<7} page={page!s:<6}"
    if rec["ms"] is None:
        body = rec["error"] or "no time"
    else:
        frac = "-" if rec["frac_of_copy"] is None else f"{rec['frac_of_copy']:.0%}"
        body = (f"{rec['ms']:9.4f} ms {_fmt(rec['gbps'], '8.1f')} GB/s {frac:>4} of 4.3 TB/s "
                f"err {_fmt(rec['max_err'], '.1e')}" + (f"  {rec['error']}" if rec["error"] else ""))
    note = f"  [{rec['note']}]" if rec.get("note") else ""
    return f"{head} {body}{note}  ({elapsed:.1f} s)"


def _order(args):
    """(batch, page_size, cache_len) in sweep order: one batch at a time, contiguous before paged (page
    sizes in the given order), lengths ascending within a layout."""
    pages = [p for p in args.page_size if p == 0][:1] + list(dict.fromkeys(p for p in args.page_size if p))
    return [(b, p, n) for b in dict.fromkeys(args.decode_batch) for p in pages
            for n in sorted(dict.fromkeys(args.cache_lens))]


def run_decode(args, names, device, jsonl=None, deadline=None):
    """Records for every (batch, cache_len, page size, provider) of the resolved decode config.

    jsonl: a path; each record is appended to it as one JSON line as soon as it is measured (the file is
    truncated first). deadline: a time.perf_counter() value; no new (batch, page size, cache_len) shape starts
    after it (the one running finishes all its providers; the first one always runs), and the sweep returns
    what it has, as it does on Ctrl-C or SIGTERM."""
    dtype = DTYPES[args.dtype]
    heads_q, heads_kv, head_dim = args.decode_heads
    warmup = getattr(args, "decode_warmup", args.warmup)
    graphs = getattr(args, "cuda_graphs", False) and device.type == "cuda"
    rep = getattr(args, "decode_rep", args.rep)
    gen = torch.Generator(device=device).manual_seed(args.seed)
    caches = {}  # (batch, cache_len) -> (q, k, v), for the batch that is running
    records, order = [], _order(args)
    start = time.perf_counter()
    if jsonl:
        open(jsonl, "w").close()

    def inputs(batch, cache_len):
        if (batch, cache_len) in caches:
            return caches[batch, cache_len]
        if any(b != batch for b, _ in caches):  # a new batch: drop the last one's caches
            caches.clear()
            _release(device)
        capacity = capacity_for(cache_len, args.page_size)
        need = 2 * kv_bytes(batch, capacity, heads_kv, head_dim, dtype.itemsize)  # the cache and a copy (sdpa)
        free = free_bytes(device)
        if caches and free is not None and free < need + 2**30:  # short of memory: regenerate them later
            caches.clear()
            _release(device)

        def randn(length, heads):
            return torch.randn((batch, length, heads, head_dim), generator=gen, device=device, dtype=dtype)

        caches[batch, cache_len] = randn(1, heads_q), randn(capacity, heads_kv), randn(capacity, heads_kv)
        return caches[batch, cache_len]

    previous, installed = signal.getsignal(signal.SIGTERM), False
    try:  # SIGTERM (e.g. from `timeout`) stops the sweep like Ctrl-C, so the results still get written
        signal.signal(signal.SIGTERM, _on_sigterm)
        installed = True
    except ValueError:  # not the main thread
        pass
    done = 0
    try:
        for batch, page_size, cache_len in order:
            if deadline is not None and done and time.perf_counter() > deadline:  # the first shape always runs
                raise _Stop(f"time budget (--max-seconds) reached after {time.perf_counter() - start:.1f} s")
            q = k = v = block_table = setup_error = None
            try:
                q, k, v = inputs(batch, cache_len)
                if page_size:
                    k, v, block_table = paged(k, v, cache_len, page_size, gen)
            except Exception as e:  # e.g. out of memory for the cache: a failed record per provider
                setup_error = f"setup: {describe_error(e)}"
                q = k = v = None
                caches.clear()
                _release(device, collect=True)
            nbytes = kv_bytes(batch, cache_len, heads_kv, head_dim, dtype.itemsize)
            flops = attention_flops(batch, heads_q, 1, cache_len, head_dim)
            k_ref = v_ref = None
            for name in names:
                rec = dict(provider=name, mode="decode", batch=batch, seqlen_q=1, seqlen_k=cache_len,
                           heads_q=heads_q, heads_kv=heads_kv, head_dim=head_dim, causal=True, dtype=args.dtype,
                           features=NONE, cache_len=cache_len, page_size=page_size, ms=None, tflops=None,
                           gbps=None, frac_of_copy=None, peak_mem_mb=None, max_err=None, error=None, note=None,
                           timing="cuda-graph" if graphs else "eager")
                fn = None
                try:
                    if setup_error:
                        raise RuntimeError(setup_error)
                    with torch.no_grad():
                        fn = PROVIDERS[name][1](q, k, v, block_table, cache_len)
                        rec["note"] = getattr(fn, "note", None)
                        out = fn()  # compiles; the accuracy check uses this output
                        if k_ref is None:
                            k_ref, v_ref = (logical_row(x, block_table, cache_len) for x in (k, v))
                        err = max_error(out, q, k_ref, v_ref, True)
                        out = None
                        if err != err:
                            rec["error"] = "non-finite values in the output"
                        else:
                            rec["max_err"] = err
                        rec["ms"] = bench_ms(fn, device, warmup, rep, cuda_graph=graphs)
                    rec["tflops"] = tflops(flops, rec["ms"])
                    rec["gbps"] = gbps(nbytes, rec["ms"])
                    rec["frac_of_copy"] = frac_of_copy(rec["gbps"], device)
                except Unsupported as e:
                    rec["error"] = f"skipped: {e}"
                except KeyboardInterrupt:
                    raise
                except Exception as e:
                    rec["error"] = setup_error or describe_error(e)
                    _release(device, collect=True)
                finally:
                    fn = None
                records.append(rec)
                elapsed = time.perf_counter() - start
                print(stream_line(rec, elapsed), flush=True)
                if jsonl:
                    with open(jsonl, "a") as f:
                        f.write(json.dumps({**{key: _jsonable(x) for key, x in rec.items()},
                                            "elapsed_s": round(elapsed, 3)}) + "\n")
            done += 1
            q = k = v = block_table = k_ref = v_ref = None
    except (_Stop, KeyboardInterrupt) as e:
        reason = str(e) if isinstance(e, _Stop) else "interrupted"
        print(f"decode: {reason}; stopped with {len(order) - done} of {len(order)} (batch, page, length) "
              f"shapes not run, {len(records)} records kept", flush=True)
    finally:
        if installed:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
        caches.clear()
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
    notes = list(dict.fromkeys(f"{r['provider']}: {r['note']}" for r in records if r.get("note")))
    footer = [("sdpa: default dispatch with enable_gqa=True on (B, H, L, D) copies made outside timing; paged "
               "layouts are skipped (a gather into a contiguous cache would come first, not timed)")] \
        if any(r["provider"] == "sdpa" for r in records) else []
    if any(r.get("timing") == "cuda-graph" for r in records):
        footer.append("timed as CUDA graph replays (--cuda-graphs): no host work per call; flashtile's block "
                      "table range check is skipped under capture")
    elif any(r["provider"] == "flashtile" and r["page_size"] for r in records):
        footer.append("flashtile paged: the block table's bounds are read once (one device sync, in the warm-up: the "
                      "table does not change between calls; a changed table is read again, one sync per decode step "
                      "when its layers share the table; an inference-mode table on every call)")
    return ("== decode (1 query token, causal; GB/s = K+V bytes read / time) ==\n" + _render(header, rows)
            + "".join("\n  " + line for line in footer + notes))
