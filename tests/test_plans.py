"""Launch plans (plans.py) and fast_launch's direct launcher, on CPU: the Gluon launchers run on CPU tensors
declared CUDA on an sm90, their kernels' JITFunction.run answered by a stub CompiledKernel whose launcher records
what it is given (as benchmarks/host_dispatch_cpu.py --e2e)."""
import os
import threading
import types

import pytest
import torch
from triton.compiler import CompiledKernel
from triton.runtime.jit import JITFunction

from flashtile import bwd_launch, configs, fast_launch, gluon_bwd_launch, gluon_launch, kvcache_launch, launch, plans
from utils import train_step


class _Launcher:
    """A CompiledKernel's launcher: records the kernel's arguments (after grid, stream, function, metadata, hooks)."""

    def __init__(self, calls):
        self.calls = calls

    def __call__(self, *args):
        self.calls.append(args[9:])


def _stub(monkeypatch, module, name, calls):
    kernel = getattr(module, name)
    if not isinstance(kernel, JITFunction):  # the interpreter's function: a JITFunction of the same source
        kernel = JITFunction(kernel.fn)
        monkeypatch.setattr(module, name, kernel)
    compiled = CompiledKernel.__new__(CompiledKernel)
    compiled.module, compiled.function, compiled.packed_metadata = None, name, (4, 1, 0)
    compiled._run = _Launcher(calls)

    def run(*args, grid, warmup, **kwargs):  # JITFunction.run: a normal launch (the arguments, no tail)
        calls.append(args)
        return compiled
    monkeypatch.setattr(kernel, "run", run, raising=False)


@pytest.fixture
def gluon_on_cpu(monkeypatch):
    """Launcher calls (name, args) of the Gluon forward / backward on CPU tensors."""
    if gluon_launch._attn_fwd_hopper is None or gluon_bwd_launch._attn_bwd_dkdv_hopper is None:
        pytest.skip("no Gluon Hopper API in this triton")
    calls = []
    for module, name in ((gluon_launch, "_attn_fwd_hopper"), (gluon_launch, "_attn_fwd_hopper_persistent"),
                         (gluon_bwd_launch, "_attn_bwd_dkdv_hopper"), (bwd_launch, "_attn_bwd_preprocess"),
                         (bwd_launch, "_attn_bwd_dq_convert"), (launch, "_attn_fwd"), (bwd_launch, "_attn_bwd_dkdv"),
                         (bwd_launch, "_attn_bwd_dq")):
        _stub(monkeypatch, module, name, calls)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.delenv("FLASHTILE_GLUON", raising=False)
    monkeypatch.delenv("FLASHTILE_GLUON_BWD", raising=False)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    for module in (gluon_launch, gluon_bwd_launch):
        monkeypatch.setattr(module, "_supported_device", lambda *tensors: True)
        monkeypatch.setattr(module, "_disabled", None)
    monkeypatch.setattr(gluon_launch, "tested_triton", lambda: True)
    monkeypatch.setattr(gluon_launch, "_sm_count", lambda device_index: 132)
    rt = fast_launch._Runtime()
    rt.driver = types.SimpleNamespace(active=types.SimpleNamespace(get_current_device=lambda: 0,
                                                                   get_current_stream=lambda dev: 7))
    monkeypatch.setattr(fast_launch, "_rt", rt)
    monkeypatch.setattr(fast_launch, "_on", True)
    fast_launch.clear()
    plans.clear()
    yield calls
    fast_launch.clear()
    plans.clear()


def _normal(call, tensors):
    """A launch's arguments with its tensors named by their place in `tensors` (the call's inputs and outputs) or by
    shape / dtype / strides (buffers), descriptors by base, shape, strides, block shape and layout object."""
    def one(a):
        if isinstance(a, torch.Tensor):
            for i, t in enumerate(tensors):
                if a is t:
                    return ("tensor", i)
            return ("buffer", tuple(a.shape), a.dtype, a.stride())
        if type(a).__name__ == "TensorDescriptor":
            return ("desc", one(a.base), list(a.shape), list(a.strides), list(a.block_shape), id(a.layout),
                    a.padding)
        return a
    return tuple(map(one, call))


def _forward(q, k, v, scale=0.125, left=-1, right=-1):
    return launch._flash_attn_forward(q, k, v, scale, left, right, 0.0, None, None)


def _qkv(shape=(2, 512, 4, 128), dtype=torch.bfloat16):
    return tuple(torch.randn(shape, dtype=dtype) for _ in range(3))


