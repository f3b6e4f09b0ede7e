"""flash_attn_with_kvcache with an int cache_seqlens: the cache length travels as a kernel scalar, so a decode step
fills no (B,) tensor (torch.full: a kernel and a CUDA-graph node per step, issue 5) and adds no `used + new`
kernel; with a tensor the new tokens are added in the kernel too. Same results as a tensor of the same lengths,
one launch per step fewer, and one compile for every cache length."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from triton.runtime.jit import JITFunction

import flashtile
from compile_check import kernel_signature
from conftest import DEVICE
from flashtile import checks, configs, launch, ops
from test_decode import paged_copy
from test_kvcache import check_against_reference


def _inputs(device, paged, seqlen_q=1, batch=2, capacity=64, heads_q=4, heads_kv=2, head_dim=16, seed=0):
    """q, k_cache, v_cache (contiguous, or shuffled pages of 16 with their block table), new k/v, cos, sin."""
    gen = torch.Generator().manual_seed(seed)
    make = lambda *shape: torch.randn(*shape, generator=gen).to(device)  # noqa: E731
    q = make(batch, seqlen_q, heads_q, head_dim)
    k_cache, v_cache = make(batch, capacity, heads_kv, head_dim), make(batch, capacity, heads_kv, head_dim)
    table = None
    if paged:
        k_cache, v_cache, table = paged_copy(k_cache, v_cache, 16, torch.Generator().manual_seed(seed))
        table = table.to(device)
    k, v = make(batch, 3, heads_kv, head_dim), make(batch, 3, heads_kv, head_dim)
    cos, sin = torch.rand(capacity, 4, generator=gen).to(device), torch.rand(capacity, 4, generator=gen).to(device)
    return q, k_cache, v_cache, table, k, v, cos, sin


# The split-KV kernel with one split and with three (then the combine kernel), and the forward kernel (what a
# prefill chunk of more than configs.DECODE_MAX_ROWS packed rows runs).
KERNELS = ["split1", "split3", "fwd"]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("rotary", [False, True], ids=["plain", "rotary"])
@pytest.mark.parametrize("append", [False, True], ids=["no-append", "append"])
def test_int_and_tensor_agree(backend, monkeypatch, kernel, paged, rotary, append):
    """An int n and a tensor of n in every row: the same output and lse bit for bit, and the same cache."""
    _, device = backend
    if kernel == "fwd":
        monkeypatch.setattr(configs, "DECODE_MAX_ROWS", 0)
    num_splits = 3 if kernel == "split3" else 1
    q, k_cache, v_cache, table, k, v, cos, sin = _inputs(device, paged, seqlen_q=2)
    n = 21
    kwargs = dict(k=k if append else None, v=v if append else None, rotary_cos=cos if rotary else None,
                  rotary_sin=sin if rotary else None, block_table=table, causal=True, num_splits=num_splits,
                  return_softmax_lse=True)
    caches = {}
    results = {}
    for kind, seqlens in [("int", n), ("tensor", torch.full((q.shape[0],), n, dtype=torch.int32, device=device))]:
        kc, vc = k_cache.clone(), v_cache.clone()
        results[kind] = flashtile.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, **kwargs)
        caches[kind] = kc, vc
    assert torch.equal(results["int"][0], results["tensor"][0])
    assert torch.equal(results["int"][1], results["tensor"][1])
    assert torch.equal(caches["int"][0], caches["tensor"][0]) and torch.equal(caches["int"][1], caches["tensor"][1])
    if append and not paged:  # the new tokens landed at n, n + 1, n + 2 (rotated when rotary)
        assert not torch.equal(caches["int"][0], k_cache) and torch.equal(caches["int"][1][:, n:n + 3], v)
        assert torch.equal(caches["int"][0][:, :n], k_cache[:, :n])
        assert torch.equal(caches["int"][0][:, n + 3:], k_cache[:, n + 3:])
    if not rotary and not paged:  # and the output is the reference's over the first n (+ 3) keys
        kc, vc = caches["int"]
        check_against_reference(results["int"][0], q, kc, vc, [n + (3 if append else 0)] * q.shape[0], causal=True)


_KERNEL_LAUNCH_RUN = launch.KernelLaunch.run


class _DeviceWork(TorchDispatchMode):
    """Records what a call would run on the GPU: each launch.KernelLaunch (by kernel name) and each ATen op outside
    them that is not an allocation or a view (torch.full, an elementwise add: one kernel each on a GPU)."""
    QUIET = ("aten.empty", "aten.new_empty", "aten.select", "aten.slice", "aten.view", "aten.unsqueeze",
             "aten.expand", "aten.alias", "aten.as_strided", "aten.detach", "aten.t.")

    def __init__(self, monkeypatch):
        super().__init__()
        self.work, self.in_launch = [], False
        run = _KERNEL_LAUNCH_RUN  # not a previous recorder's wrapper

        def recorded_run(kl):
            self.work.append(kl.kernel.fn.__name__)
            self.in_launch = True  # the interpreter's own tensor work is not the GPU's
            try:
                run(kl)
            finally:
                self.in_launch = False
        monkeypatch.setattr(launch.KernelLaunch, "run", recorded_run)
        monkeypatch.setattr(ops, "eager", lambda: True)  # this mode would otherwise route calls through the ops
        monkeypatch.setattr(launch, "poison_outputs", lambda: False)  # the tests' NaN fill is no decode work

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.in_launch and not str(func).startswith(self.QUIET):
            self.work.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("num_splits", [1, 2], ids=["s1", "s2"])
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_launches_per_decode_step(monkeypatch, paged, num_splits):
    """With an int cache_seqlens nothing but the kernels runs: no torch.full, no `used + new`. Per call:
    int without append: the attention's 1 (or with splits 2) kernels; int or tensor with an append: one more
    (the rotary-append kernel). Before: int + 1 (the fill), int with append + 2 (fill, add), tensor with
    append + 1 (the add). A block table's range check reads the entries in use back once (its ops; checks._TABLE_MAX
    keeps the result while the table is unchanged and the rows stay in the pages checked, here the first of each row,
    so the calls after the first check add nothing) and again after an in-place change; a length tensor is read back
    for the append's capacity check (on a GPU a device-to-host copy, skipped under CUDA-graph capture)."""
    q, k_cache, v_cache, table, k, v, _, _ = _inputs(DEVICE, paged)
    attention = ["_attn_fwd_splitkv"] + (["_attn_combine"] if num_splits > 1 else [])
    fills = []
    full = torch.full
    monkeypatch.setattr(torch, "full", lambda *a, **kw: fills.append(a) or full(*a, **kw))
    tensor = torch.tensor([10, 12], dtype=torch.int32, device=DEVICE)
    table_check = _DeviceWork(monkeypatch)
    if table is not None:
        with table_check:
            checks.block_table_pages(table, k_cache.shape[0], k_cache.shape[1], 10)  # the last call's keys
        assert table_check.work  # the check reads the table (so its absence below means it was not read again)
    length_check = _DeviceWork(monkeypatch)  # a length tensor is read back too (the append's capacity check)
    with length_check:
        tensor.tolist()
    for seqlens, new, want in [(10, None, attention), (10, k, ["_rotary_append", *attention]),
                               (tensor, k, [*length_check.work, "_rotary_append", *attention])]:
        rec = _DeviceWork(monkeypatch)
        with rec:
            flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, new, new, cache_seqlens=seqlens, block_table=table,
                                              num_splits=num_splits)
        assert rec.work == want, (seqlens, new is not None)
    assert fills == []
    if table is not None:  # an in-place change through torch: the next call reads the table again
        table[0, 0] = table[0, 0].item()
        rec = _DeviceWork(monkeypatch)
        with rec:
            flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=10, block_table=table,
                                              num_splits=num_splits)
        assert rec.work == table_check.work + attention


