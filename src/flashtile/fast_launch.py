"""Fast launch path: run a kernel's CompiledKernel directly once triton has launched the same specialization.

Why: triton's JITFunction.run costs ~48-63 us of host time per launch on the H200 machine (binder, cache key,
launch_metadata, hooks), as much as a short attention kernel. launch(kernel, grid, args, kwargs) behaves as
kernel[grid](*args, **kwargs), but keeps the CompiledKernel that JITFunction.run returned under a key that
flashtile computes in Python (call_key) and, when a later call has the same key, calls that kernel's launcher
with the same arguments JITFunction.run would pass (grid, stream, function, packed_metadata, the bound args).
The key is sig_key: per (kernel, keyword names, every argument's type) a _Sig of C-level getters, so a call is
keyed in ~20 builtin calls (binder + cache key: ~20-40 us of CPU per launch, the key ~60-80 % of that on a
loaded 2-core box: benchmarks/fast_launch_key.py); spec_key, argument by argument, is its reference and fallback.

Why that is the kernel triton would pick: JITFunction.run (triton 3.6) looks its kernel up by
(specialization, str(options)), where the specialization of each argument is native_specialize_impl's
(python/src/specialize.cc): a constexpr's value; an int's 1-ness (1 becomes a constexpr), its range (i32 / i64 /
u64) and, unless do_not_specialize, `% 16 == 0` (unless do_not_specialize_on_alignment); a bool u1; a float fp32;
None a constexpr; a tensor's dtype and `data_ptr() % 16 == 0` (same exceptions); a tensor descriptor's base dtype,
block shape and (Gluon) layout; a tuple, element by element. The key records each of these or something finer
(constexprs by type and value, floats by repr, layouts by identity, annotated parameters by value), plus the
device and the launch options, so two calls with one key get one triton kernel. Anything else (another argument
type, tuples included, a callable grid, hooks, debug) takes the normal path. A key finer than triton's only costs
a normal launch.

On a hit the launch goes straight to the C function of triton 3.6's CudaLauncher (its `launch`, the tensor-map
wrapper included) with the arguments CudaLauncher.__call__ would give it (_Entry.direct), where the launcher needs
no scratch memory and its calling convention is the one checked here (_direct_launch); else through
CudaLauncher.__call__. launch() returns the cache entry it used, so a caller that replays one call signature
(plans.py) can launch it again (replay_stream) without computing the key.

Only on the triton this was checked against (gluon_launch.TESTED_TRITON), never under the interpreter, and
FLASHTILE_FAST_LAUNCH=0 turns it off. Launch hooks (profilers such as proton), pre-run hooks, TRITON_DEBUG and
instrumentation send every call through triton, which then sees and reports everything as before.
"""
import os
from itertools import repeat
from operator import and_, attrgetter, eq, itemgetter, methodcaller, not_
from threading import get_ident

import torch

_MAX_ENTRIES = 1024  # a bound on the cache; keys from ever-new layouts or kernels would otherwise grow it
_cache = {}  # key -> _Entry
_plans = {}  # (id(kernel), number of positional args, kwarg names) -> _Plan
_on = None  # FLASHTILE_FAST_LAUNCH != 0 and the tested triton, read at the first launch (os.environ costs ~1 us)
_rt = None  # triton pieces used on every fast call (imported once)
counts = [0, 0]  # [fast launches, recorded launches] in this process (tests and host_time.py read them)
recorder = None  # a list while plans.py records a call: launch() appends (kernel, grid, args, kwargs, entry)
recorder_thread = None  # the thread whose launches go to recorder (plans.record's; other threads' never do)


def enabled():
    """The fast path is on: FLASHTILE_FAST_LAUNCH is not 0 (read once per process), triton is the tested
    release and torch is not a ROCm build: ROCm's triton also specializes a tensor on whether it spans at most 2 GB
    (its buffer loads' 32-bit offsets), which the key does not record. The interpreter needs no check here: its
    kernels are not JITFunctions, so launch() never keys them."""
    global _on
    if _on is None:
        from .gluon_launch import tested_triton
        _on = (os.environ.get("FLASHTILE_FAST_LAUNCH", "1") != "0" and tested_triton()
               and torch.version.hip is None)
    return _on