def test_forward_replays_the_recorded_launch(gluon_on_cpu):
    calls = gluon_on_cpu
    q, k, v = _qkv()
    replayed, recorded = plans.counts[0], plans.counts[1]
    out1, lse1 = _forward(q, k, v)
    assert plans.counts[1] == recorded + 1 and len(calls) == 1
    q2, k2, v2 = _qkv()
    out2, lse2 = _forward(q2, k2, v2)
    assert plans.counts[0] == replayed + 1 and len(calls) == 2
    assert out2 is not out1 and out2.shape == q.shape and lse2.shape == (2, 4, 512)
    first = _normal(calls[0], (q, k, v, out1, lse1))
    assert first == _normal(calls[1][:len(first)], (q2, k2, v2, out2, lse2))


@pytest.mark.parametrize("shape", [(2, 1024, 4, 128), (2, 512, 4, 64)], ids=["gluon", "portable"])
def test_backward_replays_the_recorded_launches(gluon_on_cpu, shape):
    """The second backward of a signature replays the first's three launches: the Gluon backward's preprocess, dK / dV
    and dQ conversion (D128 at 1K keys), or the portable preprocess, dK / dV and dQ (D64 at 512 keys: the Gluon
    backward serves D64 from 1K)."""
    calls = gluon_on_cpu
    args = []
    replayed, recorded = plans.counts
    for _ in range(2):
        q, k, v = _qkv(shape)
        out, dout = torch.randn_like(q), torch.randn_like(q)
        lse = torch.randn(*shape[:1], shape[2], shape[1])
        grads = bwd_launch._flash_attn_backward(dout, q, k, v, out, lse, None, 0.125, -1, -1, 0.0, None)
        args.append((dout, q, k, v, out, lse, *grads[:3]))
    assert len(calls) == 6 and plans.counts == [replayed + 1, recorded + 1]
    for first, second in zip(calls[:3], calls[3:]):
        first = _normal(first, args[0])
        assert first == _normal(second[:len(first)], args[1])


@pytest.mark.parametrize("change", ["strides", "dtype", "causal", "scale", "window", "aliasing", "env"])
def test_what_changes_a_launch_gets_its_own_plan(gluon_on_cpu, monkeypatch, change):
    """Each of these changes the launch (strides and dtypes its arguments and descriptors, causal and the window
    its constexprs, the scale an argument, aliasing which tensor goes where, FLASHTILE_GLUON the kernel choice):
    the call must not replay the other's plan."""
    calls = gluon_on_cpu
    q, k, v = _qkv()
    _forward(q, k, v)
    recorded, replayed = plans.counts[1], plans.counts[0]
    kw = {}
    if change == "strides":  # the same shape, rows twice as far apart: half the heads of a wider tensor
        q = torch.randn(2, 512, 8, 128, dtype=torch.bfloat16)[:, :, :4]
    elif change == "dtype":
        q, k, v = (t.half() for t in (q, k, v))
    elif change == "causal":
        kw = dict(right=0)
    elif change == "scale":
        kw = dict(scale=0.25)
    elif change == "window":
        kw = dict(left=2048, right=2048)
    elif change == "aliasing":
        k = v = q
    else:
        monkeypatch.setenv("FLASHTILE_GLUON", "1")
    out, lse = _forward(q, k, v, **kw)
    assert plans.counts[0] == replayed, "replayed another signature's plan"
    assert plans.counts[1] == recorded + 1 and len(calls) == 2
    if change == "aliasing":
        assert all(desc.base is q for desc in calls[1][:3])  # q, k, v descriptors
    _forward(q, k, v, **kw)
    assert plans.counts[0] == replayed + 1 and len(calls) == 3


def test_misaligned_input_takes_the_normal_path(gluon_on_cpu):
    q, k, v = _qkv()
    _forward(q, k, v)
    plan = next(iter(plans._plans.values()))
    flat = torch.empty(q.numel() + 1, dtype=q.dtype)[1:].view(q.shape)  # 2 bytes off 16
    assert plans.replay(plan, (flat, k, v), lambda shape, dtype: torch.empty(shape, dtype=dtype),
                        gluon_launch.tma_descriptor) is None


def test_features_are_not_planned(gluon_on_cpu):
    q, k, v = _qkv()
    for _ in range(2):
        launch._flash_attn_forward(q, k, v, 0.125, -1, -1, 30.0, None, None)  # softcap
    assert not plans._plans and len(gluon_on_cpu) == 2


