"""Command line of the benchmark: ``python -m flashtile.bench [flags]`` (or ``flashtile-bench``)."""
import argparse
import datetime
import os
import platform
import shlex
import sys
import time
from importlib import metadata

import torch

from flashtile.bench import decode, features, report, sparse, sweep
from flashtile.bench.flops import MODES
from flashtile.bench.providers import PROVIDERS

# Defaults per device. GPU: the FlashAttention papers' setup (16K tokens, hidden 2048). CPU: small
# enough for about a minute on two cores while standard attention's quadratic memory still shows.
GPU_DEFAULTS = dict(tokens=16384, hidden=2048, head_dims=[64, 128, 256],
                    seqlens=[512, 1024, 2048, 4096, 8192, 16384], dtype="bf16", modes=["fwd", "bwd"],
                    warmup=25, rep=100, probe_cap=262144)
CPU_DEFAULTS = dict(batch=1, heads=4, head_dims=[64], seqlens=[256, 512, 1024, 2048], dtype="fp32",
                    modes=["fwd", "bwd"], warmup=0, rep=200, probe_cap=0)
GPU_QUICK = dict(head_dims=[64, 128], seqlens=[1024, 4096], warmup=10, rep=30, probe_cap=0)
CPU_QUICK = dict(heads=2, head_dims=[64], seqlens=[128, 256], rep=20, probe_cap=0)


def _int_list(text):
    """'512,1k,16K' -> [512, 1024, 16384]."""
    values = []
    for item in text.split(","):
        item = item.strip().lower()
        try:
            values.append(int(item[:-1]) * 1024 if item.endswith("k") else int(item))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    return values


def _feature(text):
    """One --feature SPEC -> its canonical text (argparse turns the error into a usage error)."""
    try:
        return features.parse(text).spec
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"bad SPEC {text!r}: {e}") from None


def _name_list(text):
    return [item.strip() for item in text.split(",") if item.strip()]