class _Runtime:
    """triton's JITFunction / descriptor classes, knobs and the device / stream getters it uses."""

    def __init__(self):
        from triton import knobs
        from triton.compiler import CompiledKernel
        from triton.runtime.driver import driver
        from triton.runtime.jit import JITFunction
        from triton.tools.tensor_descriptor import TensorDescriptor
        try:
            from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor
        except ImportError:
            GluonDescriptor = None
        self.knobs, self.CompiledKernel, self.JITFunction = knobs, CompiledKernel, JITFunction
        self.TensorDescriptor, self.GluonDescriptor = TensorDescriptor, GluonDescriptor
        self.driver = driver


def _runtime():
    global _rt
    if _rt is None:
        _rt = _Runtime()
    return _rt


_CONSTEXPR, _SPEC_ALIGN, _SPEC, _NO_SPEC, _VALUE = range(5)


class _Plan:
    """Per (kernel, keyword names): how the call's arguments map onto the kernel's parameters."""

    def __init__(self, kernel, n_args, kw_names):
        params = kernel.params
        names = [p.name for p in params]
        self.ok = n_args <= len(params) and all(n in names[n_args:] or n not in names for n in kw_names)
        # keyword names that are not parameters are launch options (num_warps, num_stages, maxnreg, ...)
        self.option_names = tuple(n for n in kw_names if n not in names)
        # how each parameter is keyed (_CONSTEXPR, _SPEC_ALIGN, _SPEC, _NO_SPEC, _VALUE); annotated non-constexpr
        # ones by value (triton's annotation rules then need no copy here; a finer key only costs a miss)
        self.modes = tuple(_CONSTEXPR if p.is_constexpr else _VALUE if p.annotation else
                           _NO_SPEC if p.do_not_specialize else _SPEC if p.do_not_specialize_on_alignment else
                           _SPEC_ALIGN for p in params)
        self.flags = tuple((not p.do_not_specialize, not p.do_not_specialize_on_alignment) for p in params)
        self.kw_names = kw_names
        # parameters after the positional ones, from the keywords or their defaults (bound_args)
        tail = params[n_args:]
        self.tail_names = tuple(p.name for p in tail)
        self.tail_defaults = tuple(p.default if p.has_default else None for p in tail)
        self.ok = self.ok and all(p.name in kw_names or p.has_default for p in tail)
        self.debug = kernel.debug
        self.kernel = kernel  # alive while ids of it are keys here
        self.sigs = {}  # argument types -> _Sig (kept with the plan: keys hold their ids)


_R15, _R1 = repeat(15), repeat(1)  # map(and_, ints, _R15): each int & 15 (repeat is stateless, so reusable)
_DATA_PTR = methodcaller("data_ptr")
_DTYPE, _BASE_DTYPE, _BLOCK_SHAPE, _LAYOUT = (attrgetter("dtype"), attrgetter("base.dtype"),
                                              attrgetter("block_shape"), attrgetter("layout"))


def _getter(positions):
    """bound -> tuple of bound[i] for i in positions, in C (itemgetter of one index returns the item, not a
    tuple: repeat it); None for no positions."""
    if not positions:
        return None
    return itemgetter(*positions) if len(positions) > 1 else itemgetter(positions[0], positions[0])