def test_portable_forward_is_planned(gluon_on_cpu):
    """A plain call the Gluon forward declines (D64 causal at 256 keys: configs sends it to the portable kernel) is
    planned too: the second call of its signature replays the portable launch (no checks, config choice, grid or
    argument building: the host time of short rows, and of every call on a GPU without the Gluon kernels)."""
    calls = gluon_on_cpu
    q, k, v = _qkv((2, 256, 4, 64))
    assert launch._gluon_forward(q, k, v, 0.125, -1, 0, 0.0, None, None) is None and not calls
    replayed, recorded = plans.counts
    out1, lse1 = _forward(q, k, v, right=0)
    assert plans.counts[1] == recorded + 1 and len(calls) == 1
    q2, k2, v2 = _qkv((2, 256, 4, 64))
    out2, lse2 = _forward(q2, k2, v2, right=0)
    assert plans.counts[0] == replayed + 1 and len(calls) == 2
    first = _normal(calls[0], (q, k, v, out1, lse1))
    assert first == _normal(calls[1][:len(first)], (q2, k2, v2, out2, lse2))


def test_unreplayable_signature_is_declined_once(gluon_on_cpu, monkeypatch):
    """A signature whose launches take an argument a replay cannot rebuild (D256 on an sm90 below the Gluon backward's
    512 keys: the portable dK / dV kernel's "desc" tiles read q and dO through triton TensorDescriptors) is declined
    once (plans.DECLINED): its later calls take the normal path without recording again. A misaligned call keeps
    nothing (its address decided, not its signature)."""
    monkeypatch.setattr(launch, "_arch", lambda device: (9, 0))
    calls = gluon_on_cpu
    q, k, v = _qkv((1, 256, 2, 256))
    out, dout, lse = torch.randn_like(q), torch.randn_like(q), torch.randn(1, 2, 256)
    recorded = plans.counts[1]
    for n in (1, 2):
        bwd_launch._flash_attn_backward(dout, q, k, v, out, lse, None, 0.0625, -1, -1, 0.0, None)
        assert list(plans._plans.values()) == [plans.DECLINED] and plans.counts[1] == recorded
        assert len(calls) == 4 * n  # preprocess, dV, dK, dQ
    plans.clear()
    flat = torch.empty(q.numel() + 1, dtype=q.dtype)[1:].view(q.shape)  # 2 bytes off 16
    for _ in range(2):
        launch._flash_attn_forward(flat, k, v, 0.0625, -1, 0, 0.0, None, None)
    assert not plans._plans


def test_plans_are_bounded(gluon_on_cpu, monkeypatch):
    monkeypatch.setattr(plans, "MAX_PLANS", 3)
    q, k, v = _qkv()
    for i in range(5):
        _forward(q, k, v, scale=0.1 + i)
    assert len(plans._plans) == 3


def test_no_plans_without_fast_launch(gluon_on_cpu, monkeypatch):
    monkeypatch.setattr(fast_launch, "_on", False)
    q, k, v = _qkv()
    for _ in range(2):
        _forward(q, k, v)
    assert not plans._plans


def test_replay_gives_way_to_launch_hooks(gluon_on_cpu):
    """A profiler's launch hook installed after the plan was made: the replayed launch goes through triton's
    JITFunction.run (here the stub's, which records it), so the hook sees it."""
    from triton import knobs
    calls = gluon_on_cpu
    q, k, v = _qkv()
    _forward(q, k, v)
    hook = lambda metadata: None  # noqa: E731
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        fast = fast_launch.counts[0]
        _forward(q, k, v)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert fast_launch.counts[0] == fast and len(calls) == 2


def _cuda_launcher(calls, **sizes):
    from triton.backends.nvidia.driver import CudaLauncher
    launcher = CudaLauncher.__new__(CudaLauncher)
    launcher.launch = lambda *args: calls.append(args)
    launcher.num_ctas, launcher.launch_cooperative_grid, launcher.launch_pdl = 1, False, True
    launcher.global_scratch_size = sizes.get("global_scratch", 0)
    launcher.profile_scratch_size = sizes.get("profile_scratch", 0)
    launcher.global_scratch_align = launcher.profile_scratch_align = 1
    return launcher


