"""Host time of flashtile's own Python on the attention path, measured on a CPU box (no GPU needed).

    env -u TRITON_INTERPRET PYTHONPATH=src python benchmarks/host_dispatch_cpu.py [--reps 7] [--calls 2000]
    env -u TRITON_INTERPRET PYTHONPATH=/tmp/t36:src python benchmarks/host_dispatch_cpu.py --e2e [--reps 7]

--e2e: the whole call instead, flash_attn_func's forward (no grad, and with grad) and forward + .backward(), through
fast_launch and triton 3.6's own JITFunction / CompiledKernel / CudaLauncher objects: a stub driver (device 0, stream
0, sm90), each kernel's JITFunction.run answered by a CompiledKernel whose CudaLauncher.launch (the C function on a
GPU) does nothing, and the launchers' CUDA checks routed to CPU tensors. So each number is all the host's Python of a
call, triton's included, short of the C launch (and of the tensor-map encoding that triton's wrap_handle_tensordesc
does around it for descriptors), with CPU torch.empty for the allocations (B1 H1 D128 bf16: S512 forward, S1024
backward, the Gluon backward's threshold; and D64 causal S512, which runs the portable kernels), and of
flash_attn_with_kvcache decode steps as host_time.py --decode makes them (B8 4K: plain, with an append, 16-token
pages, ALiBi + cache_leftpad). FLASHTILE_FAST_LAUNCH=0 / 1 as on the GPU.

The kernels are replaced by recorders (kernel[grid](...) does nothing), the device is declared a Hopper with
132 SMs, and CPU tensors stand in for CUDA ones, as tests/test_gluon_bias.py does; so each number is the Python of
one stage without triton's launch path (branch fast-launch) and without a GPU. Needs a triton with Gluon's Hopper
API (3.6) and TRITON_INTERPRET unset. CPU torch.empty / torch.zeros differ from the CUDA caching allocator's
cost, so the launcher rows take their buffers from a cache (_CachedAlloc), allocation is timed apart ("alloc:"
rows) and the shapes are small (B2 S512/S1024 H4 D128 bf16; the host path does not depend on the sizes). Prints,
per stage, the min and the median over --reps repetitions of the mean time per call (us): on a shared, noisy box
the min is the number to compare (run before and after alternately, several times).
"""
import argparse
import os
import statistics
import time

import torch

if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    raise SystemExit("run with TRITON_INTERPRET unset (env -u TRITON_INTERPRET ...)")

import flashtile
from flashtile import bwd_launch, configs, gluon_bwd_launch, gluon_launch, gluon_variants, kvcache_launch, launch, ops


class _Recorder:
    """Stands in for a JITFunction: kernel[grid](*args, **kwargs) does nothing."""

    def __getitem__(self, grid):
        return _noop


def _noop(*args, **kwargs):
    return None


def _patch():
    """Pretend: a Hopper with 132 SMs, every tensor on it, kernels that do nothing."""
    if gluon_launch._attn_fwd_hopper is None:
        raise SystemExit(f"no Gluon in this triton: {gluon_launch.GLUON_IMPORT_ERROR}")
    gluon_launch._attn_fwd_hopper = gluon_launch._attn_fwd_hopper_persistent = _Recorder()
    gluon_launch._supported_device = lambda *tensors: True
    gluon_bwd_launch._supported_device = lambda *tensors: True
    gluon_bwd_launch._attn_bwd_dkdv_hopper = _Recorder()
    gluon_launch._sm_count = lambda device_index: 132
    torch.cuda.current_device = lambda: 0  # CPU tensors have no device index
    launch._arch = lambda device: (9, 0)
    launch._attn_fwd = _Recorder()
    for name in ("_attn_bwd_preprocess", "_attn_bwd_dkdv", "_attn_bwd_dq", "_attn_bwd_dq_convert"):
        setattr(bwd_launch, name, _Recorder())


class _CachedAlloc:
    """torch.empty / zeros / full answered from a cache of one tensor per (shape, dtype): CPU allocation of
    megabytes (page faults, memset) is slow and noisy, unlike the CUDA caching allocator, so the stage rows
    leave it out and the "alloc:" rows time it apart."""

    def __init__(self):
        self.cache, self.saved = {}, None

    def _get(self, *shape, dtype=None, **kwargs):
        # torch.empty(*sizes) (launch._empty) or torch.empty(size_tuple)
        shape = tuple(shape[0]) if len(shape) == 1 and not isinstance(shape[0], int) else shape
        key = (shape, dtype)
        t = self.cache.get(key)
        if t is None:
            t = self.cache[key] = self.saved[0](shape, dtype=dtype)
        return t

    def __enter__(self):
        self.saved = torch.empty, torch.zeros, torch.full
        torch.empty = torch.zeros = self._get
        torch.full = lambda shape, value, **kwargs: self._get(shape, **kwargs)

    def __exit__(self, *exc):
        torch.empty, torch.zeros, torch.full = self.saved


