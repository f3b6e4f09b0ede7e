"""Launch plans: a plain forward or backward (Gluon or portable kernels), a split-KV decode step or a KV-cache append
(rotary included), replayed per call signature (host time).

The first call of a signature runs the launchers as always (from launch._planned_forward,
bwd_launch._planned_backward, kvcache_launch._planned_kvcache / _planned_append) while record() watches: the buffers
they allocate (launch._empty) and the launches they make (fast_launch.launch). When every launch went through
fast_launch's cache and every argument is an input, one of those buffers, a TMA descriptor of one of them, or a plain
scalar, the call becomes a Plan: the arguments as a template with the tensors' and descriptors' places marked. A
later call with the same key only allocates the buffers, rebuilds the descriptors on the new tensors (they hold the
pointers), and launches each kernel on the stream fast_launch.replay_stream gives: no support checks, config choice,
grid or argument building, and no fast_launch key.

The key (the launcher modules build it) holds everything the launchers read of the calls it plans (fp16 / bf16 on
CUDA; TRITON_INTERPRET is left out, as a switch not expected to change within a process) besides the tensors'
addresses: every input's shape, strides, dtype and device, the scalars (scale, window), the environment switch that
chose the Gluon kernel and whether that kernel is still on (a failed build turns it off for the process); replay()
checks the addresses' 16-byte alignment (TMA and triton's specialization read it) and gives up (None: the caller
takes the normal path) where any tensor is misaligned. Plans exist only while fast_launch is on
(FLASHTILE_FAST_LAUNCH=0 turns both off) and only for the calls the launchers plan: forward / backward without
optional features, and flash_attn_with_kvcache's split-KV steps (windows, softcap, ALiBi, block tables, length tensors
and cache_leftpad included) and appends. A decode step's cache length (an append's write position) changes every
call: it is a per-call slot (record / replay's `slots` and `scalars`), the one scalar a replay substitutes.
"""
import threading
import weakref

import torch

from . import fast_launch

MAX_PLANS = 256  # call signatures kept (first in, first out): a model has a handful
_plans = {}  # key -> Plan
counts = [0, 0]  # [replayed calls, recorded plans] (tests and benchmarks read them)
_allocs = None  # a list while recording: launch._empty appends each buffer it returns (on the recording thread)
_constants = weakref.WeakValueDictionary()  # id -> tensor: kept buffers a replay passes as they are (constant())
_keep_this = True  # False once a launcher of the call being recorded asked for no plan (dont_keep())
_recording = threading.Lock()  # held by the one thread that records (others' calls run unrecorded meanwhile)


class _Launch:
    """One recorded launch: kernel, grid, the arguments as a template (None at the tensors' and descriptors' places):
    the n_args positional ones, then the entry's tail (what fast_launch's entry is called with), tensors: (position,
    tensor index), descs: (position, tensor index, shape, strides, block shape, layout), scalars: (position, index
    into replay's scalars), kwargs (constexprs and options) and fast_launch's entry."""
    __slots__ = ("kernel", "grid", "template", "n_args", "tensors", "descs", "scalars", "kwargs", "entry")


class Plan:
    """A call signature's launches (and their fast_launch entries). Tensors are indexed: the inputs first, then the
    buffers in allocation order (allocs: (shape, dtype) each); outputs: the indices of the returned tensors."""
    __slots__ = ("n_inputs", "allocs", "launches", "entries", "outputs")


DECLINED = "declined"  # _plans[key] of a signature with no plan: run() returned None, or the call is not replayable


def get(key):
    """key's Plan, DECLINED, or None (not seen yet)."""
    return _plans.get(key)


def aliasing(tensors):
    """What the key records of which inputs are one tensor: None when all are distinct (the usual case, in C),
    else each one's first place."""
    if len({*map(id, tensors)}) == len(tensors):
        return None
    ids = tuple(map(id, tensors))
    return tuple(ids.index(i) for i in ids)


def clear():
    _plans.clear()


def dont_keep():
    """Called by a launcher while record() runs: this call's launches are not the signature's for good (e.g. the
    persistent forward's stride order, taken under a CUDA graph capture until its tile list exists), so keep no plan
    (nor a decline) for it."""
    global _keep_this
    if fast_launch.recorder_thread == threading.get_ident():
        _keep_this = False


def constant(t):
    """Marks t, a buffer its owner keeps for good (persistent_schedule's tile lists), as an argument a plan may hold
    and pass on every replay; any other tensor that is neither an input nor a launch._empty buffer declines the
    plan. Returns t."""
    _constants[id(t)] = t
    return t


def record(key, inputs, run, descriptor_type, slots=(), scalars=()):
    """run() (the launcher of one call on inputs, returning a tuple of tensors or None), kept as a plan under key
    when every launch it made can be replayed. descriptor_type: Gluon's TensorDescriptor class. One thread records
    at a time, and only its own buffers and launches: a call on another thread meanwhile (nn.DataParallel's
    backward threads) runs unrecorded, so no plan can hold another call's launches or miss some of its own.
    slots ((kernel, argument position), ...): int arguments that change from call to call under one key (an
    unspecialized kernel argument, e.g. a cache length); scalars: their values in this call, slot by slot. Every
    launch of a slot's kernel must pass exactly that value there, else no plan is kept; replay() takes the new
    values."""
    if not fast_launch.enabled() or not _recording.acquire(blocking=False):
        return run()
    try:
        return _record(key, inputs, run, descriptor_type, slots, scalars)
    finally:
        _recording.release()