class _Sig:
    """Per (plan, argument types): which positions hold which kind of argument, as C-level getters, so that
    sig_key keys a call in ~15 builtin calls instead of a Python loop over ~30 arguments. ok is False for types
    only the per-argument key handles (tuples, constexprs other than _plain_constexpr's, anything unknown)."""

    def __init__(self, plan, types, rt):
        pos = {}
        self.ok = True
        for i, (t, mode) in enumerate(zip(types, plan.modes)):
            if mode == _CONSTEXPR:
                kind = "constexpr" if _plain_constexpr(t) else "other"
            elif mode == _VALUE:
                kind = "value"
            elif t is int:
                kind = ("int_spec_align", "int_spec_align", "int_spec", "int_nospec")[mode]
            elif t is torch.Tensor:
                kind = "tensor_align" if mode == _SPEC_ALIGN else "tensor"
            elif t is rt.GluonDescriptor:
                kind = "gdesc"
            elif t is rt.TensorDescriptor:
                kind = "desc"
            elif t in (bool, float, type(None)):
                kind = "by_type"  # u1, fp32, constexpr None: the type (in the key) is triton's whole answer
            else:
                kind = "other"
            pos.setdefault(kind, []).append(i)
        self.ok = "other" not in pos
        ints = pos.get("int_spec_align", []) + pos.get("int_spec", []) + pos.get("int_nospec", [])
        self.ints = _getter(ints)
        self.ints_spec = _getter(pos.get("int_spec_align", []) + pos.get("int_spec", []))
        self.ints_align = _getter(pos.get("int_spec_align"))
        self.tensors = _getter(pos.get("tensor_align", []) + pos.get("tensor", []))
        self.tensors_align = _getter(pos.get("tensor_align"))
        self.gdescs = _getter(pos.get("gdesc"))
        self.descs = _getter(pos.get("desc"))
        self.values = _getter(pos.get("constexpr", []) + pos.get("value", []))


def sig_key(sig, bound, option_values):
    """The key of a call whose argument types sig describes: triton's specialization of every argument, or
    finer (as spec_key, which it equals in meaning: types; ints' == 1, % 16 == 0 and range; tensors' dtype and
    alignment; descriptors' dtype, block shape, layout; constexpr values), built with C-level builtins.
    None when an int falls outside int32 (then spec_key decides)."""
    key = ["sig", id(sig), option_values]  # the sig: the plan (kernel, keyword names) and every argument's type
    if sig.ints is not None:
        ints = sig.ints(bound)
        if min(ints) < -0x80000000 or max(ints) > 0x7FFFFFFF:
            return None
        if sig.ints_spec is not None:
            key.append(tuple(map(eq, sig.ints_spec(bound), _R1)))  # triton makes a 1 a constexpr
        if sig.ints_align is not None:
            key.append(tuple(map(not_, map(and_, sig.ints_align(bound), _R15))))  # % 16 == 0
    if sig.tensors is not None:
        key.append(tuple(map(_DTYPE, sig.tensors(bound))))
        if sig.tensors_align is not None:
            key.append(tuple(map(not_, map(and_, map(_DATA_PTR, sig.tensors_align(bound)), _R15))))
    for descs in (sig.gdescs, sig.descs):
        if descs is not None:
            d = descs(bound)
            key.append(tuple(map(_BASE_DTYPE, d)))
            key.append(tuple(map(str, map(_BLOCK_SHAPE, d))))  # triton: str(list(block_shape))
            if descs is sig.gdescs:
                key.append(tuple(map(id, map(_LAYOUT, d))))  # by identity; the cache entry keeps them alive
    if sig.values is not None:
        key.append(sig.values(bound))  # constexpr values; their types are in the types tuple
    return tuple(key)


_plain = {int: True, bool: True, str: True, type(None): True}  # type -> keyed by (type, value) (_plain_constexpr)


def _plain_constexpr(t):
    """True for constexpr types whose (type, value) tells apart all that triton's str(value) does (a JITFunction
    by its source hash): ints, bools, strings, None, triton dtypes (equal by name) and JITFunctions (equal only
    to themselves: finer). Not floats (0.0 == -0.0), tuples ((1,) == (True,)) or tl.constexpr wrappers."""
    plain = _plain.get(t)
    if plain is None:
        from triton.language import dtype
        from triton.runtime.jit import JITCallable
        plain = _plain[t] = issubclass(t, (dtype, JITCallable))
    return plain