def _time(fn, calls, reps):
    for _ in range(min(calls, 200)):
        fn()
    per_call = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        per_call.append((time.perf_counter() - t0) / calls * 1e6)
    return min(per_call), statistics.median(per_call)


def stages(calls, reps):
    dt = torch.bfloat16
    b, h, d = 2, 4, 128
    q = torch.randn(b, 512, h, d, dtype=dt)
    out, lse = torch.empty_like(q), torch.empty(b, h, 512)
    scale = d ** -0.5
    fwd_features = dict(window_size=(-1, -1), softcap=0.0, alibi_slopes=None, sink=None)
    cfg = gluon_variants.VARIANTS["persistent-tma"][d]

    # Backward at 1K keys (the Gluon backward's threshold at D128).
    q1 = torch.randn(b, 1024, h, d, dtype=dt)
    out1, dout1, lse1 = torch.randn_like(q1), torch.randn_like(q1), torch.randn(b, h, 1024)
    pad = 1024  # seqlen_q rounded up to the Gluon backward's 64-row tiles
    delta1, lse2 = torch.empty(b, h, pad), torch.empty(b, h, pad)
    dq_accum = torch.zeros(b, pad, h, d)
    dk1, dv1, dq1 = torch.empty_like(q1), torch.empty_like(q1), torch.empty_like(q1)
    bwd_cfg = gluon_bwd_launch.VARIANTS["default"][d]
    tile = gluon_bwd_launch.dq_tile(bwd_cfg, d, False)  # the launches' tiled dQ buffer ((64, 128) at D256)
    geo1 = launch.Geometry.of(q1, q1)

    # The op implementations replaced by constants: what is left is the interface's checks and autograd.
    # Tiny tensors here: the autograd engine's gradient accumulation copies them (a CPU cost of the size).
    fwd_impl, bwd_impl = ops._IMPLS[ops.fwd], ops._IMPLS[ops.bwd]
    tiny = torch.randn(1, 16, 1, d, dtype=dt)
    tiny_out, tiny_lse = torch.empty_like(tiny), torch.empty(1, 1, 16)
    qg, kg, vg = (tiny.clone().requires_grad_() for _ in range(3))
    ops._IMPLS[ops.fwd] = lambda *a: (tiny_out, tiny_lse)
    ops._IMPLS[ops.bwd] = lambda *a: (torch.empty_like(tiny), torch.empty_like(tiny), torch.empty_like(tiny),
                                      tiny.new_empty(0), tiny.new_empty(0))
    grad = torch.empty_like(tiny)

    def fwd_bwd_grad():
        qg.grad = kg.grad = vg.grad = None
        flashtile.flash_attn_func(qg, kg, vg).backward(grad)

    rows = [
        ("flash_attn_func, no grad (op = constant)", lambda: flashtile.flash_attn_func(tiny, tiny, tiny)),
        ("flash_attn_func, grad (op = constant)", lambda: flashtile.flash_attn_func(qg, kg, vg)),
        ("flash_attn_func + .backward (ops = constants)", fwd_bwd_grad),
    ]

    def restore_ops():
        ops._IMPLS[ops.fwd], ops._IMPLS[ops.bwd] = fwd_impl, bwd_impl

    fwd_rows = [
        ("launch._gluon_forward [persistent-tma] S512", lambda: launch._gluon_forward(
            q, q, q, scale, -1, -1, 0.0, None, None)),
        ("  configs wanted + variant + tested_triton", lambda: gluon_launch.tested_triton()
         and configs.gluon_fwd_wanted(d, False, 512, None) and configs.gluon_fwd_variant(d, False, 512, True)),
        ("  gluon_launch.gluon_supported", lambda: gluon_launch.gluon_supported(q, q, q, **fwd_features)),
        ("  gluon_launch.gluon_forward", lambda: gluon_launch.gluon_forward(
            q, q, q, scale, variant="persistent-tma", **fwd_features)),
        ("    persistent_launch_args", lambda: gluon_launch.persistent_launch_args(
            q, q, q, out, lse, scale, False, cfg)),
        ("    alloc: launch._empty x2 (CPU)", lambda: (launch._empty(q.shape, q),
                                                      launch._empty((b, h, 512), q, torch.float32))),
        ("launch._flash_attn_forward, portable S512 (CPU q)", lambda: launch._flash_attn_forward(
            q, q, q, scale, -1, -1, 0.0, None, None)),
    ]
    bwd_rows = [
        ("bwd_launch._flash_attn_backward, portable S512", lambda: bwd_launch._flash_attn_backward(
            out, q, q, q, out, lse, None, scale, -1, -1, 0.0, None)),
        ("bwd_launch._gluon_backward S1024", lambda: bwd_launch._gluon_backward(
            dout1, q1, q1, q1, out1, lse1, None, scale, False)),
        ("  configs.gluon_bwd_wanted + tested_triton", lambda: gluon_launch.tested_triton()
         and configs.gluon_bwd_wanted(d, False, 1024, None)),
        ("  gluon_bwd_launch.gluon_bwd_supported", lambda: gluon_bwd_launch.gluon_bwd_supported(
            q1, q1, q1, out1, dout1, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None)),
        ("  gluon_bwd_launch.gluon_backward", lambda: gluon_bwd_launch.gluon_backward(
            dout1, q1, q1, q1, out1, lse1, scale, False)),
        ("    preprocess_launch(...).run()", lambda: bwd_launch.preprocess_launch(
            geo1, out1, dout1, lse1, None, delta1, lse2, dq_accum=dq_accum, dq_tile=tile).run()),
        ("    dkdv_launch_args", lambda: gluon_bwd_launch.dkdv_launch_args(
            q1, q1, q1, dout1, lse2, delta1, dk1, dv1, dq_accum, scale, False, bwd_cfg)),
        ("    dq_convert_launch(...).run()",
         lambda: bwd_launch.dq_convert_launch(dq_accum, dq1, scale, tile=tile).run()),
        ("    alloc: launch._empty x5 (CPU)", lambda: [launch._empty(s, q1, t) for s, t in (
            ((b, h, pad), torch.float32), ((b, h, pad), torch.float32), (q1.shape, None), (q1.shape, None),
            (q1.shape, None))]),
        ("    alloc: torch.zeros dq_accum (CPU)", lambda: torch.zeros((b, pad, h, d), dtype=torch.float32)),
    ]
    results = []
    try:
        for name, fn in rows:
            results.append((name, *_time(fn, calls, reps)))
    finally:
        restore_ops()
    alloc = _CachedAlloc()
    for name, fn in fwd_rows + bwd_rows:
        if "alloc:" in name:
            results.append((name, *_time(fn, calls, reps)))
        else:
            with alloc:
                results.append((name, *_time(fn, calls, reps)))
    return results