def test_direct_launch_passes_what_the_launcher_would():
    """On triton 3.6 the fast path calls CudaLauncher.launch (the C function) itself, with the arguments
    CudaLauncher.__call__ gives it; elsewhere, with scratch memory, or for another launcher type, the launcher."""
    pytest.importorskip("triton.backends.nvidia.driver")
    from triton.backends.nvidia import driver as nvidia_driver
    calls = []
    launcher = _cuda_launcher(calls)
    fast_launch._direct_ok = None
    direct = fast_launch._direct_launch(launcher)
    if getattr(nvidia_driver, "_BASE_ARGS_FORMAT", None) != fast_launch._LAUNCHER_FORMAT:
        assert direct is None  # another triton: its launcher's own __call__
        return
    assert direct is not None
    x = torch.empty(4)
    launcher(3, 2, 1, 99, "function", (4, 1, 0), None, None, None, x, 16, 0.5)  # as JITFunction.run calls it
    entry = fast_launch._Entry.__new__(fast_launch._Entry)
    entry.run, entry.direct, entry.function, entry.packed_metadata = launcher, direct, "function", (4, 1, 0)
    entry.coop, entry.pdl = launcher.launch_cooperative_grid, launcher.launch_pdl
    entry((3, 2), 99, (x, 16, 0.5))
    assert len(calls) == 2 and calls[0] == calls[1]
    assert fast_launch._direct_launch(_cuda_launcher(calls, global_scratch=64)) is None
    assert fast_launch._direct_launch(_cuda_launcher(calls, profile_scratch=64)) is None
    assert fast_launch._direct_launch(_Launcher(calls)) is None


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_replayed_call_matches_the_recorded_one(causal):
    """On an H200: the second call of a signature (replayed from its plan) gives bitwise the forward output and
    dK / dV of the first (run by the launchers), dQ to rounding (reduce-adds in no fixed order), and it did replay."""
    if not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)) or not fast_launch.enabled():
        pytest.skip("needs an sm90 GPU and the fast launch path (triton 3.6, FLASHTILE_FAST_LAUNCH unset)")
    recorded = train_step(causal)
    replayed_before = plans.counts[0]
    replayed = train_step(causal)
    assert plans.counts[0] == replayed_before + 2, "forward and backward should both replay"
    for name, a, b in zip(("out", "dq", "dk", "dv"), replayed, recorded):
        if name == "dq":
            torch.testing.assert_close(a, b, atol=2e-2, rtol=2e-2)
        else:
            assert torch.equal(a, b), name


def test_other_dtypes_and_head_dims_build_no_key():
    """fp32 or a head dim the Gluon kernels lack: the launchers as before, without a plan's key."""
    assert launch._plannable(_qkv()[0]) and launch._plannable(_qkv(dtype=torch.float16)[0])
    assert not launch._plannable(_qkv(dtype=torch.float32)[0])
    assert not launch._plannable(_qkv((2, 512, 4, 96))[0])
    assert gluon_bwd_launch.HEAD_DIMS == gluon_launch.HEAD_DIMS  # _plannable serves both directions


def test_listed_persistent_launch_replays_its_kept_list(gluon_on_cpu, monkeypatch):
    """A causal persistent forward with the host's tile list (GluonConfig.schedule) is planned: the replay passes the
    same kept list (plans.constant), which a per-call tensor could not be."""
    calls = gluon_on_cpu
    monkeypatch.setitem(configs.GLUON_FWD_PERSISTENT, (128, True), (("persistent-tma-sched8", 0, 1024), ))
    replayed, recorded = plans.counts[0], plans.counts[1]
    q, k, v = _qkv()
    _forward(q, k, v, right=0)
    _forward(*_qkv(), right=0)
    assert plans.counts[1] == recorded + 1 and plans.counts[0] == replayed + 1 and len(calls) == 2
    schedule = calls[0][-1]
    assert schedule.dtype == torch.int32 and calls[1][len(calls[0]) - 1] is schedule


def test_d64_causal_short_rows_take_gluon_only_plain(gluon_on_cpu):
    """D64 causal at 1K keys: a plain dense call takes the persistent Gluon grid (configs.GLUON_FWD_MIN_KEYS_PLAIN);
    with softcap it would run the one-tile kernel, slower than the portable one there: declined."""
    q, k, v = _qkv((2, 1024, 4, 64))
    assert launch._gluon_forward(q, k, v, 0.125, -1, 0, 30.0, None, None) is None
    assert not gluon_on_cpu
    _forward(q, k, v, right=0)
    # the variant serving 1K keys decides the order: "-sched" walks the host's tile list (an int32 tensor, the last
    # argument), "-lpt" the grid's stride (no list)
    variant = next(name for name, least, most in configs.GLUON_FWD_PERSISTENT[(64, True)] if least <= 1024 <= most)
    assert len(gluon_on_cpu) == 1 and (gluon_on_cpu[0][-1].dtype == torch.int32) == ("sched" in variant)


def test_a_launcher_can_ask_for_no_plan(gluon_on_cpu):
    """plans.dont_keep() during record() (the persistent forward's stride fallback under a CUDA graph capture): the
    call's result comes back, and neither a plan nor a decline is kept for its key."""
    recorded = plans.counts[1]
    out = plans.record(("key",), (), lambda: plans.dont_keep() or ("out",), None)
    assert out == ("out",) and plans.get(("key",)) is None and plans.counts[1] == recorded
    assert plans.record(("other",), (), lambda: plans.dont_keep(), None) is None and plans.get(("other",)) is None


