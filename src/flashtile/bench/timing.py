"""Timing (median milliseconds) and peak memory of one forward + backward, on GPU and CPU."""
import os
import statistics
import time
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

MB = 2**20


def bench_ms(fn, device, warmup, rep, cuda_graph=False):
    """Median milliseconds of ``fn()``. The caller has already run fn once (compile excluded).

    CUDA: triton.testing.do_bench (L2 flushed between runs); with cuda_graph, of replaying one captured call (what
    a serving loop that captures its decode step pays: no host work per call). CPU: time.perf_counter over
    repeated calls for about ``rep`` ms (at least 3, at most 50 runs) after ``warmup`` ms of extra warm-up.
    """
    if device.type == "cuda":
        from triton.testing import do_bench

        if cuda_graph:
            fn = _captured(fn)
        return do_bench(fn, warmup=warmup, rep=rep, return_mode="median")
    end = time.perf_counter() + warmup / 1e3
    while time.perf_counter() < end:
        fn()
    times = []
    while len(times) < 3 or (sum(times) < rep / 1e3 and len(times) < 50):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def kernel_us(fn, calls=20, width=60):
    """{kernel name (its first width characters): mean CUDA us per call} of calls calls of fn, from torch.profiler,
    after one untimed call (compiles, first-call allocations)."""
    from collections import defaultdict

    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    times = defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            times[event.name[:width]] += event.device_time / calls
    return times


def peak_memory_mb(fn, device, keep=()):
    """Peak memory in MB (2**20 bytes) that one call of ``fn()`` needs beyond what already exists.

    CUDA: the caching allocator's max_memory_allocated minus memory_allocated before the call.
    CPU: an estimate from ``TensorMemoryTracker`` (bytes of tensor storages created by torch ops while
    fn runs and still alive), since tracemalloc does not see torch's allocator. ``keep``: tensors
    that exist before the call (inputs), so in-place ops on them are not counted as allocations.
    """
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        return (torch.cuda.max_memory_allocated(device) - base) / MB
    with TensorMemoryTracker(keep) as tracker:
        fn()
    return tracker.peak / MB


class TensorMemoryTracker(TorchDispatchMode):
    """Counts live tensor storage bytes produced by torch ops (any device); ``peak`` is the maximum.

    Storage Python objects are preserved while the C++ storage lives, so a weakref finalizer on
    them fires exactly when the memory is released. Views share a storage and are counted once.
    """

    def __init__(self, keep=()):
        super().__init__()
        self.current = 0
        self.peak = 0
        self._live = {}
        self._known = {id(t.untyped_storage()) for t in keep}

    def _release(self, key):
        self.current -= self._live.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            key = id(storage)
            if key in self._live or key in self._known:
                continue
            self._live[key] = storage.nbytes()
            self.current += self._live[key]
            self.peak = max(self.peak, self.current)
            weakref.finalize(storage, self._release, key)
        return out


def free_bytes(device):
    """Bytes that new tensors can still get on ``device`` (CUDA: free + cached; CPU: available RAM)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _captured(fn):
    """graph.replay for a CUDA graph of one fn() call (warmed up on a side stream first, as capture needs)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay
