"""User score_mod / mask_mod functions in their two forms: Triton (for the kernels) and PyTorch (for
create_block_mask and the CPU path), plus the generated adapters the kernels call.

A mod is written once, Triton-style: plain arithmetic and comparisons on the index arguments, `tl.where`,
`tl.minimum`, `tl.exp2`... and `tl.load(table + index)` to read an aux tensor. flashtile applies
`triton.jit` itself; for the PyTorch form it runs the same Python function with `tl` replaced by a small
torch namespace (`_TorchLanguage`) and each aux tensor by a `_Ptr`, so `tl.load(table + i)` becomes
`table.flatten()[i]`. Generated functions (adapters, and_masks/or_masks) are compiled from source kept in
linecache, where both inspect.getsource (the Triton compiler) and tracebacks find it.
"""
import ast
import inspect
import itertools
import linecache
import os
import types

import torch
import triton
import triton.language as tl

try:
    from triton.runtime.interpreter import InterpretedFunction
except ImportError:  # pragma: no cover - older Triton without the interpreter module
    InterpretedFunction = ()
from triton.runtime.jit import JITFunction

SCORE_ARGS = ("score", "b", "h", "q_idx", "kv_idx")
MASK_ARGS = ("b", "h", "q_idx", "kv_idx")
MAX_AUX = 4
_counter = itertools.count()
_TRITON = {}
_TORCH = {}
_ADAPTERS = {}
_COMBINED = {}
_RETURNS_CHECKED = set()


def is_jitted(fn):
    return isinstance(fn, (JITFunction, InterpretedFunction))


def python_function(fn):
    """The plain Python function behind fn (a @triton.jit function or a plain one)."""
    return fn.fn if is_jitted(fn) else fn


def _unique_name(fn):
    """Give fn a qualified name no other mod has. Triton names each function it inlines by module,
    qualified name and argument types, and reuses the first body compiled under a name: a score_mod and
    its score_mod_grad (both reached through generated adapters with one signature), or two masks made by
    one factory, would otherwise silently run the same code."""
    fn.__qualname__ = f"{fn.__name__}_{next(_counter)}"
    return fn


def generate(source, name, namespace):
    """Compile generated source into a plain function (with a unique qualified name) whose source
    inspect can find."""
    filename = f"<flashtile.flex generated {next(_counter)}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    scope = dict(namespace, tl=tl, __name__=__name__)  # Triton reads the generated functions' __module__
    exec(compile(source, filename, "exec"), scope)
    return _unique_name(scope[name])


def _interpreting():
    """Whether triton.jit makes interpreted functions now (Triton's own reading of TRITON_INTERPRET; older releases
    without triton.knobs read "1")."""
    knobs = getattr(triton, "knobs", None)
    return bool(knobs.runtime.interpret) if knobs is not None else os.environ.get("TRITON_INTERPRET") == "1"


def triton_form(fn):
    """fn as a Triton function: triton.jit of a copy of its Python function (of fn itself, or of the
    function behind a @triton.jit) that has a unique qualified name and sees `tl` (the interpreter needs
    triton.language among a jitted function's globals). Cached per function so repeated calls reuse one
    compiled kernel. triton.jit makes an interpreted function when TRITON_INTERPRET is set at that moment, so the
    cache keeps one of each kind (a process may switch, as the CPU tests do between the interpreter and cpu.py),
    and a jitted function fn calls that is of the other kind (a combination's parts, made in the other mode) is
    replaced by its form of this kind."""
    interpreting = _interpreting()
    key = (fn, interpreting)
    if key not in _TRITON:
        py = python_function(fn)
        glb = py.__globals__
        other_kind = {name: glb[name] for name in py.__code__.co_names
                      if is_jitted(glb.get(name)) and isinstance(glb[name], InterpretedFunction) != interpreting}
        if other_kind or not any(value is tl for value in glb.values()):
            glb = dict(glb, tl=tl, **{name: triton_form(value) for name, value in other_kind.items()})
        copy = types.FunctionType(py.__code__, glb, py.__name__, py.__defaults__, py.__closure__)
        _TRITON[key] = triton.jit(_unique_name(copy))
    return _TRITON[key]


class _Ptr:
    """An aux tensor seen as a Triton pointer by a mod's PyTorch form: `ptr + offset`, `tl.load(ptr)`."""

    def __init__(self, tensor, offset=0):
        self.flat = tensor.reshape(-1)
        self.offset = offset

    def __add__(self, other):
        return _Ptr(self.flat, self.offset + other)

    __radd__ = __add__

    def __sub__(self, other):
        return _Ptr(self.flat, self.offset - other)

    def __getitem__(self, index):
        return self.flat[self.offset + index]


def _load(ptr, mask=None, other=0):
    """tl.load on an aux tensor. An index outside it is an error here: in the kernels it would read other
    memory (only where mask is False may an index be out of range, as in Triton)."""
    n = ptr.flat.numel()
    index = torch.as_tensor(ptr.offset, device=ptr.flat.device)
    outside = (index < 0) | (index >= n)
    if mask is not None:
        outside = outside & torch.as_tensor(mask, device=index.device)
    if outside.any():
        index_b, outside_b = torch.broadcast_tensors(index, outside)
        raise IndexError(f"a mod reads an aux tensor of {n} elements at index {index_b[outside_b][0].item()}; "
                         f"keep indices inside the tensor (clamp them with tl.minimum / tl.maximum, or pass mask=)")
    values = ptr.flat[index.clamp(0, n - 1)]
    return values if mask is None else torch.where(mask, values, other)


def _pair(fn):
    return lambda a, b: fn(torch.as_tensor(a), torch.as_tensor(b))


_TorchLanguage = types.SimpleNamespace(
    load=_load, where=torch.where, abs=torch.abs, minimum=_pair(torch.minimum), maximum=_pair(torch.maximum),
    exp=torch.exp, exp2=torch.exp2, log=torch.log, log2=torch.log2, sqrt=torch.sqrt, sin=torch.sin, cos=torch.cos,
    sigmoid=torch.sigmoid, floor=torch.floor, ceil=torch.ceil, cdiv=lambda a, b: (a + b - 1) // b,
    constexpr=lambda x: x, float16=torch.float16, bfloat16=torch.bfloat16, float32=torch.float32,
    float64=torch.float64, int8=torch.int8, int16=torch.int16, int32=torch.int32, int64=torch.int64, int1=torch.bool)
_TorchLanguage.math = _TorchLanguage


def _torch_value(value):
    """What a mod's PyTorch form sees for a global name (or a module attribute) that the Triton form sees as value."""
    if value is tl or value is tl.math:
        return _TorchLanguage
    if is_jitted(value):
        return torch_form(value)
    if isinstance(value, tl.constexpr):
        return value.value
    if isinstance(value, types.ModuleType) and value is not torch:
        return _TorchModule(value)
    return value


class _TorchModule:
    """A module a mod reaches helpers through (`import flashtile.flex as F; F.tanh(x)`), seen by the PyTorch form:
    its attributes as _torch_value gives them."""

    def __init__(self, module):
        self._module = module

    def __getattr__(self, name):
        return _torch_value(getattr(self._module, name))


def torch_form(fn):
    """fn as a PyTorch function of tensors: the same code with `tl` (and every @triton.jit function it
    calls, recursively, also through a module's attribute) replaced by PyTorch equivalents. Cached per function."""
    py = python_function(fn)
    if py not in _TORCH:
        glb = dict(py.__globals__)
        for name in py.__code__.co_names:
            if name in glb:
                glb[name] = _torch_value(glb[name])
        _TORCH[py] = types.FunctionType(py.__code__, glb, py.__name__, py.__defaults__, py.__closure__)
    return _TORCH[py]


def _check_returns(py, name):
    """py returns one value on every `return` (a score, or a mask's boolean): none that is bare, None or a tuple, and
    at least one. Without this check such a mod fails deep in the Triton compiler or the PyTorch form with an
    unrelated error. Read from the source once per function; a function without source (generated) is not read."""
    if py in _RETURNS_CHECKED:
        return
    try:
        tree = ast.parse(inspect.cleandoc("\n" + inspect.getsource(py)))
    except (OSError, TypeError, SyntaxError):
        tree = None
    if tree is not None and isinstance(tree.body[0], ast.FunctionDef):
        returns = [node.value for node in _own_nodes(tree.body[0]) if isinstance(node, ast.Return)]
        if not returns:
            raise TypeError(f"{name} {py.__name__} has no return statement: it must return "
                            f"{'the new score' if name.startswith('score') else 'whether the key is visible'}")
        for value in returns:
            if value is None or (isinstance(value, ast.Constant) and value.value is None):
                raise TypeError(f"{name} {py.__name__} returns None: it must return one value per score")
            if isinstance(value, ast.Tuple):
                raise TypeError(f"{name} {py.__name__} returns a tuple of {len(value.elts)}: it must return one "
                                "value per score")
    _RETURNS_CHECKED.add(py)


def _own_nodes(func):
    """The AST nodes of func's body, not of the functions defined inside it."""
    nested = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
    todo = [node for node in func.body if not isinstance(node, nested)]
    while todo:
        node = todo.pop()
        yield node
        todo.extend(child for child in ast.iter_child_nodes(node) if not isinstance(child, nested))


def _positional_count(py):
    params = inspect.signature(py).parameters.values()
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return None
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty for p in params)


