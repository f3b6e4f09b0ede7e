"""Host launchers for the Triton kernels: shapes, strides, grids, configurations, output allocation.

This module holds the forward and what every launcher shares (Geometry, ScoreArgs, KernelLaunch, buffers, the Gluon
dispatch policy, launch plans); bwd_launch.py the backward, kvcache_launch.py decoding over a KV cache.
Inputs arrive validated and normalized by the API (interface.py, kvcache.py): dense (B, S, H, D) or packed
varlen (total, H, D) tensors with a unit last stride. Each kernel launch is data (KernelLaunch) so tests
can compile it ahead of time for GPUs that are not present.
"""
import functools
import os
from dataclasses import dataclass, replace
from threading import get_ident

import torch

from . import configs, fast_launch, fit, philox, plans
from .runtime import interpreter_active  # noqa: F401 (the launchers' name for it: launch.interpreter_active)
from .precision import _dot_precision  # the launchers' name for it: tests and benchmarks patch launch._dot_precision
from .kernels.fwd import _attn_fwd, _attn_probs

LOG2E = 1.4426950408889634
# Spare rows at the end of the varlen backward's Delta / Lse2 buffers (Geometry.row_buffer_shape): the dK/dV
# kernel reads whole query tiles of them unpredicated, up to a tile past the last sequence.
ROW_PAD = 128


def _env_reader(name):
    """A function returning os.environ.get(name) at each call, from os.environ's own store (CPython's os._Environ
    keeps the encoded variables in a dict, which every update of os.environ writes, monkeypatch.setenv's included):
    a dict lookup, where os.environ.get costs ~0.7 us of host time (Python-level Mapping.get, key encoding). An
    os.environ replaced by another object (mock.patch("os.environ", {...})) is read through its get."""
    environ_type, key, decode = type(os.environ), os.environ.encodekey(name), os.environ.decodevalue

    def read():
        environ = os.environ
        if type(environ) is not environ_type:
            return environ.get(name)
        value = environ._data.get(key)
        return None if value is None else decode(value)
    return read


_poison_env = _env_reader("FLASHTILE_POISON_OUTPUTS")
_gluon_env = _env_reader("FLASHTILE_GLUON")  # read by the planned forward's key


def poison_outputs():
    """FLASHTILE_POISON_OUTPUTS=1 fills outputs with NaN before the kernels run, so tests catch any element a
    kernel fails to write. Read at each call (tests switch it), once per launcher."""
    return _poison_env() not in (None, "", "0")


def _empty(shape, like, dtype=None, poison=None):
    """An output buffer of shape (at least one dim) on like's device; NaN-filled where poison (None:
    poison_outputs())."""
    dtype = dtype or like.dtype
    if poison is None:
        poison = poison_outputs()
    if poison:
        t = torch.full(shape, float("nan"), dtype=dtype, device=like.device)
    else:
        # The sizes as separate arguments: torch parses them ~0.5 us faster than one tuple or torch.Size (host time)
        t = torch.empty(*shape, dtype=dtype, device=like.device)
    allocs = plans._allocs  # read once: a recording on another thread may end meanwhile
    if allocs is not None and fast_launch.recorder_thread == get_ident():  # recording a plan (plans.record)
        allocs.append(t)
    return t


@functools.lru_cache(maxsize=None)  # per device: the property lookups cost several us of host time per call
def _arch(device):
    """The NVIDIA compute capability (major, minor) of a CUDA device; None for CPU and ROCm devices. ROCm reports
    its gfx number as a capability (MI200's gfx90a as (9, 0)), which would pick Hopper's tables and Gluon kernels:
    AMD GPUs take the generic tables (configs._table_for) and the portable kernels."""
    if device.type != "cuda" or torch.version.hip is not None:
        return None
    return torch.cuda.get_device_capability(device)


