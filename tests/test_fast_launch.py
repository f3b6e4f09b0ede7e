"""fast_launch: its key is never coarser than triton's specialization, and its dispatch (CPU, no GPU).

The soundness tests compare arg_key with triton's own native_specialize_impl (the installed triton's; run them
with triton 3.6 on PYTHONPATH to check the release the fast path is enabled on): whenever two arguments get one
key, triton must specialize them alike.
"""
import itertools
import types

import pytest
import torch
from triton._C.libtriton import native_specialize_impl
from triton.backends.compiler import BaseBackend
from triton.compiler import CompiledKernel
from triton.runtime.jit import JITFunction

from flashtile import fast_launch
from utils import train_step

INTS = [0, 1, 2, 3, 8, 15, 16, 17, 32, 48, 1024, 1025, -1, -16, -17, 2**31 - 16, 2**31 - 1, 2**31, 2**31 + 16,
        -2**31, -2**31 - 16, 2**40 + 3, 2**63 - 16, 2**63, 2**63 + 16, 2**64 - 16, 2**64 - 1]
FLAGS = list(itertools.product([True, False], repeat=2))  # (specialize, align)


def _triton_spec(v, specialize, align):
    return native_specialize_impl(BaseBackend, v, False, specialize, align)


def _tensors():
    base = torch.empty(256, dtype=torch.float16)
    return [base, base[8:], base[1:], base[3:], base.float(), base.float()[4:], base.float()[1:],
            torch.empty(4, dtype=torch.int32), torch.empty(16, dtype=torch.bfloat16)]


def _assert_sound(values, flags):
    """One key implies one triton specialization (the key may be finer, never coarser)."""
    seen = {}
    for v in values:
        k = fast_launch.arg_key(v, *flags)
        if k is None:
            continue
        spec = _triton_spec(v, *flags)
        if k in seen:
            assert seen[k][1] == spec, f"{seen[k][0]!r} and {v!r} share key {k!r} but triton says {seen[k][1]} / {spec}"
        else:
            seen[k] = (v, spec)


@pytest.mark.parametrize("flags", FLAGS, ids=lambda f: f"spec{int(f[0])}-align{int(f[1])}")
def test_key_sound_scalars(flags):
    _assert_sound(INTS + [True, False, 0.0, -0.0, 1.0, 16.0, 0.5, None], flags)


@pytest.mark.parametrize("flags", FLAGS, ids=lambda f: f"spec{int(f[0])}-align{int(f[1])}")
def test_key_sound_tensors(flags):
    _assert_sound(_tensors(), flags)


@pytest.mark.parametrize("a, b", [(1, 2), (16, 17), (16, 32 + 1), (2**31 - 16, 2**31), (2**63 - 16, 2**63),
                                  (1, True), (0, False), (16, 16.0)])
def test_key_tells_apart_what_triton_does(a, b):
    """Pairs triton specializes differently (an int 1 vs 2, 16 vs 17, i32 vs i64, i64 vs u64, int vs bool/float)."""
    assert _triton_spec(a, True, True) != _triton_spec(b, True, True)
    assert fast_launch.arg_key(a) != fast_launch.arg_key(b)


def test_key_pointer_alignment_and_dtype():
    base = torch.empty(64, dtype=torch.float16)
    assert fast_launch.arg_key(base) != fast_launch.arg_key(base[1:])  # data_ptr % 16 differs
    assert fast_launch.arg_key(base) == fast_launch.arg_key(base[8:])  # 16 bytes on: still aligned
    assert fast_launch.arg_key(base) != fast_launch.arg_key(base.to(torch.bfloat16))
    # do_not_specialize / do_not_specialize_on_alignment: triton ignores the alignment, so may the key
    assert fast_launch.arg_key(base, True, False) == fast_launch.arg_key(base[1:], True, False)
    assert fast_launch.arg_key(16, False, True) == fast_launch.arg_key(17, False, True)
    assert fast_launch.arg_key(1, False, True) == fast_launch.arg_key(2, False, True)
    assert fast_launch.arg_key(1, True, False) != fast_launch.arg_key(2, True, False)  # 1 is still a constexpr


def test_key_unknown_types_take_the_normal_path():
    import numpy as np
    assert fast_launch.arg_key(np.int64(16)) is None
    assert fast_launch.arg_key(torch.nn.Parameter(torch.empty(4))) is None
    assert fast_launch.arg_key(2**64) is None
    assert fast_launch.arg_key((1, 2)) is None  # tuples (none in flashtile's launches)