class Mod:
    """A score_mod or mask_mod with the aux tensors it reads: fn(*base arguments, *aux), where the base
    arguments are (score, b, h, q_idx, kv_idx) for a score_mod and (b, h, q_idx, kv_idx) for a mask_mod.

    Calling a Mod runs its PyTorch form on tensors (aux tensors bound), like a FlexAttention mask_mod.
    """

    def __init__(self, fn, aux=(), base=MASK_ARGS, name="mask_mod", extents=()):
        if isinstance(aux, torch.Tensor):
            aux = (aux,)
        if isinstance(fn, Mod):
            fn, aux, extents = fn.fn, fn.aux + tuple(aux), fn.extents + tuple(extents)
        if not callable(fn):
            raise TypeError(f"{name} must be a function, got {type(fn).__name__}")
        py = python_function(fn)
        if not isinstance(py, types.FunctionType):
            raise TypeError(f"{name} must be a Python function (def) or a @triton.jit function, got {py!r}")
        if py.__name__ == "<lambda>":
            raise TypeError(f"{name} must be defined with def, not lambda: Triton compiles it from its source")
        _check_returns(py, name)
        count = _positional_count(py)
        want = len(base) + len(aux)
        if count is not None and count != want:
            got = ", ".join(inspect.signature(py).parameters)
            raise TypeError(f"{name} must take ({', '.join(base)}) plus one argument per aux tensor "
                            f"({len(aux)} given): {want} arguments, got {py.__name__}({got})")
        if len(aux) > MAX_AUX:
            raise ValueError(f"{name} reads {len(aux)} aux tensors; at most {MAX_AUX} are supported")
        for i, a in enumerate(aux):
            if not isinstance(a, torch.Tensor):
                raise TypeError(f"aux[{i}] of {name} must be a torch.Tensor, got {type(a).__name__}")
            if not a.is_contiguous():  # the kernels index its memory flat: a view's order (or a broadcast) is lost
                raise ValueError(f"aux[{i}] of {name} must be contiguous (tl.load(aux + i) reads element i of its "
                                 f"memory), got shape {tuple(a.shape)} with strides {a.stride()}; call .contiguous()")
        self.fn, self.aux, self.base, self.name = fn, tuple(aux), tuple(base), name
        # (what, positions, batch): an aux table indexed by position (document_mask's ids) covers this many
        # positions (and batch rows, or None); attention checks the inputs against it (the kernels do not).
        self.extents = tuple(extents)

    def same_as(self, other):
        """The same function over the same aux tensors (by identity): the same mask."""
        return (isinstance(other, Mod) and python_function(self.fn) is python_function(other.fn)
                and len(self.aux) == len(other.aux) and all(a is b for a, b in zip(self.aux, other.aux)))

    def triton(self):
        return triton_form(self.fn)

    def __call__(self, *args):
        return torch_form(self.fn)(*args, *(_Ptr(a) for a in self.aux))

    def __repr__(self):
        return f"Mod({python_function(self.fn).__name__}, aux={len(self.aux)})"


def combine(mods, op, name):
    """A mask Mod that is op ('&' or '|') of several mask Mods; aux tensors are concatenated. The generated
    function is cached per (op, functions, aux counts), so rebuilding a combination (new document ids each
    step) reuses it."""
    key = (op, name, tuple((mod.triton(), len(mod.aux)) for mod in mods))
    if key not in _COMBINED:
        calls, namespace, n_aux = [], {}, 0
        for i, mod in enumerate(mods):
            namespace[f"F{i}"] = mod.triton()
            calls.append(f"F{i}({', '.join((*MASK_ARGS, *[f'A{n_aux + j}' for j in range(len(mod.aux))]))})")
            n_aux += len(mod.aux)
        params = ", ".join((*MASK_ARGS, *[f"A{j}" for j in range(n_aux)]))
        source = f"def {name}({params}):\n    return {f' {op} '.join(f'({c})' for c in calls)}\n"
        _COMBINED[key] = generate(source, name, namespace)
    return Mod(_COMBINED[key], tuple(a for mod in mods for a in mod.aux),
               extents=tuple(e for mod in mods for e in mod.extents))


def aux_pool(*mods):
    """The distinct aux tensors of several Mods (by identity), in order; at most MAX_AUX."""
    pool = []
    for mod in mods:
        for a in mod.aux if mod is not None else ():
            if not any(a is p for p in pool):
                pool.append(a)
    if len(pool) > MAX_AUX:
        raise ValueError(f"the mods read {len(pool)} distinct aux tensors; at most {MAX_AUX} are supported")
    return pool


def adapter(mod, pool):
    """The kernel-facing function: the fixed signature (base args, A0, A1, A2, A3) calling mod with its own
    aux tensors picked from the pool. Cached, so the kernels compile once per (mod, pool layout)."""
    slots = tuple(next(i for i, p in enumerate(pool) if p is a) for a in mod.aux)
    key = (mod.triton(), mod.base, slots)
    if key not in _ADAPTERS:
        params = ", ".join((*mod.base, "A0", "A1", "A2", "A3"))
        call = ", ".join((*mod.base, *[f"A{s}" for s in slots]))
        # A score_mod may return a constant or a function of the indices alone: where(True, r, score) broadcasts r
        # to the scores' tile, which the kernels' row reductions need (folded away for a tile-shaped r: the sm90 PTX
        # of the compile check's programmable cases is unchanged)
        result = f"tl.where(True, F({call}), score)" if mod.base == SCORE_ARGS else f"F({call})"
        source = f"def _adapter({params}):\n    return {result}\n"
        _ADAPTERS[key] = triton.jit(generate(source, "_adapter", {"F": key[0]}))
    return _ADAPTERS[key]