def _record(key, inputs, run, descriptor_type, slots=(), scalars=()):
    global _allocs, _keep_this
    allocs, launches = [], []
    _allocs, fast_launch.recorder, _keep_this = allocs, launches, True
    fast_launch.recorder_thread = threading.get_ident()
    try:
        result = run()
    finally:
        _allocs = fast_launch.recorder = fast_launch.recorder_thread = None
    # Nothing is kept where an input's address decided (a misaligned tensor: another kernel specialization, no TMA)
    # or a launch went through triton's own path (a launch hook): the next call of the signature records again.
    if (not _keep_this or not all(t.data_ptr() & 15 == 0 for t in inputs)
            or not all(launch[4] is not None for launch in launches)):
        return result
    plan = None if result is None else _build(inputs, allocs, launches, result, descriptor_type, slots, scalars)
    if plan is not None:
        _keep(key, plan)
        counts[1] += 1
    else:
        # Declined (the launcher returned None) or not replayable (an argument a replay cannot rebuild, e.g. a triton
        # TensorDescriptor) for what the key holds: later calls of this signature take the normal path at once.
        _keep(key, DECLINED)
    return result


def _keep(key, value):
    if len(_plans) >= MAX_PLANS:
        _plans.pop(next(iter(_plans), None), None)  # clear() on another thread (a failed replay) may come between
    _plans[key] = value


def _build(inputs, allocs, launches, result, descriptor_type, slots=(), scalars=()):
    """The Plan of one recorded call, or None where an argument is not one a replay can rebuild (or a slot's
    argument is not its scalar)."""
    index = {}
    for i, t in enumerate((*inputs, *allocs)):
        index.setdefault(id(t), i)  # an input passed twice (q is k) is its first place (the key holds the aliasing)
    if not all(t.is_contiguous() for t in allocs):
        return None  # launch._empty's buffers are; anything else is not what a replay allocates
    plan = Plan()
    plan.n_inputs = len(inputs)
    plan.allocs = tuple((tuple(t.shape), t.dtype) for t in allocs)
    plan.outputs = tuple(index.get(id(t)) for t in result)
    if None in plan.outputs or not launches:
        return None
    plan.launches = []
    for kernel, grid, args, kwargs, entry in launches:
        if entry is None or entry.tail is None or type(grid) is not tuple:
            return None
        launch = _Launch()
        launch.kernel, launch.grid, launch.kwargs, launch.entry = kernel, grid, kwargs, entry
        template, launch.tensors, launch.descs = list(args), [], []
        launch.scalars = tuple((pos, i) for i, (slot_kernel, pos) in enumerate(slots) if slot_kernel is kernel)
        if not all(pos < len(args) and type(args[pos]) is int and args[pos] == scalars[i]
                   for pos, i in launch.scalars):
            return None
        for pos, a in enumerate(args):
            t = type(a)
            if t is torch.Tensor:
                i = index.get(id(a))
                if i is None:
                    if _constants.get(id(a)) is a:
                        continue  # stays in the template
                    return None
                launch.tensors.append((pos, i))
                template[pos] = None
            elif t is descriptor_type:
                i = index.get(id(a.base))
                if i is None or a.padding != "zero":
                    return None
                launch.descs.append((pos, i, a.shape, a.strides, a.block_shape, a.layout))
                template[pos] = None
            elif t not in (int, float, bool, type(None)):
                return None
        launch.template, launch.n_args = (*template, *entry.tail), len(template)
        launch.tensors, launch.descs = tuple(launch.tensors), tuple(launch.descs)
        plan.launches.append(launch)
    if {i for launch in plan.launches for _, i in launch.scalars} != set(range(len(slots))):
        return None  # a slot no launch took: a replay would repeat this call's value
    plan.launches = tuple(plan.launches)
    plan.entries = tuple(launch.entry for launch in plan.launches)
    return plan


def replay(plan, inputs, alloc, make_descriptor, scalars=()):
    """The outputs of plan's call on inputs, or None (nothing launched) where an input is not 16-byte aligned.
    alloc(shape, dtype): a new buffer; make_descriptor(tensor, shape, strides, block_shape, layout); scalars: this
    call's values of the slots record() was given."""
    for t in inputs:
        if t.data_ptr() & 15:
            return None
    tensors = list(inputs)
    for shape, dtype in plan.allocs:
        t = alloc(shape, dtype)
        if t.data_ptr() & 15:
            return None
        tensors.append(t)
    stream = fast_launch.replay_stream(plan.entries)  # None: each launch through fast_launch.launch (a hook, ...)
    for launch in plan.launches:
        args = list(launch.template)
        for pos, i in launch.tensors:
            args[pos] = tensors[i]
        for pos, i, shape, strides, block_shape, layout in launch.descs:
            args[pos] = make_descriptor(tensors[i], shape, strides, block_shape, layout)
        for pos, i in launch.scalars:
            args[pos] = scalars[i]
        if stream is not None:
            launch.entry(launch.grid, stream, args)
        else:
            fast_launch.launch(launch.kernel, launch.grid, tuple(args[:launch.n_args]), launch.kwargs)
    counts[0] += 1
    return tuple(tensors[i] for i in plan.outputs)