def test_key_gluon_descriptors():
    hopper = pytest.importorskip("triton.experimental.gluon.nvidia.hopper")
    from triton.experimental.gluon import language as gl

    t16, tb16 = torch.empty(64, 64, dtype=torch.float16), torch.empty(64, 64, dtype=torch.bfloat16)
    lay16 = gl.NVMMASharedLayout.get_default_for([16, 64], gl.float16)
    lay32 = gl.NVMMASharedLayout.get_default_for([32, 64], gl.float16)
    layb = gl.NVMMASharedLayout.get_default_for([16, 64], gl.bfloat16)
    descs = [hopper.TensorDescriptor(t16, [64, 64], [64, 1], [16, 64], lay16),
             hopper.TensorDescriptor(t16[1:], [63, 64], [64, 1], [16, 64], lay16),  # runtime shape: same kernel
             hopper.TensorDescriptor(t16, [64, 64], [64, 1], [32, 64], lay32),
             hopper.TensorDescriptor(tb16, [64, 64], [64, 1], [16, 64], layb),
             hopper.TensorDescriptor(t16, [64, 64], [64, 1], [16, 64], gl.NVMMASharedLayout.get_default_for(
                 [16, 64], gl.float16)),  # an equal layout, another object: may miss, never conflate
             ]
    keys = [fast_launch.arg_key(d) for d in descs]
    assert keys[0] == keys[1]
    assert len({keys[0], keys[2], keys[3]}) == 3
    _assert_sound(descs, (True, True))


def test_constexpr_key():
    k = fast_launch._constexpr_key
    assert k(True) != k(1) and k(1) != k(1.0) and k(0.0) != k(-0.0) and k(None) != k(0)
    assert k(128) == k(128)
    import triton.language as tl
    assert k(tl.float16) == k(tl.float16) and k(tl.float16) != k(tl.bfloat16)
    assert k(tl.constexpr(0.0)) is None and k((1,)) is None and k(object()) is None  # normal path


# --- dispatch, with a fake JIT function and compiled kernel -------------------------------------------------

def _fake_kernel(X, n, scale, BLOCK: "tl.constexpr", FLAG: "tl.constexpr" = False):  # noqa: F821
    pass


class _Fake:
    def __init__(self, monkeypatch):
        self.jit_calls, self.launches = [], []
        self.kernel = JITFunction(_fake_kernel)
        self.compiled = CompiledKernel.__new__(CompiledKernel)
        self.compiled._run = lambda *a: self.launches.append(a)
        self.compiled.function, self.compiled.packed_metadata, self.compiled.module = "function", "packed", None

        def run(*args, grid, warmup, **kwargs):  # stands for JITFunction.run: a normal launch
            self.jit_calls.append((grid, args, kwargs))
            return self.compiled
        self.kernel.run = run
        rt = fast_launch._Runtime()
        rt.driver = types.SimpleNamespace(active=types.SimpleNamespace(get_current_device=lambda: 0,
                                                                       get_current_stream=lambda dev: 1234))
        monkeypatch.setattr(fast_launch, "_rt", rt)
        monkeypatch.setattr(fast_launch, "enabled", lambda: True)
        fast_launch.clear()

    def launch(self, x, n, grid=(3, 2), **kw):
        fast_launch.launch(self.kernel, grid, (x, n, 0.5), {"BLOCK": 64, "num_warps": 4, **kw})


def test_dispatch_fast_after_first(monkeypatch):
    f = _Fake(monkeypatch)
    x = torch.empty(64)
    f.launch(x, 32)
    assert len(f.jit_calls) == 1 and not f.launches
    f.launch(x, 48)  # 48: same specialization (i32, % 16 == 0)
    assert len(f.jit_calls) == 1
    assert f.launches == [(3, 2, 1, 1234, "function", "packed", None, None, None, x, 48, 0.5, 64, False)]
    f.launch(x, 33)  # 33 % 16 != 0: a new specialization, so triton decides
    f.launch(x, 1)  # 1 is a constexpr for triton
    f.launch(x[1:], 32)  # misaligned pointer
    f.launch(x, 32, FLAG=True)  # another constexpr
    f.launch(x, 32, grid=(5,), BLOCK=128)
    assert len(f.jit_calls) == 6 and len(f.launches) == 1
    f.launch(x, 64, grid=(5,), BLOCK=128)
    assert f.launches[-1][:3] == (5, 1, 1) and f.launches[-1][-3:] == (0.5, 128, False)
    assert len(f.jit_calls) == 6


def test_dispatch_options_are_keyed(monkeypatch):
    f = _Fake(monkeypatch)
    x = torch.empty(64)
    f.launch(x, 32)
    f.launch(x, 32, num_warps=8)
    assert len(f.jit_calls) == 2 and not f.launches