def build_parser():
    p = argparse.ArgumentParser(
        prog="python -m flashtile.bench",
        description="Benchmark flashtile against standard attention, SDPA backends, FlexAttention and "
                    "flash-attn: time (median ms), TFLOP/s, speedups, peak memory and accuracy. "
                    "Defaults follow the FlashAttention papers on a GPU and are small on CPU.")
    shape = p.add_argument_group("shapes")
    shape.add_argument("--batch", type=int, help="batch size (default: tokens // seqlen on GPU, 1 on CPU)")
    shape.add_argument("--tokens", type=int,
                       help="total tokens per batch, batch = tokens // seqlen (GPU default 16384)")
    shape.add_argument("--hidden", type=int, help="model width: heads = hidden // head_dim (GPU default 2048)")
    shape.add_argument("--heads", type=int, help="query heads (overrides --hidden; CPU default 4)")
    kv = shape.add_mutually_exclusive_group()
    kv.add_argument("--heads-kv", type=int, help="key/value heads (default: = heads)")
    kv.add_argument("--gqa", type=int, help="query heads per key/value head (heads_kv = heads // gqa)")
    shape.add_argument("--head-dims", type=_int_list, help="comma-separated head dims (GPU: 64,128,256)")
    shape.add_argument("--seqlens", type=_int_list, help="comma-separated query lengths, 'k' = 1024")
    shape.add_argument("--seqlens-k", type=_int_list,
                       help="key lengths: one value or one per --seqlens (default = seqlen)")
    shape.add_argument("--dtype", choices=sorted(sweep.DTYPES), help="bf16 on GPU, fp32 on CPU by default")
    shape.add_argument("--causal", choices=["0", "1", "both"], default="both", help="default: both")
    shape.add_argument("--feature", type=_feature, action="append", dest="features", metavar="SPEC",
                       help="repeatable; every shape runs once per setting (default: none). SPEC: none, "
                            "window:L:R (sliding window, -1 = unbounded side), softcap:X (X > 0), alibi "
                            "(standard slopes), dropout:P (0 < P < 1), sink (per-head sink logits), bias (a "
                            "(1, H, S, S) attn_bias), or parts joined with '+', e.g. window:512:0+softcap:30. "
                            "SDPA backends skip everything but none. With none and others: a feature-cost "
                            "table; with several windows: a window-scaling table")
    run = p.add_argument_group("run")
    run.add_argument("--modes", type=_name_list,
                     help="comma-separated: fwd, bwd, fwd_bwd, decode, sparse (default fwd,bwd)")
    run.add_argument("--providers", type=_name_list, help=f"comma-separated subset of: {', '.join(PROVIDERS)} "
                     f"(decode: {', '.join(decode.PROVIDERS)}; sparse: {', '.join(sparse.PROVIDERS)}); default: all "
                     f"but flashtile-varlen (the varlen path on the same batch, for its overhead)")
    run.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    run.add_argument("--quick", action="store_true", help="a tiny sweep (explicit flags still win)")
    run.add_argument("--warmup", type=int, help="warm-up ms (do_bench; GPU default 25)")
    run.add_argument("--rep", type=int, help="measurement ms (do_bench; GPU default 100, CPU 200)")
    run.add_argument("--max-seqlen-probe", type=_int_list, dest="probe_cap", metavar="CAP",
                     help="longest-sequence probe up to CAP, batch 1 (GPU default 256k; 0 = off, CPU default)")
    run.add_argument("--seed", type=int, default=0)
    dec = p.add_argument_group("decode (--modes decode: 1 query token over a KV cache; Hq 32, Hk = Hq / 8, "
                               "D 128 unless --heads/--heads-kv/--gqa/--head-dims say otherwise)")
    dec.add_argument("--cache-lens", type=_int_list, help="tokens in the cache (GPU: 4k,16k,64k,128k; CPU: 512,2048)")
    dec.add_argument("--decode-batch", type=_int_list, help="batch sizes (GPU: 8,64; CPU: 2)")
    dec.add_argument("--page-size", type=_int_list, help="page sizes, 0 = contiguous cache (default 0,16,256)")
    dec.add_argument("--cuda-graphs", action="store_true",
                     help="time the replay of a CUDA graph of each decode call (no host work per call, as a "
                          "serving loop that captures its step); records say timing=cuda-graph")
    dec.add_argument("--max-seconds", type=float, metavar="S",
                     help="time budget from the start of the run: no new decode shape starts after S seconds; "
                          "the sweep stops cleanly and writes what it has, as on Ctrl-C/SIGTERM (default: none). "
                          "Records also stream "
                          "to OUT/decode.jsonl as they are measured. Decode times with warm-up 5 ms and "
                          "rep 20 ms on a GPU (CPU 0/50) unless --warmup/--rep are given")
    sp = p.add_argument_group("sparse (--modes sparse: block-sparse flashtile.attention vs dense flashtile and "
                              "FlexAttention with the same mask; batch 1, heads = hidden // head dim, the first "
                              "--head-dims (128 by default))")
    sp.add_argument("--sparse-seqlens", type=_int_list, help="sequence lengths (GPU: 16k; CPU: 512)")
    sp.add_argument("--sparse-masks", type=_name_list, help="comma-separated: window:W, document:N, dilated:D, "
                    "causal (GPU: window:2048,document:8,dilated:4,causal)")
    out = p.add_argument_group("output")
    out.add_argument("--out", default="bench-out", help="directory for results.json/csv and plots (default bench-out)")
    out.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    return p


