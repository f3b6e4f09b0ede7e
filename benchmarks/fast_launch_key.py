"""CPU-only: what fast_launch's key and launch() cost against triton's binder + cache key, and whether the key
ever conflates two launches triton tells apart, on flashtile's real launch arguments (no GPU: CPU tensors, an
sm90 target).

    PYTHONPATH=src:/tmp/t36 python3 benchmarks/fast_launch_key.py  # pip install --target /tmp/t36 triton==3.6.0

Per kernel it prints the us per call of (a) triton's binder(*args, **kwargs) + compute_cache_key, the part of
JITFunction.run the fast path skips besides launch_metadata and the hook calls, and (b) fast_launch's
checks + call_key + cache lookup. Then it perturbs the arguments (sequence lengths 1 / 16-multiples / odd,
misaligned pointers, other dtypes and constexprs) and asserts: equal fast_launch keys => equal triton keys.
Last, the whole host path short of the driver's launch: kernel[grid](...) (JITFunction.run) against
fast_launch.launch on a cache hit, with a stub driver (device 0, stream 0, an sm90 target) and a CompiledKernel
whose launcher does nothing, so both measure only their Python around the launcher.
The two paths are timed alternately, min of 9 rounds (other processes on a shared CPU add noise).
"""
import os
import sys
import timeit

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.backends.nvidia.compiler import CUDABackend  # noqa: E402
from triton.runtime.jit import compute_cache_key, create_function_from_signature  # noqa: E402

from flashtile import configs, fast_launch, gluon_launch, gluon_variants, launch  # noqa: E402
from host_dispatch_cpu import StubDriver  # noqa: E402  (this folder)

BACKEND = CUDABackend(GPUTarget("cuda", 90, 32))


def triton_key(kernel, binder, kkc, args, kwargs):
    kwargs = dict(kwargs, debug=kwargs.get("debug", kernel.debug) or triton.knobs.runtime.debug,
                  instrumentation_mode=triton.knobs.compilation.instrumentation_mode)  # as JITFunction.run
    _, spec, options = binder(*args, **kwargs)
    return compute_cache_key(kkc, spec, options)


def fast_key(kernel, args, kwargs, generic=False):
    """fast_launch's key of a call (device 0): call_key (sig_key where it applies), or with generic spec_key."""
    rt = fast_launch._runtime()
    plan_key = (id(kernel), len(args), tuple(kwargs))
    plan = fast_launch._plans.get(plan_key) or fast_launch._plans.setdefault(
        plan_key, fast_launch._Plan(kernel, len(args), tuple(kwargs)))
    bound = fast_launch.bound_args(plan, args, kwargs)
    options = (0, fast_launch.option_values(plan, kwargs, rt.knobs))
    if generic:
        return fast_launch.spec_key(kernel, plan, bound, options)
    return fast_launch.call_key(plan, bound, options, rt)


def fast_overhead(kernel, args, kwargs):
    """fast_launch.launch's own work on a hit, short of the device / stream getters and the launcher call."""
    rt = fast_launch._runtime()
    if not fast_launch.enabled() and not rt:
        return
    if (getattr(type(kernel), "run", None) is not rt.JITFunction.run or kernel.pre_run_hooks
            or not fast_launch._hooks_idle(rt.knobs) or "debug" in kwargs):
        return
    plan = fast_launch._plans.get((id(kernel), len(args), tuple(kwargs)))
    bound = fast_launch.bound_args(plan, args, kwargs)
    key = fast_launch.call_key(plan, bound, (0, fast_launch.option_values(plan, kwargs, rt.knobs)), rt)
    fast_launch._cache.get(key)
    kernel.used_global_vals and fast_launch._globals_unchanged(kernel)


def measure(name, kernel, args, kwargs, variants):
    binder = create_function_from_signature(kernel.signature, kernel.params, BACKEND)
    kkc = {}
    fast_launch._plans[(id(kernel), len(args), tuple(kwargs))] = fast_launch._Plan(kernel, len(args), tuple(kwargs))
    t_triton, t_fast = _alternate([lambda: triton_key(kernel, binder, kkc, args, kwargs),
                                   lambda: fast_overhead(kernel, args, kwargs)])
    print(f"{name:34s} triton binder+key {t_triton * 1e6:6.2f} us   fast_launch key+checks {t_fast * 1e6:6.2f} us")
    for generic in (False, True):
        seen = {}
        for a, kw in [(args, kwargs)] + variants:
            fk, tk = fast_key(kernel, a, kw, generic), triton_key(kernel, binder, kkc, a, kw)
            assert fk is not None, name
            if fk in seen:
                assert seen[fk] == tk, f"{name}: one fast key, two triton keys:\n{seen[fk]}\n{tk}"
            seen[fk] = tk
        print(f"{'':34s} {len(variants) + 1} argument sets: {len(seen)} {'spec_key' if generic else 'call_key'} "
              f"keys, {len(set(seen.values()))} triton keys")


def _alternate(fns, n=5000, rounds=9):
    best = [float("inf")] * len(fns)
    for _ in range(rounds):
        for i, f in enumerate(fns):
            best[i] = min(best[i], timeit.timeit(f, number=n) / n)
    return best