def _cdiv(a, b):
    # Plain Python: triton.cdiv is a constexpr_function in recent Triton, several us per call on the host.
    return -(-a // b)


def _next_pow2(n):
    return 1 << max(0, n - 1).bit_length()


def _head_dim_padded(head_dim):
    # tl.dot needs at least 16 along the reduction; tiles need a power of two.
    return max(16, _next_pow2(head_dim))


def _approx_tanh(q):
    """Softcap's tanh as one approximate GPU instruction: for fp16/bf16 inputs (its ~2^-11 relative error is
    below their rounding) on NVIDIA GPUs; exact for fp32, in the interpreter and on other GPUs."""
    return q.dtype != torch.float32 and q.is_cuda and torch.version.hip is None and not interpreter_active()


def _strides3(t):
    """(batch, sequence, head) strides of a (B, S, H, D) tensor, or of a packed varlen (total, H, D) one."""
    s = t.stride()  # one call, not three: this runs for every tensor of every launch (host time)
    if len(s) == 3:
        return 0, s[0], s[1]
    return s[0], s[1], s[2]


@dataclass  # not frozen (treat as immutable; dataclasses.replace): a frozen __init__ costs ~1.5 us more per call
class Geometry:
    """Sizes of one call: dense q (B, Sq, Hq, D), or varlen q (total_q, Hq, D) packed at int32 cu_seqlens.

    In varlen mode seqlen_q / seqlen_k are the maxima (they size the grid) and lse is (Hq, total_q).
    """
    batch: int
    seqlen_q: int
    seqlen_k: int
    heads_q: int
    heads_kv: int
    head_dim: int
    cu_seqlens_q: object = None
    cu_seqlens_k: object = None
    seqused_k: object = None  # int32 (B,) or None: with seqused_add, the keys each batch row uses (KV cache)
    # KV cache (seqlen_k is then the capacity): row b uses seqused_add (None: 0) + seqused_k[b] (a tensor; None: 0)
    # keys. An int cache length travels as this kernel scalar, so a decode step fills no tensor. Not a KV cache
    # when both are None.
    seqused_add: object = None
    block_table: object = None  # int32 (B, max_pages) for a paged cache (num_pages, page_size, Hk, D)
    key_start: object = None  # int32 (B,): first cache token of each row's keys (left-padded KV cache)

    @staticmethod
    def of(q, k, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0):
        if cu_seqlens_q is None:
            (batch, seqlen_q, heads_q, head_dim), (_, seqlen_k, heads_kv, _) = q.shape, k.shape  # one .shape each
            return Geometry(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim)
        return Geometry(cu_seqlens_q.numel() - 1, max_seqlen_q, max_seqlen_k, q.shape[1], k.shape[1], q.shape[2],
                        cu_seqlens_q, cu_seqlens_k)

    @property
    def is_varlen(self):
        return self.cu_seqlens_q is not None

    @property
    def is_kvcache(self):
        return self.seqused_k is not None or self.seqused_add is not None

    def lse_shape(self, q):
        return (self.heads_q, q.shape[0]) if self.is_varlen else (self.batch, self.heads_q, self.seqlen_q)

    def lse_strides(self, lse):
        return (0, lse.stride(0)) if self.is_varlen else (lse.stride(0), lse.stride(1))

    def row_buffer_shape(self, q):
        """The backward's Delta / Lse2 buffers: lse's shape when dense. Varlen: (Hq, R), sequence b's rows from
        16 * (b + cu_seqlens_q[b] // 16) (kernels/common._row_base): aligned, disjoint, within
        16 * B + total_q rounded up to 16, plus ROW_PAD rows that a tile running past the last sequence reads."""
        if not self.is_varlen:
            return self.lse_shape(q)
        return self.heads_q, 16 * self.batch + _cdiv(q.shape[0], 16) * 16 + ROW_PAD

    def page_args(self, k):
        """(block table batch stride, page size) for a paged cache; zeros otherwise (never read)."""
        if self.block_table is None:
            return 0, 0
        return self.block_table.stride(0), k.shape[1]

    def page_constexprs(self, k, block_n):
        """The kernels' paging constexprs for key tiles of block_n keys (common._kv_tile_ptrs,
        fwd._attn_fwd_inner): PAGED 0 contiguous, 2 when every key tile lies in one page (page size a multiple
        of block_n, no left padding), else 1 (one page lookup per key); PAGE_SHIFT log2 of a power-of-two page
        size (shifts instead of divisions), else -1; PAGE_PREFETCH: page numbers read a tile ahead."""
        if self.block_table is None:
            return dict(PAGED=0, PAGE_SHIFT=-1, PAGE_PREFETCH=False)
        page = k.shape[1]
        return dict(PAGED=2 if self.key_start is None and page % block_n == 0 else 1,
                    PAGE_SHIFT=page.bit_length() - 1 if page & (page - 1) == 0 else -1, PAGE_PREFETCH=True)

    def key_start_arg(self, placeholder):
        return self.key_start if self.key_start is not None else placeholder

    def cu_args(self, placeholder):
        """The two cu_seqlens pointers (the second carries seqused_k for a KV cache); any tensor stands in
        for an absent one (never read)."""
        if self.is_varlen:
            return self.cu_seqlens_q, self.cu_seqlens_k
        return placeholder, self.seqused_k if self.seqused_k is not None else placeholder


@dataclass
class KernelLaunch:
    """One kernel launch as data: run it here, or compile it ahead of time for another GPU
    (tests/compile_check.py compiles every launch for sm90 and sm80 on a machine without a GPU).
    Where the GPU has too little shared memory for the configured tiles, fit.py may halve shrink (the constexprs the
    kernel steps through: no grid axis depends on them, and what else does stays right for half of them: the split-KV
    kernel derives its split size from BLOCK_N, a page that holds whole key tiles holds whole half tiles) and
    grid_tile ((constexpr, grid axis, extent): the axis is cdiv(extent, that constexpr), no argument depends on it)."""
    kernel: object
    grid: tuple
    args: tuple
    constexprs: dict
    num_warps: int = 4
    num_stages: int = 1
    shrink: tuple = ()
    grid_tile: tuple = ()

    def run(self):
        fit.launch(self)


@dataclass  # not frozen, as Geometry: built on every call
class ScoreArgs:
    """What turns q.k products into probabilities: kernels/common._scores's runtime arguments, dropout's
    (the scale 1 / (1 - p) of kept values, and the integer threshold of common._dropout_keep:
    philox.dropout_threshold) and the constexpr switches.

    window_left / window_right are -1 for unbounded at the API (causal is right = 0); the kernels get
    Sq + Sk instead, which no position difference reaches, so the loop bounds need no special case.
    """
    alibi: torch.Tensor
    stride_alibi_b: int
    bias: torch.Tensor
    bias_strides: tuple
    rng: torch.Tensor
    qk_scale: float
    softcap_log2: float
    window_left: int
    window_right: int
    dropout_scale: float  # 1 / (1 - dropout_p) in float64, rounded once to the kernels' fp32
    dropout_threshold: int
    left_bounded: bool  # a finite left window: the key loops keep their leading masked segment
    constexprs: dict

    @staticmethod
    def make(geo, softmax_scale, window_left, window_right, softcap, alibi_slopes, placeholder, attn_bias=None,
             dropout_p=0.0, rng=None, approx_tanh=False):
        """placeholder: any fp32 tensor, passed where an optional tensor argument is absent.
        attn_bias: 4-D, broadcastable to (B, Hq, max_q, max_k) (size-1 dims are read with stride 0), or None;
        in varlen mode indexed by positions within each sequence. rng: int64 (1,) Philox seed when
        dropout_p > 0. approx_tanh: softcap through the GPU's tanh.approx (see _approx_tanh)."""
        unbounded = geo.seqlen_q + geo.seqlen_k
        has_alibi = alibi_slopes is not None
        has_bias = attn_bias is not None
        return ScoreArgs(
            alibi=alibi_slopes if has_alibi else placeholder,
            stride_alibi_b=alibi_slopes.stride(0) if has_alibi and alibi_slopes.dim() == 2 else 0,
            bias=attn_bias if has_bias else placeholder,
            bias_strides=tuple(0 if size == 1 else stride for size, stride in zip(attn_bias.shape, attn_bias.stride()))
            if has_bias else (0, 0, 0, 0),
            rng=rng if dropout_p > 0 else placeholder,
            qk_scale=softmax_scale / softcap if softcap > 0 else softmax_scale * LOG2E,
            softcap_log2=softcap * LOG2E,
            window_left=window_left if window_left >= 0 else unbounded,
            window_right=window_right if window_right >= 0 else unbounded,
            dropout_scale=1.0 / (1.0 - dropout_p) if dropout_p > 0 else 1.0,
            dropout_threshold=philox.dropout_threshold(dropout_p),
            left_bounded=window_left >= 0,
            constexprs=dict(IS_LOCAL=window_left >= 0 or window_right >= 0,
                            SOFTCAP=(2 if approx_tanh else 1) if softcap > 0 else 0,
                            HAS_ALIBI=has_alibi, HAS_BIAS=has_bias, HAS_DROPOUT=dropout_p > 0),
        )

    def keys_per_row(self, seqlen_k):
        """The most keys one query row can attend to (the window's span, at most seqlen_k)."""
        return min(seqlen_k, self.window_left + self.window_right + 1)

    def score_scalars(self):
        """_scores's runtime scalars: what the split-KV decode kernel takes (it has no dropout)."""
        return self.qk_scale, self.softcap_log2, self.window_left, self.window_right

    def scalars(self):
        """The score scalars, then dropout_scale and the threshold: the forward, backward and probabilities kernels."""
        return (*self.score_scalars(), self.dropout_scale, self.dropout_threshold)


@dataclass(frozen=True)
class ModArgs:
    """Programmable attention (flashtile.flex) as kernel arguments: the user mods as generated adapters
    (JITFunctions taking aux0..aux3, or None), up to four aux tensors, and a block mask's index lists.

    kv_lists: (num, idx, full_num, full_idx) for the forward and dQ kernels, (B, H, Sq / bm) and
    (B, H, Sq / bm, Sk / bn) int32; q_lists: the transposed ones for dK/dV. None without a block mask.
    """
    aux: tuple
    score_mod: object = None
    score_mod_grad: object = None
    mask_mod: object = None
    block_size: tuple = None
    kv_lists: tuple = None
    q_lists: tuple = None

    @staticmethod
    def make(aux=(), score_mod=None, score_mod_grad=None, mask_mod=None, block_mask=None):
        """aux: up to 4 tensors; block_mask: a flashtile.flex.BlockMask (already checked against the inputs)."""
        aux = tuple(aux)
        if block_mask is None:
            return ModArgs(aux, score_mod, score_mod_grad, mask_mod)
        bm = block_mask
        # Contiguous lists (a no-op for create_block_mask's): the kernels read an index list's last dim as ptr + i and
        # take the full lists' strides from the partial ones'.
        kv = tuple(t.contiguous() for t in (bm.kv_num_blocks, bm.kv_indices, bm.full_kv_num_blocks, bm.full_kv_indices))
        q = tuple(t.contiguous() for t in (bm.q_num_blocks, bm.q_indices, bm.full_q_num_blocks, bm.full_q_indices))
        return ModArgs(aux, score_mod, score_mod_grad, mask_mod, tuple(bm.block_size), kv, q)

    @staticmethod
    def _list_args(lists, placeholder):
        """The four list pointers and the (batch, head, row) strides of the counts and of the indices."""
        if lists is None:
            return (placeholder,) * 4 + (0,) * 6
        num, idx = lists[0], lists[1]
        strides = [0 if num.shape[i] == 1 else num.stride(i) for i in range(3)]
        strides += [0 if idx.shape[i] == 1 else idx.stride(i) for i in range(3)]
        return (*lists, *strides)

    def args(self, placeholder, transposed=False):
        aux = (*self.aux, *(placeholder,) * (4 - len(self.aux)))  # absent aux tensors: never read
        return (*aux, *self._list_args(self.q_lists if transposed else self.kv_lists, placeholder))

    def constexprs(self, grad=False):
        sparse = self.block_size is not None
        extra = dict(SCORE_MOD_GRAD=self.score_mod_grad) if grad else {}
        return dict(SCORE_MOD=self.score_mod, MASK_MOD=self.mask_mod, BLOCK_SPARSE=sparse,
                    SPARSE_M=self.block_size[0] if sparse else 128, SPARSE_N=self.block_size[1] if sparse else 128,
                    **extra)

    def tiles(self, cfg):
        """Block masks hold power-of-two blocks: tiles larger than a block shrink to it, so every block is
        a whole number of tiles (a (128, 128) mask runs the default 128 x 64 forward tiles)."""
        if self.block_size is None:
            return cfg
        return replace(cfg, BLOCK_M=min(cfg.BLOCK_M, self.block_size[0]),
                       BLOCK_N=min(cfg.BLOCK_N, self.block_size[1]))


_NO_MODS = ModArgs(())  # plain attention: shared, so a call does not build one (host time)


def forward_launches(geo, q, k, v, out, lse, sink, sa, arch, interpreter, mods=None):
    """The forward's one launch, writing out (q's shape) and lse (geo.lse_shape).

    sa: ScoreArgs; sink: fp32 (Hq,) attention-sink logits or None; mods: ModArgs or None.
    """
    head_dim_pad = _head_dim_padded(geo.head_dim)
    mods = mods or _NO_MODS
    precision = _dot_precision(q.dtype, arch)  # read once: the tiles suit the dots (configs._IEEE_FWD)
    cfg = mods.tiles(configs.fwd_config(arch, head_dim_pad, sa.constexprs["IS_LOCAL"], q.dtype, interpreter,
                                        sa.keys_per_row(geo.seqlen_k), precision))
    return [KernelLaunch(
        _attn_fwd, (_cdiv(geo.seqlen_q, cfg.BLOCK_M), geo.batch * geo.heads_q),
        (q, k, v, out, lse, sa.alibi, sink if sink is not None else lse, *geo.cu_args(lse), sa.bias,
         geo.block_table if geo.block_table is not None else lse, geo.key_start_arg(lse), sa.rng,
         *_strides3(q), *_strides3(k), *_strides3(v), *_strides3(out), *geo.lse_strides(lse),
         sa.stride_alibi_b, *sa.bias_strides, *geo.page_args(k),
         geo.seqlen_q, geo.seqlen_k, geo.seqused_add or 0, geo.heads_q, geo.heads_q // geo.heads_kv, *sa.scalars(),
         *mods.args(lse)),
        dict(HEAD_DIM=geo.head_dim, HEAD_DIM_PAD=head_dim_pad, BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N,
             HAS_SINK=sink is not None, IS_VARLEN=geo.is_varlen, SEQUSED_K=geo.is_kvcache,
             HAS_SEQUSED_TENSOR=geo.seqused_k is not None,
             **geo.page_constexprs(k, cfg.BLOCK_N), LEFTPAD=geo.key_start is not None, LEFT_BOUNDED=sa.left_bounded,
             DOT_PRECISION=precision,
             **sa.constexprs, **mods.constexprs()),
        cfg.num_warps, cfg.num_stages, shrink=("BLOCK_N",),
        grid_tile=("BLOCK_M", 0, geo.seqlen_q),
    )]


def probs_launches(geo, q, k, lse, probs, sa, arch, interpreter):
    """The attention-probabilities kernel (return_attn_probs): writes probs (B, Hq, max_q, max_k) from q, k, lse."""
    head_dim_pad = _head_dim_padded(geo.head_dim)
    precision = _dot_precision(q.dtype, arch)
    cfg = configs.fwd_config(arch, head_dim_pad, sa.constexprs["IS_LOCAL"], q.dtype, interpreter, precision=precision)
    return [KernelLaunch(
        _attn_probs, (_cdiv(geo.seqlen_q, cfg.BLOCK_M), geo.batch * geo.heads_q),
        (q, k, lse, probs, sa.alibi, *geo.cu_args(lse), sa.bias, sa.rng,
         *_strides3(q), *_strides3(k), *geo.lse_strides(lse), sa.stride_alibi_b, *sa.bias_strides,
         geo.seqlen_q, geo.seqlen_k, geo.heads_q, geo.heads_q // geo.heads_kv, *sa.scalars()),
        dict(HEAD_DIM=geo.head_dim, HEAD_DIM_PAD=head_dim_pad, BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N,
             IS_VARLEN=geo.is_varlen, DOT_PRECISION=precision, **sa.constexprs),
        cfg.num_warps, 1, shrink=("BLOCK_N",), grid_tile=("BLOCK_M", 0, geo.seqlen_q),
    )]


def _window_span(left, right):
    """The keys one row's window covers (left + right + 1), None unless both sides are bounded: what
    configs.gluon_fwd_wanted / gluon_bwd_wanted compare with their narrow-window limits."""
    return left + right + 1 if left >= 0 and right >= 0 else None


_gluon_mods = None


def _gluon_modules():
    """(gluon_launch, gluon_bwd_launch), imported on first use (they import this module); then from a global,
    since an import statement in a function costs ~2 us of host time per call."""
    global _gluon_mods
    if _gluon_mods is None:
        from . import gluon_bwd_launch, gluon_launch

        _gluon_mods = gluon_launch, gluon_bwd_launch
    return _gluon_mods


def _try_gluon(env_var, wanted, supported, run, disable):
    """The Hopper Gluon kernels' dispatch policy, shared by the forward and the backward: run() where the
    environment variable env_var is "1" or, unset, where wanted() (configs.py's measured thresholds on a tested
    triton), and only if supported(); "0" never. A launch that fails to build calls disable(exc) (one warning; the
    path stays off for the process). None where the portable kernels must answer."""
    choice = os.environ.get(env_var)
    if choice == "0" or not (choice == "1" or wanted()) or not supported():
        return None
    try:
        return run()
    except torch.OutOfMemoryError:
        raise
    except Exception as exc:  # noqa: BLE001  (compile or host-API errors; the portable kernels still serve)
        disable(exc)
        return None


def _gluon_forward(q, k, v, softmax_scale, window_left, window_right, softcap, alibi_slopes, sink,
                   cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0, attn_bias=None,
                   dropout_p=0.0, rng=None):
    """(out, lse) from the Hopper Gluon forward (gluon_launch.py; plain, causal, windows, softcap, ALiBi, sinks,
    additive biases in the layouts gluon_launch.bias_ok takes, dropout; dense or varlen) where configs.py says it is
    faster (keyed by head dim and causal: a window other than (-1, 0) counts as not causal; varlen by
    max_seqlen_k; a bias takes the thresholds of its mask) on a tested triton, else None. FLASHTILE_GLUON=1 takes
    it wherever it is supported, =0 never. A launch that fails to build disables it for the process (one
    warning) and returns None."""
    gluon_launch = _gluon_modules()[0]
    causal = window_left < 0 and window_right == 0
    span = _window_span(window_left, window_right)
    varlen = cu_seqlens_q is not None
    keys = max_seqlen_k if varlen else k.shape[1]
    features = dict(window_size=(window_left, window_right), softcap=softcap, alibi_slopes=alibi_slopes, sink=sink)
    if attn_bias is not None:
        features["attn_bias"] = attn_bias
    if dropout_p:
        features.update(dropout_p=dropout_p, rng=rng)
    if varlen:
        features.update(cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                        max_seqlen_k=max_seqlen_k)
    plain = not dropout_p and gluon_launch.plain_dense(False, (window_left, window_right), softcap, alibi_slopes, sink,
                                                       cu_seqlens_q, attn_bias)
    return _try_gluon(
        "FLASHTILE_GLUON",
        lambda: gluon_launch.tested_triton() and configs.gluon_fwd_wanted(q.shape[-1], causal, keys, span, plain),
        lambda: gluon_launch.gluon_supported(q, k, v, **features),
        lambda: gluon_launch.gluon_forward(q, k, v, softmax_scale,
                                           variant=configs.gluon_fwd_variant(q.shape[-1], causal, keys, plain),
                                           **features),
        gluon_launch.disable)


def _signature(t):
    """What a plan's key holds of one input tensor (plans.py)."""
    return t.shape, t.stride(), t.dtype, t.get_device()


def _plannable(q):
    """q has a dtype and head dim of the Gluon kernels (forward and backward alike), so a plan may exist: other
    calls (fp32, other head dims) go to the launchers without building a plan's key, on the portable kernels too.
    fp16 / bf16 only also keeps torch's TF32 switch (the portable kernels' fp32 dot precision) out of the key."""
    gluon_launch = _gluon_modules()[0]
    return q.dtype in gluon_launch._DTYPES and q.shape[-1] in gluon_launch.HEAD_DIMS


def _replay(plan, inputs, gluon_module, scalars=()):
    """plans.replay of plan on inputs (and the per-call scalars), buffers on the first input's device. A failing
    launch drops the plans; in a plan of gluon_module's kernels it disables them as _try_gluon would (None: the
    caller takes the portable path), in a plan of the portable kernels alone (no Gluon kernel, or gluon_module None:
    the decode and append plans) it raises (the normal path would launch the same kernels)."""
    poison = poison_outputs()
    try:
        return plans.replay(plan, inputs, lambda shape, dtype: _empty(shape, inputs[0], dtype, poison),
                            _gluon_modules()[0].tma_descriptor, scalars)
    except torch.OutOfMemoryError:
        raise
    except Exception as exc:  # noqa: BLE001  (as _try_gluon: the portable kernels still serve)
        plans.clear()
        # is_gluon: triton's JITFunction method (3.6 and later; plans exist only on the tested triton)
        if gluon_module is None or not any(getattr(launch.kernel, "is_gluon", bool)() for launch in plan.launches):
            raise
        gluon_module.disable(exc)
        return None


def _planned_forward(q, k, v, softmax_scale, window_left, window_right):
    """(out, lse) of a CUDA call without optional features (no softcap, ALiBi, sink, bias, varlen, dropout, mods):
    the Gluon forward where _gluon_forward takes it, else the portable kernel, replayed from its plan after the
    first call of its signature (plans.py; the key: the inputs' shapes, strides, dtypes and devices, which of them
    alias, the scale, the window, FLASHTILE_GLUON and whether the Gluon forward is still on). None where the
    signature has no plan (plans.DECLINED): the caller takes the normal path."""
    gluon_launch = _gluon_modules()[0]
    inputs = (q, k, v)
    # _signature(q), _signature(k), _signature(v) spelled out, and aliasing's common answer first (host time)
    key = ("fwd", _gluon_env(), gluon_launch._disabled is None, q.shape, q.stride(), q.dtype, q.get_device(),
           k.shape, k.stride(), k.dtype, k.get_device(), v.shape, v.stride(), v.dtype, v.get_device(),
           None if q is not k and k is not v and q is not v else plans.aliasing(inputs), softmax_scale, window_left,
           window_right)
    return _planned(key, inputs, gluon_launch,
                    lambda: (_gluon_forward(q, k, v, softmax_scale, window_left, window_right, 0.0, None, None)
                             or _portable_forward(q, k, v, softmax_scale, window_left, window_right, 0.0, None, None)))


def _planned(key, inputs, gluon_module, run, slots=(), scalars=()):
    """run() (the launchers' call on inputs, whose signature is key) replayed from key's plan, or None at once where
    key was declined, else run as it is and recorded (plans.record). slots / scalars: plans.record's and
    plans.replay's per-call scalars."""
    plan = plans.get(key)
    if plan is plans.DECLINED:
        return None
    if plan is not None:
        result = _replay(plan, inputs, gluon_module, scalars)
        if result is not None:
            return result
    return plans.record(key, inputs, run, getattr(_gluon_modules()[0], "_GluonDescriptor", None), slots, scalars)


def _gluon_sparse_forward(q, k, v, softmax_scale, window_left, window_right, mods):
    """(out, lse) of flashtile.attention's block-sparse forward from the Hopper Gluon kernel (gluon_launch.sparse_ok:
    a block mask with a mask_mod or none, no score_mod, blocks that are multiples of its tiles, D64 / D128 / D256) on a
    tested triton, else None. FLASHTILE_GLUON_SPARSE (read per call, so a benchmark can time both paths in one
    process): "0" never, "1" wherever supported (any triton), unset: as FLASHTILE_GLUON ("0" turns it off too;
    the dense thresholds of configs.gluon_fwd_wanted are not applied: a block-sparse row visits fewer keys). A
    launch that fails to build sends that mask_mod to the portable kernel (gluon_launch.sparse_failed)."""
    gluon_launch = _gluon_modules()[0]
    return _try_gluon(
        "FLASHTILE_GLUON_SPARSE" if "FLASHTILE_GLUON_SPARSE" in os.environ else "FLASHTILE_GLUON",
        gluon_launch.tested_triton,
        lambda: gluon_launch.sparse_ok(q, k, v, window_left, window_right, mods),
        lambda: gluon_launch.gluon_sparse_forward(q, k, v, softmax_scale, mods),
        lambda exc: gluon_launch.sparse_failed(mods, exc))


def _flash_attn_forward(q, k, v, softmax_scale, window_left, window_right, softcap, alibi_slopes, sink,
                        cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0, attn_bias=None,
                        dropout_p=0.0, rng=None, mods=None):
    """out (q's shape and dtype) and lse fp32 (B, Hq, Sq), or (Hq, total_q) when cu_seqlens are given.

    dropout_p > 0: rng is the int64 (1,) Philox seed on q's device; the backward gets the same one.
    mods: ModArgs (programmable attention) or None.
    """
    # The Gluon forward serves dense and varlen calls without mods, biases in the layouts it reads by TMA
    # (gluon_launch.bias_ok; the others stay here), and its out / lse are what the portable backward expects with
    # or without a bias or dropout (the same draws: gluon_dropout) (paged varlen has its own launcher,
    # _flash_attn_forward_varlen_paged, which never comes here).
    gluon_candidate = softmax_scale > 0 and mods is None
    if (mods is not None and q.is_cuda and softmax_scale > 0 and not dropout_p and cu_seqlens_q is None
            and sink is None and attn_bias is None and alibi_slopes is None and not softcap):
        result = _gluon_sparse_forward(q, k, v, softmax_scale, window_left, window_right, mods)
        if result is not None:
            return result
    if gluon_candidate and q.is_cuda:
        result = None
        if (alibi_slopes is None and sink is None and cu_seqlens_q is None and attn_bias is None and not softcap
                and not dropout_p and _plannable(q)):
            result = _planned_forward(q, k, v, softmax_scale, window_left, window_right)
        if result is None:
            result = _gluon_forward(q, k, v, softmax_scale, window_left, window_right, softcap, alibi_slopes, sink,
                                    cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, attn_bias, dropout_p, rng)
        if result is not None:
            return result
    return _portable_forward(q, k, v, softmax_scale, window_left, window_right, softcap, alibi_slopes, sink,
                             cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, attn_bias, dropout_p, rng, mods)


def _portable_forward(q, k, v, softmax_scale, window_left, window_right, softcap, alibi_slopes, sink,
                      cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0, attn_bias=None,
                      dropout_p=0.0, rng=None, mods=None):
    """_flash_attn_forward on the portable Triton kernel (kernels/fwd.py): every GPU, the interpreter, every
    feature."""
    geo = Geometry.of(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    poison = poison_outputs()
    out = _empty(q.shape, q, poison=poison)
    lse = _empty(geo.lse_shape(q), q, torch.float32, poison)
    sa = ScoreArgs.make(geo, softmax_scale, window_left, window_right, softcap, alibi_slopes, lse, attn_bias,
                        dropout_p, rng, approx_tanh=_approx_tanh(q))
    for launch in forward_launches(geo, q, k, v, out, lse, sink, sa, _arch(q.device), interpreter_active(),
                                   mods):
        launch.run()
    return out, lse


def _flash_attn_probs(q, k, lse, softmax_scale, window_left, window_right, softcap, alibi_slopes,
                      cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0, attn_bias=None,
                      dropout_p=0.0, rng=None):
    """The attention probabilities (B, Hq, max_q, max_k) in q's dtype, negated where dropout dropped them;
    zero outside each sequence in varlen mode. O(Sq * Sk) memory: for tests at small sizes."""
    geo = Geometry.of(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    shape = (geo.batch, geo.heads_q, geo.seqlen_q, geo.seqlen_k)
    probs = torch.zeros(shape, dtype=q.dtype, device=q.device) if geo.is_varlen else _empty(shape, q)
    sa = ScoreArgs.make(geo, softmax_scale, window_left, window_right, softcap, alibi_slopes, lse, attn_bias,
                        dropout_p, rng, approx_tanh=_approx_tanh(q))
    for launch in probs_launches(geo, q, k, lse, probs, sa, _arch(q.device), interpreter_active()):
        launch.run()
    return probs