def resolve(args, parser, device):
    """Fill unset flags from the device's defaults (and --quick), then validate; errors exit with usage."""
    _resolve_decode(args, parser, device)
    _resolve_sparse(args, parser, device)
    defaults = dict(GPU_DEFAULTS if device.type == "cuda" else CPU_DEFAULTS)
    if args.quick:
        defaults.update(GPU_QUICK if device.type == "cuda" else CPU_QUICK)
    for key, value in defaults.items():
        if key == "batch" and args.tokens is not None:
            continue  # --tokens asks for a tokens-derived batch
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if isinstance(args.probe_cap, list):
        if len(args.probe_cap) != 1:
            parser.error("--max-seqlen-probe takes one value")
        args.probe_cap = args.probe_cap[0]
    if args.batch is None:
        args.tokens = args.tokens or GPU_DEFAULTS["tokens"]
    if args.heads is None:
        args.hidden = args.hidden or GPU_DEFAULTS["hidden"]

    for name in ("batch", "tokens", "hidden", "heads", "heads_kv", "gqa"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if args.warmup < 0 or args.rep < 1 or args.probe_cap < 0:
        parser.error("--warmup must be >= 0, --rep >= 1 and --max-seqlen-probe >= 0")
    for d in args.head_dims:
        if d % 8 or not 8 <= d <= 256:
            parser.error(f"--head-dims: each head dim must be a multiple of 8 in [8, 256], got {d}")
    args.seqlens_k = args.seqlens_k or list(args.seqlens)
    if len(args.seqlens_k) == 1:
        args.seqlens_k = args.seqlens_k * len(args.seqlens)
    if len(args.seqlens_k) != len(args.seqlens):
        parser.error(f"--seqlens-k needs one value or {len(args.seqlens)} (one per --seqlens), "
                     f"got {len(args.seqlens_k)}")
    for s in (*args.seqlens, *args.seqlens_k):
        if s < 1:
            parser.error(f"--seqlens/--seqlens-k: sequence lengths must be >= 1, got {s}")
    bad = [m for m in args.modes if m not in (*MODES, "decode", "sparse")]
    if bad or not args.modes:
        parser.error(f"--modes: unknown mode {bad[0]!r} (choose from {', '.join(MODES)}, decode, sparse)"
                     if bad else "--modes is empty")
    args.decode_providers = args.providers  # None = every decode provider
    args.sparse_providers = [n for n in args.providers or sparse.PROVIDERS if n in sparse.PROVIDERS]
    args.providers = args.providers or [name for name, p in PROVIDERS.items() if not p.opt_in]
    bad = [n for n in args.providers if n not in PROVIDERS and n not in decode.PROVIDERS and n not in sparse.PROVIDERS]
    if bad or not args.providers:
        parser.error(f"--providers: unknown provider {bad[0]!r} (choose from {', '.join(PROVIDERS)}, "
                     f"{', '.join(n for n in decode.PROVIDERS if n not in PROVIDERS)})"
                     if bad else "--providers is empty")
    args.providers = [n for n in args.providers if n in PROVIDERS]
    args.causal = {"0": [False], "1": [True], "both": [False, True]}[args.causal]
    args.features = list(dict.fromkeys(args.features or [features.NONE]))

    def heads_for(head_dim):
        heads = args.heads or args.hidden // head_dim
        if heads < 1:
            parser.error(f"--hidden {args.hidden} is smaller than head dim {head_dim}")
        heads_kv = args.heads_kv or (heads // args.gqa if args.gqa else heads)
        if heads_kv < 1 or heads % heads_kv:
            parser.error(f"query heads ({heads}) must be a multiple of key/value heads ({heads_kv})")
        return heads, heads_kv

    for d in args.head_dims:
        heads_for(d)
    args.heads_for = heads_for
    return args


def _resolve_decode(args, parser, device):
    """Decode defaults (before the dense ones fill --heads/--head-dims) and validation."""
    defaults = decode.GPU_DEFAULTS if device.type == "cuda" else decode.CPU_DEFAULTS
    args.cache_lens = args.cache_lens or defaults["cache_lens"]
    args.decode_batch = args.decode_batch or defaults["decode_batch"]
    args.page_size = args.page_size if args.page_size is not None else list(decode.PAGE_SIZES)
    if min(args.cache_lens) < 1 or min(args.decode_batch) < 1 or min(args.page_size) < 0:
        parser.error("--cache-lens and --decode-batch must be >= 1, --page-size >= 0")
    if args.max_seconds is not None and not args.max_seconds > 0:
        parser.error(f"--max-seconds must be > 0, got {args.max_seconds}")
    timing = decode.GPU_TIMING if device.type == "cuda" else decode.CPU_TIMING
    args.decode_warmup = args.warmup if args.warmup is not None else timing["warmup"]
    args.decode_rep = args.rep if args.rep is not None else timing["rep"]
    heads = args.heads or decode.HEADS_Q
    heads_kv = args.heads_kv or heads // (args.gqa or decode.GQA)
    if heads_kv < 1 or heads % heads_kv:
        parser.error(f"decode: query heads ({heads}) must be a multiple of key/value heads ({heads_kv})")
    args.decode_heads = (heads, heads_kv, args.head_dims[0] if args.head_dims else decode.HEAD_DIM)


def _resolve_sparse(args, parser, device):
    defaults = sparse.GPU_DEFAULTS if device.type == "cuda" else sparse.CPU_DEFAULTS
    args.sparse_seqlens = args.sparse_seqlens or defaults["sparse_seqlens"]
    args.sparse_masks = args.sparse_masks or defaults["sparse_masks"]
    if min(args.sparse_seqlens) < 1:
        parser.error("--sparse-seqlens must be >= 1")
    for spec in args.sparse_masks:
        try:
            sparse.parse_mask(spec)
        except ValueError as e:
            parser.error(f"--sparse-masks: {e}")


def _version(package):
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def collect_meta(args, argv, device):
    """Machine, versions and the exact command, for results.json."""
    cuda = device.type == "cuda"
    config = {k: v for k, v in vars(args).items() if k != "heads_for"}
    if "decode" not in args.modes:  # decode settings only matter for decode runs
        config = {k: v for k, v in config.items() if k not in ("cache_lens", "decode_batch", "page_size",
                                                               "decode_heads", "decode_providers", "max_seconds",
                                                               "decode_warmup", "decode_rep")}
    if "sparse" not in args.modes:
        config = {k: v for k, v in config.items() if k not in ("sparse_seqlens", "sparse_masks", "sparse_providers")}
    return {
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if cuda else "cpu",
        "cpu_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "triton": _version("triton"),
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "cuda": torch.version.cuda,
        "flashtile": _version("flashtile"),
        "flash_attn": _version("flash_attn") or _version("flash-attn"),
        "python": platform.python_version(),
        "command": "python -m flashtile.bench" + "".join(" " + shlex.quote(a) for a in argv),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "config": config,
        "peak_mem_method": ("torch.cuda.max_memory_allocated during one fwd+bwd, minus memory allocated before"
                            if cuda else "estimate: live tensor-storage bytes created by torch ops during one "
                            "fwd+bwd (TorchDispatchMode tracker), excludes allocator overhead"),
    }


def main(argv=None):
    """Run the benchmark; returns the exit status. ``argv`` defaults to sys.argv[1:]."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA GPU is available")
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda", torch.cuda.current_device()) if use_cuda else torch.device("cpu")
    resolve(args, parser, device)

    dense_modes = [m for m in args.modes if m not in ("decode", "sparse")]
    providers = []
    for name in args.providers if dense_modes else ():
        reason = PROVIDERS[name].unavailable(device)
        if reason:
            print(f"skip {name}: {reason}")
        else:
            providers.append(PROVIDERS[name])
    decoders = decode.available(args.decode_providers, device) if "decode" in args.modes else []
    # flex and the portable-sparse A/B (the Gluon forward's counterpart) only mean something on a GPU.
    sparse_names = [n for n in args.sparse_providers if n not in ("flex", "flashtile-sparse-portable")
                    or device.type == "cuda"] if "sparse" in args.modes else []
    meta = collect_meta(args, argv, device)
    print(f"device {meta['gpu']}, torch {meta['torch']}, triton {meta['triton']}, dtype {args.dtype}, "
          f"providers: {', '.join(p.name for p in providers) or 'none'}"
          + (f", decode providers: {', '.join(decoders) or 'none'}" if "decode" in args.modes else ""))
    if not providers and not decoders and not sparse_names:
        print("nothing to run")
        return 1

    start = time.perf_counter()
    os.makedirs(args.out, exist_ok=True)
    dense = argparse.Namespace(**{**vars(args), "modes": dense_modes})
    records = report.annotate(sweep.run_sweep(dense, providers, device)) if providers else []
    probes = []
    if args.probe_cap and providers:
        for provider in providers:
            if provider.name in ("standard", "flashtile"):
                print(f"probing the longest sequence for {provider.name} (up to {args.probe_cap}) ...",
                      file=sys.stderr)
                probes.append(sweep.probe_max_seqlen(provider, args, device))
    deadline = None if args.max_seconds is None else start + args.max_seconds
    decode_records = decode.run_decode(args, decoders, device, jsonl=os.path.join(args.out, "decode.jsonl"),
                                       deadline=deadline) if decoders else []
    sparse_records = sparse.run_sparse(args, sparse_names, device) if sparse_names else []
    meta["wall_s"] = round(time.perf_counter() - start, 1)

    for mode in dense_modes if providers else ():
        print()
        print(report.format_table(records, mode))
    if providers:
        print()
        print(report.paper_tables(records, probes))
    summaries = report.feature_summaries(records)
    if summaries:
        print()
        print(summaries)
    if decode_records:
        print()
        print(decode.format_table(decode_records))
    if sparse_records:
        print()
        print(sparse.format_table(sparse_records))

    report.write_json(os.path.join(args.out, "results.json"), meta, records + decode_records + sparse_records, probes)
    report.write_csv(os.path.join(args.out, "results.csv"), records + decode_records + sparse_records)
    written = ["results.json", "results.csv"] + (["decode.jsonl"] if decoders else [])
    if not args.no_plots and records:
        try:
            title = f"{meta['gpu']}, {args.dtype}, torch {meta['torch']}"
            written += [os.path.basename(p) for p in report.write_plots(args.out, records, title)]
        except ImportError:
            print("skip plots: matplotlib is not installed (pip install matplotlib)")
    print(f"\nwrote {', '.join(written)} to {args.out}/ ({meta['wall_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