def _constexpr_key(v):
    """A constexpr's key: (type, value) for plain types, floats by repr (0.0 == -0.0, but triton's str tells them
    apart); None for anything else (the normal path decides)."""
    t = type(v)
    if t is float:
        return (t, repr(v))
    return (t, v) if _plain_constexpr(t) else None


def arg_key(v, specialize=True, align=True):
    """What native_specialize_impl (triton 3.6) derives from one non-constexpr argument, or something finer.
    None when the type is not one spec_key handles (the caller then takes the normal path)."""
    t = type(v)
    if t is int:
        if specialize and v == 1:
            return "c1"  # triton passes a 1 as a constexpr
        if -2**31 <= v < 2**31:
            ty = "i32"
        elif -2**63 <= v < 2**63:
            ty = "i64"
        elif 0 <= v < 2**64:
            ty = "u64"
        else:
            return None  # triton raises OverflowError; let it
        return ty + "D" if specialize and align and not v & 15 else ty
    if t is bool:
        return "u1"
    if t is float:
        return "fp32"
    if v is None:
        return "none"
    if t is torch.Tensor:
        return (v.dtype, specialize and align and not v.data_ptr() & 15)
    rt = _runtime()
    if t is rt.GluonDescriptor:
        # by identity: the cache entry keeps the layout alive (launch), so no other object takes its id
        return ("gdesc", v.base.dtype, str(v.block_shape), id(v.layout))
    if t is rt.TensorDescriptor:
        return ("desc", v.base.dtype, str(v.block_shape))
    return None


def bound_args(plan, args, kwargs):
    """Every parameter in order (the positional args, then keywords or defaults), as JITFunction.run passes
    them to the launcher."""
    return args + tuple(map(kwargs.get, plan.tail_names, plan.tail_defaults)) if plan.tail_names else args


def option_values(plan, kwargs, knobs):
    """The launch options (num_warps, ...) and what JITFunction.run adds to them: debug and instrumentation_mode
    (both falsy here: _hooks_idle), keyed by type and value as constexprs."""
    return tuple(map(_constexpr_key, (*map(kwargs.__getitem__, plan.option_names), knobs.runtime.debug,
                                      knobs.compilation.instrumentation_mode)))  # a None in it: see call_key


def spec_key(kernel, plan, bound, options):
    """The key of a call argument by argument (the reference for sig_key, and its fallback): (plan, options,
    per-parameter keys), or None where the normal path must decide; two calls with one key have one triton
    specialization and one options string (module docstring). options: option_values()."""
    key = ["arg", id(plan), options]  # the plan: the kernel, the keyword names
    append = key.append
    for v, mode in zip(bound, plan.modes):
        t = type(v)
        if mode == _CONSTEXPR:
            k = _constexpr_key(v)
            if k is None:
                return None
            append(k)
        elif mode == _VALUE:
            append((t, v))
        elif t is int and -0x80000000 <= v <= 0x7FFFFFFF and v != 1:
            append("i32" if mode == _NO_SPEC or v & 15 or mode == _SPEC else "i32D")
        elif t is torch.Tensor:
            append((v.dtype, mode == _SPEC_ALIGN and not v.data_ptr() & 15))
        else:
            k = arg_key(v, mode != _NO_SPEC, mode == _SPEC_ALIGN)
            if k is None:
                return None
            append(k)
    return tuple(key)


def _hooks_idle(knobs):
    """No launch hook (a profiler's) is installed: launch_metadata and the hooks would do nothing."""
    rt = knobs.runtime
    for hook in (rt.launch_enter_hook, rt.launch_exit_hook):
        if hook is not None and getattr(hook, "calls", True):  # an empty HookChain calls nothing
            return False
    return not (rt.debug or knobs.compilation.instrumentation_mode)