def _jit(kernel):
    """The JITFunction triton would launch: under the interpreter the kernels are InterpretedFunctions, built from
    the same function and decorator arguments (do_not_specialize included)."""
    return kernel if isinstance(kernel, JITFunction) else JITFunction(kernel.fn, **kernel.kwargs)


@pytest.mark.parametrize("append", [False, True], ids=["no-append", "append"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_one_compile_for_every_cache_length(monkeypatch, kernel, append):
    """The cache length is a kernel argument triton does not specialize on (do_not_specialize): int
    cache_seqlens 1000, 1003 and 1024 (== 0, != 0 mod 16) give every launch one signature, i.e. one compiled
    kernel as the cache grows. The launches are recorded, not run (the signature is all this is about)."""
    if kernel == "fwd":
        monkeypatch.setattr(configs, "DECODE_MAX_ROWS", 0)
    launches = []
    monkeypatch.setattr(launch.KernelLaunch, "run", lambda kl: launches.append(kl))
    q, k_cache, v_cache, _, k, v, cos, sin = _inputs(DEVICE, False, capacity=1100)
    signatures = []
    for n in (1000, 1003, 1024):
        launches.clear()
        flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, k if append else None, v if append else None,
                                          cos if append else None, sin if append else None, cache_seqlens=n,
                                          causal=True, num_splits=3 if kernel == "split3" else 1)
        signatures.append([(kl.kernel.fn.__name__, kernel_signature(_jit(kl.kernel), kl.args, kl.constexprs),
                            kl.num_warps, kl.num_stages) for kl in launches])
    names = [name for name, *_ in signatures[0]]
    assert ("_rotary_append" in names) == append and ("_attn_fwd" in names) == (kernel == "fwd")
    assert signatures[1] == signatures[0] and signatures[2] == signatures[0]


def test_custom_ops_opcheck_without_tensor(monkeypatch):
    """The ops' schemas and fake implementations with no length tensor, only the int (cpu.py path)."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q, k_cache, v_cache, _, k, v, cos, sin = _inputs("cpu", False, capacity=12)
    torch.library.opcheck(ops.fwd_kvcache, (q, k_cache, v_cache, None, None, 0.25, -1, -1, 0.0, None, 7, 0, None, 7))
    args = (q, k_cache.clone(), v_cache.clone(), k, v, cos, sin, None, None, True, True, 4)
    torch.library.opcheck(ops.kvcache_append, args, test_utils=("test_schema", "test_faketensor"))