def test_dispatch_normal_path_with_hooks(monkeypatch):
    from triton import knobs
    f = _Fake(monkeypatch)
    x = torch.empty(64)
    f.launch(x, 32)
    hook = lambda metadata: None  # noqa: E731
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        f.launch(x, 32)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert len(f.jit_calls) == 2 and not f.launches
    f.kernel.pre_run_hooks.append(lambda *a, **k: None)
    f.launch(x, 32)
    assert len(f.jit_calls) == 3 and not f.launches
    f.kernel.pre_run_hooks.clear()
    f.launch(x, 32, grid=lambda meta: (1,))  # a callable grid: triton evaluates it
    f.launch(x, 32, debug=True)
    assert len(f.jit_calls) == 5 and not f.launches
    f.launch(x, 32)
    assert len(f.launches) == 1


def test_dispatch_unkeyed_arguments_go_through_triton(monkeypatch):
    import numpy as np
    import triton.language as tl
    f = _Fake(monkeypatch)
    x = torch.empty(64)
    for _ in range(2):
        f.launch(x, 32, BLOCK=tl.constexpr(64))  # a constexpr wrapper: not keyed
        f.launch(x, np.int64(32))  # an int type native_specialize_impl handles by other rules
        f.launch(x, 2**40)  # i64: the per-argument key (keyed, so the second call is fast)
    assert len(f.jit_calls) == 5 and len(f.launches) == 1


def test_dispatch_changed_global_goes_through_triton(monkeypatch):
    f = _Fake(monkeypatch)
    x = torch.empty(64)
    f.launch(x, 32)
    g = {"CONST": 1}
    f.kernel.used_global_vals = {("CONST", id(g)): (1, g)}
    g["CONST"] = 2
    f.launch(x, 32)
    assert len(f.jit_calls) == 2 and not f.launches


def test_enabled_switch(monkeypatch):
    """Off by FLASHTILE_FAST_LAUNCH=0 and on an untested triton (both read once, at the first launch)."""
    from flashtile import gluon_launch
    for env, tested, expected in [("0", True, False), ("1", False, False), ("1", True, True), (None, True, True)]:
        if env is None:
            monkeypatch.delenv("FLASHTILE_FAST_LAUNCH", raising=False)
        else:
            monkeypatch.setenv("FLASHTILE_FAST_LAUNCH", env)
        monkeypatch.setattr(gluon_launch, "tested_triton", lambda: tested)
        monkeypatch.setattr(fast_launch, "_on", None)
        assert fast_launch.enabled() is expected


def test_interpreter_kernels_take_the_normal_path(monkeypatch):
    """Under TRITON_INTERPRET the kernels are InterpretedFunctions: launch() hands them to triton untouched."""
    calls = []

    class Interpreted:
        def __getitem__(self, grid):
            return lambda *a, **k: calls.append((grid, a, k))
    monkeypatch.setattr(fast_launch, "_on", True)
    fast_launch.launch(Interpreted(), (2,), (1, 2), {"BLOCK": 16})
    assert calls == [((2,), (1, 2), {"BLOCK": 16})]


def _fake_kernel2(X, Y, n, m, scale, flag, BLOCK: "tl.constexpr", FLAG: "tl.constexpr" = False):  # noqa: F821
    pass


@pytest.mark.parametrize("generic", [False, True], ids=["call_key", "spec_key"])
def test_call_key_sound_against_triton_binder(generic):
    """Whole calls: one fast_launch key => one key of triton's own binder + compute_cache_key (sm90 backend),
    over ints around 1 / 16 / int32, aligned and misaligned pointers, dtypes, do_not_specialize and constexprs."""
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.runtime.jit import compute_cache_key, create_function_from_signature

    kernel = JITFunction(_fake_kernel2, do_not_specialize=["m"], do_not_specialize_on_alignment=["Y"])
    binder = create_function_from_signature(kernel.signature, kernel.params, CUDABackend(GPUTarget("cuda", 90, 32)))
    rt = fast_launch._runtime()
    fast_launch.clear()
    tensors = _tensors()[:4] + _tensors()[4:6]
    seen, triton_keys = {}, set()
    for x, y, n, m, flag, block, kw in itertools.product(
            tensors[::2], tensors[1::2], [1, 2, 16, 17, 2**31, -16], [1, 16, 17, 2**40], [True, 0.5],
            [64, True, 1.0, -0.0, 0.0], [{}, {"FLAG": True}, {"num_warps": 8}]):
        args, kwargs = (x, y, n, m, 0.5, flag), {"BLOCK": block, **kw}
        plan_key = (id(kernel), len(args), tuple(kwargs))
        plan = fast_launch._plans.setdefault(plan_key, fast_launch._Plan(kernel, len(args), tuple(kwargs)))
        bound = fast_launch.bound_args(plan, args, kwargs)
        options = (0, fast_launch.option_values(plan, kwargs, rt.knobs))
        fk = (fast_launch.spec_key(kernel, plan, bound, options) if generic else
              fast_launch.call_key(plan, bound, options, rt))
        tkw = dict(kwargs, debug=knobs.runtime.debug, instrumentation_mode=knobs.compilation.instrumentation_mode)
        _, spec, opts = binder(*args, **tkw)
        tk = compute_cache_key({}, spec, opts)
        triton_keys.add(tk)
        assert fk is not None
        assert seen.setdefault(fk, tk) == tk, f"one key for {seen[fk]} and {tk}"
    assert len(triton_keys) > 100  # the cases do exercise triton's specialization