# triton 3.6's CudaLauncher (backends/nvidia/driver.py): __call__(gridX, gridY, gridZ, stream, function, *args)
# allocates the global / profile scratch (None when their sizes are 0) and calls self.launch(gridX, gridY, gridZ,
# stream, function, launch_cooperative_grid, launch_pdl, global_scratch, profile_scratch, *args), where args are
# (kernel_metadata, launch_metadata, launch_enter_hook, launch_exit_hook, *kernel arguments): the C function parses
# its arguments with _BASE_ARGS_FORMAT (13 base arguments) and the kernel's own format.
_LAUNCHER_FORMAT = "iiiKKppOOOOOO"
_LAUNCHER_CALL = ("self", "gridX", "gridY", "gridZ", "stream", "function")
_direct_ok = None  # the installed triton's CudaLauncher has that calling convention (checked once)


def _direct_launch(launcher):
    """launcher.launch when calling it directly does what launcher(...) would: triton 3.6's CudaLauncher (the
    calling convention above, checked by the C parser's format string and __call__'s parameters) with no scratch
    memory to allocate; None otherwise (then the launcher is called as JITFunction.run calls it)."""
    global _direct_ok
    if _direct_ok is None:
        try:
            from triton.backends.nvidia import driver as nvidia_driver
            code = nvidia_driver.CudaLauncher.__call__.__code__
            _direct_ok = (getattr(nvidia_driver, "_BASE_ARGS_FORMAT", None) == _LAUNCHER_FORMAT
                          and code.co_argcount == len(_LAUNCHER_CALL)
                          and code.co_varnames[:len(_LAUNCHER_CALL)] == _LAUNCHER_CALL
                          and bool(code.co_flags & 0x04))  # CO_VARARGS: the *args after function
            _direct_ok = _direct_ok and nvidia_driver.CudaLauncher
        except Exception:  # noqa: BLE001  (no NVIDIA backend, another layout: the launcher's own __call__)
            _direct_ok = False
    if not _direct_ok or type(launcher) is not _direct_ok:
        return None
    if getattr(launcher, "global_scratch_size", 1) != 0 or getattr(launcher, "profile_scratch_size", 1) != 0:
        return None
    coop, pdl = getattr(launcher, "launch_cooperative_grid", None), getattr(launcher, "launch_pdl", None)
    if type(coop) is not bool or type(pdl) is not bool or not callable(getattr(launcher, "launch", None)):
        return None
    return launcher.launch


class _Entry:
    """A recorded launch: the CompiledKernel, how to call it (direct: launcher.launch, or None: the launcher), the
    device whose cache it came from, the layouts whose ids its key holds (kept alive), and tail: the parameters
    after the positional arguments (all constexprs, so one per key; None where a tail parameter is not a
    constexpr: then a replay cannot rebuild the call)."""
    __slots__ = ("compiled", "run", "direct", "function", "packed_metadata", "coop", "pdl", "layouts", "device",
                 "tail", "kernel")

    def __init__(self, compiled, kernel, plan, bound, device, layouts):
        self.compiled, self.kernel, self.device, self.layouts = compiled, kernel, device, layouts
        self.run, self.function, self.packed_metadata = compiled.run, compiled.function, compiled.packed_metadata
        self.direct = _direct_launch(self.run)
        self.coop, self.pdl = (self.run.launch_cooperative_grid, self.run.launch_pdl) if self.direct else (0, 0)
        n_args = len(plan.modes) - len(plan.tail_names)
        self.tail = (bound[n_args:] if all(m == _CONSTEXPR for m in plan.modes[n_args:]) else None)

    def __call__(self, grid, stream, bound):
        n = len(grid)
        gx, gy, gz = grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1
        if self.direct is not None:
            # CudaLauncher.__call__'s call with no scratch: launch_metadata and both hooks None (none is set)
            self.direct(gx, gy, gz, stream, self.function, self.coop, self.pdl, None, None, self.packed_metadata,
                        None, None, None, *bound)
        else:
            # As JITFunction.run: grid, stream, function, metadata; launch_metadata and the hooks are None.
            self.run(gx, gy, gz, stream, self.function, self.packed_metadata, None, None, None, *bound)


def _globals_unchanged(kernel):
    # JITFunction.run raises when a global the kernel read changed since compilation; the normal path says so.
    missing = object()
    return all(g.get(name, missing) == val for (name, _), (val, g) in kernel.used_global_vals.items())