class StubDriver:
    """triton's active driver on a machine without a GPU: device 0, stream 0, an sm90 target."""

    def get_current_device(self):
        return 0

    def get_current_stream(self, device):
        return 0

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget
        return GPUTarget("cuda", 90, 32)


def _stub_kernel(kernel):
    """kernel.run (JITFunction.run: binder, cache, compile) answers with a CompiledKernel whose launcher is a real
    CudaLauncher but for its C launch function, which does nothing."""
    from triton.backends.nvidia.driver import CudaLauncher
    from triton.compiler import CompiledKernel
    launcher = CudaLauncher.__new__(CudaLauncher)
    launcher.launch = _noop
    launcher.num_ctas, launcher.launch_cooperative_grid, launcher.launch_pdl = 1, False, False
    launcher.global_scratch_size = launcher.profile_scratch_size = 0
    launcher.global_scratch_align = launcher.profile_scratch_align = 1
    compiled = CompiledKernel.__new__(CompiledKernel)
    compiled.module, compiled.function, compiled.packed_metadata, compiled._run = "stub", 0, (4, 1, 0), launcher
    compiled.name, compiled.src = kernel.__name__, None
    kernel.run = lambda *args, grid, warmup, **kwargs: compiled


def e2e(calls, reps):
    """Rows of the whole call (--e2e)."""
    from triton.runtime.driver import driver

    from flashtile import fast_launch
    if gluon_launch._attn_fwd_hopper is None or not gluon_launch.tested_triton():
        raise SystemExit(f"--e2e needs triton 3.6 with Gluon (PYTHONPATH=/tmp/t36:src); got "
                         f"{__import__('triton').__version__} {gluon_launch.GLUON_IMPORT_ERROR or ''}")
    driver.set_active(StubDriver())
    for kernel in (gluon_launch._attn_fwd_hopper, gluon_launch._attn_fwd_hopper_persistent,
                   gluon_bwd_launch._attn_bwd_dkdv_hopper, bwd_launch._attn_bwd_preprocess,
                   bwd_launch._attn_bwd_dq_convert, launch._attn_fwd, bwd_launch._attn_bwd_dkdv,
                   bwd_launch._attn_bwd_dq):
        _stub_kernel(kernel)
    gluon_launch._supported_device = gluon_bwd_launch._supported_device = lambda *tensors: True
    gluon_launch._sm_count = lambda device_index: 132
    torch.cuda.current_device = lambda: 0
    launch._arch = lambda device: (9, 0)
    torch.Tensor.is_cuda = property(lambda self: True)  # the launchers' Gluon gates (as tests/test_gluon_bias.py)
    ops._runs_triton = lambda t: True
    dt = torch.bfloat16
    q = torch.randn(1, 512, 1, 128, dtype=dt)
    q1, k1, v1 = (torch.randn(1, 1024, 1, 128, dtype=dt, requires_grad=True) for _ in range(3))
    grad = torch.randn_like(q1)

    def fwd_bwd():
        q1.grad = k1.grad = v1.grad = None
        flashtile.flash_attn_func(q1, k1, v1).backward(grad)

    q64, k64, v64 = (torch.randn(1, 512, 1, 64, dtype=dt, requires_grad=True) for _ in range(3))
    grad64 = torch.randn_like(q64)

    def fwd_bwd_portable():
        q64.grad = k64.grad = v64.grad = None
        flashtile.flash_attn_func(q64, k64, v64, causal=True).backward(grad64)

    rows = [("e2e forward, no grad, S512", lambda: flashtile.flash_attn_func(q, q, q)),
            ("e2e forward, grad, S1024", lambda: flashtile.flash_attn_func(q1, k1, v1)),
            ("e2e forward + backward, S1024", fwd_bwd),
            ("e2e portable forward, grad, D64 causal S512", lambda: flashtile.flash_attn_func(q64, k64, v64,
                                                                                           causal=True)),
            ("e2e portable forward + backward, D64 causal S512", fwd_bwd_portable)]
    results = [(name, *_time(fn, calls, reps)) for name, fn in rows]
    results.insert(3, ("  backward alone (difference of the two above)", results[2][1] - results[1][1],
                       results[2][2] - results[1][2]))
    results += [(name, *_time(fn, calls, reps)) for name, fn in _decode_rows()]
    results.append((f"  fast_launch [fast, recorded] launches: {fast_launch.counts}", 0.0, 0.0))
    plans = getattr(flashtile, "plans", None)  # imported by launch.py where it exists (older trees: A / B runs)
    if plans is not None:
        results.append((f"  plans [replayed, recorded]: {plans.counts}", 0.0, 0.0))
    return results