def test_recording_is_one_thread_at_a_time(gluon_on_cpu, monkeypatch):
    """One thread records at a time, and only its own buffers and launches: a call on another thread meanwhile runs
    unrecorded and keeps nothing, and its buffers stay out of the recording (session 15's review: with shared
    recording state, another thread's end of recording cut a backward plan short, whose replays returned gradients no
    kernel wrote)."""
    seen = []
    monkeypatch.setattr(plans, "_build", lambda inputs, allocs, *rest: seen.append(allocs))
    started, release = threading.Event(), threading.Event()
    q = _qkv()[0]

    def slow_call():
        own = launch._empty((4,), q)
        started.set()
        release.wait(5)
        return (own,)

    recording = threading.Thread(target=lambda: seen.append(plans.record(("slow",), (q,), slow_call, None)))
    recording.start()
    assert started.wait(5)
    other = plans.record(("other",), (q,), lambda: (launch._empty((4,), q),), None)
    foreign = launch._empty((4,), q)
    release.set()
    recording.join(5)
    own = seen[1][0]
    assert len(seen) == 2 and len(seen[0]) == 1 and seen[0][0] is own  # _build saw the recording thread's buffer only
    assert other[0] is not own and foreign is not own
    assert plans.get(("other",)) is None and plans.get(("slow",)) is plans.DECLINED


def test_failed_portable_replay_raises_and_keeps_gluon(gluon_on_cpu, monkeypatch):
    """A replayed plan of the portable kernels alone that fails raises (the normal path would launch the same
    kernels) and leaves the Gluon kernels on; the plans are dropped."""
    q, k, v = _qkv((2, 256, 4, 64))  # D64 causal at 256 keys: the portable kernel
    _forward(q, k, v, right=0)

    def broken(*args, **kwargs):
        raise RuntimeError("launch failed")
    monkeypatch.setattr(fast_launch, "replay_stream", broken)
    with pytest.raises(RuntimeError, match="launch failed"):
        _forward(q, k, v, right=0)
    assert gluon_launch._disabled is None and not plans._plans


def test_failed_gluon_replay_disables_gluon(gluon_on_cpu, monkeypatch):
    """A replayed plan with a Gluon kernel (launch._replay tells it by kernel.is_gluon()) that fails turns the Gluon
    forward off for the process, as a failed Gluon launch does, and the call still returns (the portable path)."""
    q, k, v = _qkv((2, 1024, 4, 128))  # D128 at 1K keys: the Gluon forward
    _forward(q, k, v)
    assert any(kl.kernel.is_gluon() for plan in plans._plans.values() for kl in plan.launches)

    def broken(*args, **kwargs):
        raise RuntimeError("launch failed")
    monkeypatch.setattr(fast_launch, "replay_stream", broken)
    with pytest.warns(RuntimeWarning):
        out = _forward(q, k, v)
    assert gluon_launch._disabled is not None and out is not None


def test_environment_switches_are_read_at_each_call(monkeypatch):
    """launch._env_reader reads os.environ's store at each call: a variable set or removed later, and an os.environ
    replaced by another mapping (mock.patch("os.environ", {...})), are seen as os.environ.get sees them."""
    read = launch._env_reader("FLASHTILE_TEST_SWITCH")
    monkeypatch.delenv("FLASHTILE_TEST_SWITCH", raising=False)
    assert read() is None
    monkeypatch.setenv("FLASHTILE_TEST_SWITCH", "1")
    assert read() == "1" == os.environ.get("FLASHTILE_TEST_SWITCH")
    monkeypatch.setattr(os, "environ", {"FLASHTILE_TEST_SWITCH": "0"})
    assert read() == "0"


def test_a_slot_no_launch_takes_keeps_no_plan(gluon_on_cpu):
    """plans.record with a slot whose kernel the call does not launch (or launches with another value there) keeps
    no plan: a replay would repeat the recorded value."""
    calls = gluon_on_cpu
    q, k, v = _qkv()
    for slots, scalars in ((((kvcache_launch._attn_fwd_splitkv, 3),), (7,)),
                           (((gluon_launch._attn_fwd_hopper, 0),), (7,))):
        plans.clear()
        plans.record(("slot-test",), (q, k, v), lambda: _forward(q, k, v), None, slots, scalars)
        assert plans.get(("slot-test",)) is plans.DECLINED and calls