@pytest.mark.gpu
def test_gpu_fast_path_matches_triton_path():
    """On the GPU: repeated calls take the fast path (counts) and give bitwise the outputs and gradients of
    the same calls through JITFunction.run (Gluon forward / backward where they serve, else the portable kernels;
    dQ only to rounding: the Gluon backward adds it up by atomics, in no fixed order)."""
    if not fast_launch.enabled():
        pytest.skip("fast launch off (FLASHTILE_FAST_LAUNCH=0 or an untested triton)")
    run = train_step

    for causal in (False, True):
        run(causal)  # records
        before = fast_launch.counts[0]
        fast = run(causal)
        assert fast_launch.counts[0] > before, "the repeated call did not take the fast path"
        fast_launch._on = False
        try:
            slow = run(causal)
        finally:
            fast_launch._on = True
        for name, a, b in zip(("out", "dq", "dk", "dv"), fast, slow):
            if name == "dq":
                torch.testing.assert_close(a, b, atol=2e-2, rtol=2e-2)
            else:
                assert torch.equal(a, b), name


def _launch_key(kernel, args, kwargs):
    rt = fast_launch._runtime()
    plan_key = (id(kernel), len(args), tuple(kwargs))
    plan = fast_launch._plans.setdefault(plan_key, fast_launch._Plan(kernel, len(args), tuple(kwargs)))
    bound = fast_launch.bound_args(plan, args, kwargs)
    return fast_launch.call_key(plan, bound, (0, fast_launch.option_values(plan, kwargs, rt.knobs)), rt)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_gluon_launch_keys_stable_across_calls(head_dim):
    """Two calls of one shape on fresh tensors give the Gluon launches one fast_launch key (descriptor layouts are
    keyed by identity, so a layout object built per call would miss the cache on every call: the backward's dQ
    descriptor did until session 12)."""
    from flashtile import gluon_bwd_launch, gluon_launch, gluon_variants
    if gluon_bwd_launch._attn_bwd_dkdv_hopper is None or gluon_launch._attn_fwd_hopper is None:
        pytest.skip("no Gluon Hopper API in this triton")

    def backward_key(variant):
        q = torch.empty(2, 300, 4, head_dim, dtype=torch.bfloat16)
        k = torch.empty(2, 500, 2, head_dim, dtype=torch.bfloat16)
        rows, acc = torch.empty(2, 4, 320), torch.empty(2, 320, 4, head_dim)
        _, args, constexprs, options = gluon_bwd_launch.dkdv_launch_args(
            q, k, k, q, rows, rows, torch.empty_like(k), torch.empty_like(k), acc, 0.1, False,
            gluon_bwd_launch.VARIANTS[variant][head_dim])
        return _launch_key(gluon_bwd_launch._attn_bwd_dkdv_hopper, args, {**constexprs, **options})

    def forward_keys(batch):
        q = torch.empty(batch, 512, 4, head_dim, dtype=torch.bfloat16)
        k = torch.empty(batch, 500, 2, head_dim, dtype=torch.bfloat16)  # batch 2: ragged descriptors
        out, lse = torch.empty_like(q), torch.empty(batch, 4, 512)
        config = gluon_variants.VARIANTS["default"][head_dim]
        _, args, constexprs, options = gluon_launch.gluon_launch_args(q, k, k, out, lse, 0.1, False, config)
        keys = [_launch_key(gluon_launch._attn_fwd_hopper, args, {**constexprs, **options})]
        config = gluon_variants.VARIANTS["persistent"][head_dim]
        _, args, constexprs, options = gluon_launch.persistent_launch_args(q, k, k, out, lse, 0.1, False, config,
                                                                           sm_count=132)
        return keys + [_launch_key(gluon_launch._attn_fwd_hopper_persistent, args, {**constexprs, **options})]

    variants = [v for v in ("default", "atomics") if head_dim in gluon_bwd_launch.VARIANTS[v]]
    for variant in variants:
        first = backward_key(variant)
        assert first is not None and backward_key(variant) == first, variant
    for batch in (1, 2):
        first = forward_keys(batch)
        assert None not in first and forward_keys(batch) == first