def _decode_rows():
    """flash_attn_with_kvcache decode steps as host_time.py --decode makes them (B8, one query, 32 / 4 heads, D128 bf16,
    4K cached tokens, an int cache_seqlens): contiguous, with a one-token append, 16-token pages, ALiBi + left
    padding. The split-KV, combine and append kernels are stubbed as the others (e2e's setup)."""
    for kernel in (kvcache_launch._attn_fwd_splitkv, kvcache_launch._attn_combine, kvcache_launch._rotary_append):
        _stub_kernel(kernel)
    torch.cuda.is_current_stream_capturing = lambda: False
    dt, batch, length = torch.bfloat16, 8, 4096
    q = torch.randn(batch, 1, 32, 128, dtype=dt)
    k_cache, v_cache = (torch.zeros(batch, length + 1, 4, 128, dtype=dt) for _ in range(2))
    k_new, v_new = (torch.randn(batch, 1, 4, 128, dtype=dt) for _ in range(2))
    pages = torch.zeros(batch * length // 16, 16, 4, 128, dtype=dt)
    table = torch.arange(batch * length // 16, dtype=torch.int32).view(batch, -1)
    slopes = torch.rand(batch, 32)
    pads = torch.zeros(batch, dtype=torch.int32)
    step = flashtile.flash_attn_with_kvcache
    return [("e2e decode step B8 4K", lambda: step(q, k_cache, v_cache, cache_seqlens=length)),
            ("e2e decode step B8 4K + append", lambda: step(q, k_cache, v_cache, k_new, v_new, cache_seqlens=length)),
            ("e2e decode step B8 4K, 16-token pages", lambda: step(q, pages, pages, cache_seqlens=length,
                                                                  block_table=table)),
            ("e2e decode step B8 4K, ALiBi + cache_leftpad", lambda: step(q, k_cache, v_cache, cache_seqlens=length,
                                                                         alibi_slopes=slopes, cache_leftpad=pads))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--e2e", action="store_true", help="the whole call with triton 3.6's launch path (see above)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.e2e:
        print(f"torch {torch.__version__}, triton {__import__('triton').__version__}, FLASHTILE_FAST_LAUNCH="
              f"{os.environ.get('FLASHTILE_FAST_LAUNCH', '1')}; us per call: min of {args.reps} x {args.calls} "
              f"calls (median)")
        for name, low, med in e2e(args.calls, args.reps):
            print(f"{name:52s} {low:8.1f} ({med:.1f})")
        return
    _patch()
    print(f"torch {torch.__version__}, triton {__import__('triton').__version__}; us per call: min of "
          f"{args.reps} x {args.calls} calls (median)")
    for name, low, med in stages(args.calls, args.reps):
        print(f"{name:52s} {low:8.1f} ({med:.1f})")


if __name__ == "__main__":
    main()