def measure_launch(name, kernel, grid, args, kwargs):
    """JITFunction.run vs fast_launch.launch (hit), launcher stubbed out."""
    from triton.compiler import CompiledKernel
    from triton.runtime.driver import driver
    driver.set_active(StubDriver())
    try:
        compiled = CompiledKernel.__new__(CompiledKernel)
        compiled.module, compiled.function, compiled.packed_metadata, compiled.name = "stub", 0, (), name
        launches = []
        compiled.src, compiled._run = None, lambda *a: launches.append(a)
        kernel.run.__func__  # a real JITFunction
        # put the stub where JITFunction.run finds it: the cache key its binder computes for these arguments
        kernel_cache, kkc, _, _, binder = kernel.device_caches[0]
        kernel_cache[triton_key(kernel, binder, kkc, args, kwargs)] = compiled
        kernel[grid](*args, **kwargs)
        fast_launch._on = True
        fast_launch.launch(kernel, grid, args, kwargs)  # records the entry
        launches.clear()
        jit_calls = []
        kernel.pre_run_hooks.append(lambda *a, **k: jit_calls.append(1))  # counts JITFunction.run calls
        kernel[grid](*args, **kwargs)
        kernel.pre_run_hooks.clear()
        fast_launch.launch(kernel, grid, args, kwargs)
        # the same launcher arguments, but launch_metadata and the (empty) hook chains, which the fast path passes
        # as None: (gridX, gridY, gridZ, stream, function, packed_metadata, launch_metadata, enter, exit, *args)
        same = lambda a, b: len(a) == len(b) and all(x is y or x == y for x, y in zip(a, b))  # noqa: E731
        assert len(jit_calls) == 1 and len(launches) == 2, "fast_launch.launch did not take the fast path"
        assert same(launches[0][:6], launches[1][:6]) and same(launches[0][9:], launches[1][9:]), launches
        assert launches[1][6:9] == (None, None, None) and not launches[0][7].calls and not launches[0][8].calls
        t_jit, t_fast = _alternate([lambda: kernel[grid](*args, **kwargs),
                                    lambda: fast_launch.launch(kernel, grid, args, kwargs)])
        print(f"{name:34s} JITFunction.run {t_jit * 1e6:6.2f} us   fast_launch.launch {t_fast * 1e6:6.2f} us   "
              f"saved {(t_jit - t_fast) * 1e6:6.2f} us (launchers stubbed)")
    finally:
        driver._active = None  # no real driver here to reset to
        fast_launch._on = None
        fast_launch.clear()


def qkv(b, s, h, d, dtype=torch.bfloat16, offset=0):
    if offset:
        flat = torch.empty(b * s * h * d * 3 + offset, dtype=dtype)[offset:]
        return tuple(flat[i * b * s * h * d:(i + 1) * b * s * h * d].view(b, s, h, d) for i in range(3))
    return tuple(torch.empty(b, s, h, d, dtype=dtype) for _ in range(3))


def gluon_persistent(b, s, h, d, causal=False, dtype=torch.bfloat16, offset=0):
    q, k, v = qkv(b, s, h, d, dtype, offset)
    out, lse = torch.empty_like(q), torch.empty(b, h, s)
    config = gluon_variants.VARIANTS[configs.gluon_fwd_variant(d, causal, s, plain=True)][d]
    grid, args, constexprs, options = gluon_launch.persistent_launch_args(q, k, v, out, lse, d ** -0.5, causal,
                                                                          config, sm_count=132)
    return args, {**constexprs, **options}


def portable(b, s, h, d, causal=False, dtype=torch.bfloat16, sk=None):
    q = torch.empty(b, s, h, d, dtype=dtype)
    k = v = torch.empty(b, sk or s, h, d, dtype=dtype)
    out, lse = torch.empty_like(q), torch.empty(b, h, s)
    geo = launch.Geometry.of(q, k)
    sa = launch.ScoreArgs.make(geo, d ** -0.5, -1, 0 if causal else -1, 0.0, None, lse)
    kl = launch.forward_launches(geo, q, k, v, out, lse, None, sa, (9, 0), False)[0]
    return kl.kernel, kl.args, {**kl.constexprs, "num_warps": kl.num_warps, "num_stages": kl.num_stages}


def main():
    print(f"triton {triton.__version__}, torch {torch.__version__}, python {sys.version.split()[0]}")
    args, kw = gluon_persistent(32, 512, 16, 128)
    variants = [gluon_persistent(*shape) for shape in
                [(32, 512, 16, 128, True), (1, 1, 16, 128), (2, 17, 16, 128), (32, 513, 16, 128), (4, 1024, 1, 128),
                 (32, 512, 16, 64), (32, 512, 16, 128, False, torch.float16), (32, 512, 16, 128, False,
                                                                              torch.bfloat16, 8),
                 (3, 48, 16, 128), (3, 49, 16, 128), (32, 512, 16, 128, False, torch.bfloat16, 64)]]
    measure("gluon _attn_fwd_hopper_persistent", gluon_launch._attn_fwd_hopper_persistent, args, kw, variants)
    kernel, args, kw = portable(32, 512, 16, 128)
    variants = [portable(*shape)[1:] for shape in
                [(32, 512, 16, 128, True), (1, 1, 16, 128), (2, 17, 16, 128), (32, 513, 16, 128),
                 (4, 1024, 1, 128), (32, 512, 16, 64), (32, 512, 16, 128, False, torch.float16),
                 (2, 16, 16, 128, False, torch.bfloat16, 1), (2, 16, 16, 128, False, torch.bfloat16, 17),
                 (2, 32, 16, 128, False, torch.bfloat16, 16)]]
    measure("portable _attn_fwd", kernel, args, kw, variants)
    args, kw = gluon_persistent(32, 512, 16, 128)
    measure_launch("gluon _attn_fwd_hopper_persistent", gluon_launch._attn_fwd_hopper_persistent, (132,), args, kw)
    kernel, args, kw = portable(32, 512, 16, 128)
    measure_launch("portable _attn_fwd", kernel, (4, 512), args, kw)


if __name__ == "__main__":
    main()