def call_key(plan, bound, options, rt):
    """sig_key where the argument types allow, else spec_key; None: no fast path for this call."""
    types = tuple(map(type, bound))
    sig = plan.sigs.get(types)
    if sig is None:
        sig = plan.sigs[types] = _Sig(plan, types, rt)
    if None in options[1]:  # an option of a type _constexpr_key does not key
        return None
    key = sig_key(sig, bound, options) if sig.ok else None
    return key if key is not None else spec_key(plan.kernel, plan, bound, options)


def launch(kernel, grid, args, kwargs):
    """kernel[grid](*args, **kwargs), through the fast path where a previous call proved the specialization.
    Returns the cache entry it launched or recorded, else None (the normal path)."""
    entry = _launch(kernel, grid, args, kwargs)
    launches = recorder  # read once: the recording thread may end it meanwhile
    if launches is not None and recorder_thread == get_ident():
        launches.append((kernel, grid, args, kwargs, entry))
    return entry


def _launch(kernel, grid, args, kwargs):
    if not enabled():
        kernel[grid](*args, **kwargs)
        return None
    rt = _runtime()
    if (getattr(type(kernel), "run", None) is not rt.JITFunction.run or kernel.pre_run_hooks or type(grid) is not tuple
            or not _hooks_idle(rt.knobs) or "debug" in kwargs):
        kernel[grid](*args, **kwargs)
        return None
    kw_names = tuple(kwargs)
    plan = _plans.get((id(kernel), len(args), kw_names))
    if plan is None:
        plan = _plans[(id(kernel), len(args), kw_names)] = _Plan(kernel, len(args), kw_names)
    if not plan.ok or plan.debug:
        kernel[grid](*args, **kwargs)
        return None
    device = rt.driver.active.get_current_device()
    bound = bound_args(plan, args, kwargs)
    try:
        key = call_key(plan, bound, (device, option_values(plan, kwargs, rt.knobs)), rt)
        entry = _cache.get(key) if key is not None else None
    except TypeError:  # an unhashable constexpr
        key = entry = None
    if entry is None or (kernel.used_global_vals and not _globals_unchanged(kernel)):
        compiled = kernel[grid](*args, **kwargs)
        if key is not None and isinstance(compiled, rt.CompiledKernel):
            if len(_cache) >= _MAX_ENTRIES:
                _cache.clear()
            layouts = tuple(v.layout for v in bound if type(v) is rt.GluonDescriptor)
            entry = _cache[key] = _Entry(compiled, kernel, plan, bound, device, layouts)
            counts[1] += 1
            return entry
        return None
    counts[0] += 1
    entry(grid, rt.driver.active.get_current_stream(device), bound)
    return entry


def replay_stream(entries):
    """The current stream, on which a caller that replays one call signature (plans.py) may launch each of entries
    (launch() returned them) itself: entry(grid, stream, positional arguments + entry.tail), without computing the
    key. The caller guarantees that the arguments have the types, specialization (int residues, tensor dtypes and
    16-byte alignment, descriptor block shapes and layouts) and constexprs of the recorded calls. None, where
    launch() must decide for every one: the fast path is off, a launch hook or debug knob is set, a pre-run hook is,
    the current device is another, a global a kernel read has changed, or an entry cannot rebuild its call. Checked
    once for all entries: nothing between their launches can change any of it."""
    if not _on:
        return None
    rt = _rt
    if not _hooks_idle(rt.knobs):
        return None
    device = rt.driver.active.get_current_device()
    for entry in entries:
        kernel = entry.kernel
        if (entry.tail is None or entry.device != device or kernel.pre_run_hooks
                or (kernel.used_global_vals and not _globals_unchanged(kernel))):
            return None
    counts[0] += len(entries)
    return rt.driver.active.get_current_stream(device)


def clear():
    """Forget every cached kernel (tests; after triton's caches are cleared the entries would still be right)."""
    _cache.clear()
    _plans.clear()
