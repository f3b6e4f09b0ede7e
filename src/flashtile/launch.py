"""Host launchers for the Triton kernels: shapes, strides, grids, configurations, output allocation.

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
from .kernels.bwd import _attn_bwd_dkdv, _attn_bwd_dq, _attn_bwd_dq_convert, _attn_bwd_preprocess
from .kernels.decode import _attn_combine, _attn_fwd_splitkv
from .kernels.fwd import _attn_fwd, _attn_probs
from .kernels.rotary import _rotary_append

LOG2E = 1.4426950408889634
# Spare rows at the end of the varlen backward's Delta / Lse2 buffers (Geometry.row_buffer_shape): the dK/dV
# kernel reads whole query tiles of them unpredicated, up to a tile past the last sequence.
ROW_PAD = 128


def interpreter_active():
    """True when Triton kernels run through the interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


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
_gluon_env = _env_reader("FLASHTILE_GLUON")  # the switches read by the planned calls' keys
_gluon_bwd_env = _env_reader("FLASHTILE_GLUON_BWD")


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
    if device.type != "cuda":
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


def _tf32_matmuls():
    """PyTorch's switch for TF32 in fp32 matmuls: torch.backends.cuda.matmul.fp32_precision where it exists (torch
    2.9+; "none" defers to torch.backends.fp32_precision, whose "none" is ieee), else allow_tf32. The legacy flag
    follows the new setting, but reading it raises once a program has set the new one (torch 2.13)."""
    matmul = torch.backends.cuda.matmul
    precision = getattr(matmul, "fp32_precision", None)
    if precision is None:
        return matmul.allow_tf32
    if precision == "none":
        precision = getattr(torch.backends, "fp32_precision", "none")
    return precision == "tf32"


# NVIDIA GPUs whose TF32 tensor cores run 7-8x their FP32 FMA rate (A100, H100 / H200, B200): three TF32 products
# per fp32 product beat FMA dots there (2.9-6.5x on the H200). GeForce-class parts (sm86 / sm89 / sm120) run TF32 at
# 1-2x their FP32 rate, where tf32x3 would likely lose; not measured, so they keep FMA dots.
TF32X3_ARCHS = ((8, 0), (9, 0), (10, 0), (10, 3))


def _dot_precision(dtype, arch):
    """The kernels' DOT_PRECISION (fp16 / bf16 ignore it). fp32 follows PyTorch's TF32 switch: on, TF32 tensor-core
    dots; off (PyTorch's default), fp32-level accuracy: "tf32x3" (each product as three TF32 ones, CUTLASS's 3xTF32,
    which SDPA's fp32 kernel uses too) on TF32X3_ARCHS, 2.9-6.5x faster than FMA dots on the H200 with errors as small
    (docs/perf-log.md, sessions 21-22); FMA dots ("ieee") elsewhere (other GPUs, ROCm, CPU tensors)."""
    if dtype != torch.float32 or _tf32_matmuls():
        return "tf32"
    if arch in TF32X3_ARCHS and torch.version.hip is None:
        return "tf32x3"
    return "ieee"


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
    (the probability, whose 1 / (1 - p) scales kept values, and the integer threshold of common._dropout_keep:
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
    dropout_p: float
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
            dropout_p=float(dropout_p),
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
        """The score scalars, then dropout_p and its threshold: the forward, backward and probabilities kernels."""
        return (*self.score_scalars(), self.dropout_p, self.dropout_threshold)


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
        return ModArgs(aux, score_mod, score_mod_grad, mask_mod, tuple(bm.block_size),
                       (bm.kv_num_blocks, bm.kv_indices, bm.full_kv_num_blocks, bm.full_kv_indices),
                       (bm.q_num_blocks, bm.q_indices, bm.full_q_num_blocks, bm.full_q_indices))

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


@functools.lru_cache(maxsize=None)
def _num_sms(device):
    # Under the interpreter (CPU tensors) the heuristic plans for an H200, so tests exercise it as the GPU would.
    if device.type != "cuda":
        return 132
    return torch.cuda.get_device_properties(device).multi_processor_count


def uses_splitkv(geo, num_splits):
    """The split-KV kernel serves a KV-cache call when few query rows share each KV head: it reads each K/V
    byte once per group_size * Sq packed rows where the forward reads it once per query head, and splits
    long caches over more programs. Longer query chunks (prefill) keep the forward kernel, whose
    per-position query blocks skip work under causal masks. An explicit num_splits > 1 is always honoured."""
    rows = geo.seqlen_q * (geo.heads_q // geo.heads_kv)
    return geo.is_kvcache and (rows <= configs.DECODE_MAX_ROWS or num_splits > 1)


def splitkv_plan(geo, max_seqlen_k, num_splits, arch, dtype, device, interpreter):
    """(tile config, number of splits, dot precision): num_splits as given (at most configs.MAX_SPLITS), or from
    the heuristic when 0, for the longest row's max_seqlen_k keys; the tiles suit the precision's dots."""
    rows = geo.seqlen_q * (geo.heads_q // geo.heads_kv)
    precision = _dot_precision(dtype, arch)
    cfg = configs.decode_config(arch, _head_dim_padded(geo.head_dim), rows, dtype, interpreter, precision)
    return cfg, split_count(num_splits, splitkv_programs(geo, cfg), max_seqlen_k, cfg.BLOCK_N, device), precision


def splitkv_programs(geo, cfg):
    """Programs of one split of the split-KV kernel: a tile of cfg.BLOCK_M packed query rows per (batch, KV head)."""
    return geo.batch * geo.heads_kv * _cdiv(geo.seqlen_q * (geo.heads_q // geo.heads_kv), cfg.BLOCK_M)


def split_count(num_splits, programs, max_seqlen_k, block_n, device):
    """splitkv_plan's number of splits: num_splits (at most configs.MAX_SPLITS), or the heuristic's when 0."""
    if num_splits > 0:
        return min(num_splits, configs.MAX_SPLITS)
    return configs.num_splits_heuristic(programs, _cdiv(max_seqlen_k, block_n), _num_sms(device))


def splitkv_launches(geo, q, k, v, out, lse, sa, cfg, num_splits, precision):
    """The split-KV kernel, and with num_splits > 1 the combine kernel, writing out (q's shape) and lse
    (B, Hq, Sq). The splits' partial outputs go to an fp32 workspace (num_splits, B, Sq, Hq, D) and lse
    (num_splits, B, Hq, Sq); one split writes out and lse directly."""
    group_size = geo.heads_q // geo.heads_kv
    head_dim_pad = _head_dim_padded(geo.head_dim)
    if num_splits > 1:
        out_acc = _empty((num_splits, *q.shape), q, torch.float32)
        lse_acc = _empty((num_splits, *lse.shape), q, torch.float32)
        split_strides = out_acc.stride(0), lse_acc.stride(0)
    else:
        out_acc, lse_acc, split_strides = out, lse, (0, 0)
    acc4 = out_acc if num_splits == 1 else out_acc[0]
    lse3 = lse_acc if num_splits == 1 else lse_acc[0]
    main = KernelLaunch(
        _attn_fwd_splitkv, (num_splits, geo.batch * geo.heads_kv, _cdiv(geo.seqlen_q * group_size, cfg.BLOCK_M)),
        (q, k, v, out_acc, lse_acc, sa.alibi, geo.seqused_k if geo.seqused_k is not None else lse,
         geo.block_table if geo.block_table is not None else lse,
         geo.key_start_arg(lse), *_strides3(q), *_strides3(k), *_strides3(v), split_strides[0], *_strides3(acc4),
         split_strides[1], lse3.stride(0), lse3.stride(1), sa.stride_alibi_b, *geo.page_args(k),
         geo.seqlen_q, geo.heads_kv, group_size, num_splits, geo.seqused_add or 0, *sa.score_scalars()),
        dict(HEAD_DIM=geo.head_dim, HEAD_DIM_PAD=head_dim_pad, BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N,
             IS_LOCAL=sa.constexprs["IS_LOCAL"], SOFTCAP=sa.constexprs["SOFTCAP"],
             HAS_ALIBI=sa.constexprs["HAS_ALIBI"], **geo.page_constexprs(k, cfg.BLOCK_N),
             LEFTPAD=geo.key_start is not None, LEFT_BOUNDED=sa.left_bounded,
             DOT_PRECISION=precision, HAS_SEQUSED_TENSOR=geo.seqused_k is not None),
        cfg.num_warps, cfg.num_stages, shrink=("BLOCK_N",),
    )
    if num_splits == 1:
        return [main]
    combine = KernelLaunch(
        _attn_combine, (geo.batch * geo.seqlen_q * geo.heads_q,),
        (out_acc, lse_acc, out, lse, split_strides[0], *_strides3(acc4), split_strides[1], lse3.stride(0),
         lse3.stride(1), *_strides3(out), lse.stride(0), lse.stride(1), geo.seqlen_q, geo.heads_q, num_splits),
        dict(HEAD_DIM=geo.head_dim, HEAD_DIM_PAD=head_dim_pad, BLOCK_S=16),
    )
    return [main, combine]


def rotary_append_launches(q, q_out, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, block_table,
                           interleaved, q_local, cache_add=0):
    """The KV-cache append with fused rotary as one launch (none when there is nothing to do).

    q_out: q's shape, written with the rotated q when rotary_cos is given (else neither read nor written).
    k, v (B, Sk_new, Hk, D) or None; rotary_cos/sin (seqlen_ro, rotary_dim / 2) or None; row b's new tokens go
    at cache_add (an int) + cache_seqlens[b] (int32 (B,), or None for 0): an int cache length needs no tensor;
    block_table int32 (B, max_pages) into a paged cache, or None for a contiguous one.
    """
    rotary = rotary_cos is not None
    heads_q_rot = q.shape[2] if rotary else 0
    seqlen_new, heads_kv = (k.shape[1], k.shape[2]) if k is not None else (0, 0)
    seqlen_q = q.shape[1] if rotary else 0
    grid = (max(seqlen_q, seqlen_new), q.shape[0], heads_q_rot + heads_kv)
    if 0 in grid:
        return []
    # Absent tensors: q stands in (never read), as do zero strides.
    k, v = (k, v) if k is not None else (q, q)
    cos, sin = (rotary_cos, rotary_sin) if rotary else (q, q)
    stride_bt, page_size = (block_table.stride(0), k_cache.shape[1]) if block_table is not None else (0, 0)
    return [KernelLaunch(
        _rotary_append, grid,
        (q, q_out, k, v, k_cache, v_cache, cos, sin, cache_seqlens if cache_seqlens is not None else q,
         block_table if block_table is not None else q,
         *_strides3(q), *_strides3(q_out), *_strides3(k), *_strides3(v), *_strides3(k_cache), *_strides3(v_cache),
         *cos.stride()[:2], *sin.stride()[:2], stride_bt, page_size,
         seqlen_q, seqlen_new, heads_q_rot, rotary_cos.shape[1] if rotary else 0, cache_add),
        dict(HEAD_DIM=q.shape[3], HEAD_DIM_PAD=_next_pow2(q.shape[3]), ROTARY=rotary,
             INTERLEAVED=interleaved, Q_LOCAL=q_local, PAGED=block_table is not None,
             HAS_CACHE_SEQLENS=cache_seqlens is not None),
        num_warps=1,
    )]


def _kvcache_append(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, block_table, interleaved,
                    q_local, cache_add=0):
    """Writes k (rotated) and v into the cache in place; returns q rotated (q's shape and dtype) when rotary_cos
    is given, else an empty tensor. Arguments: see rotary_append_launches. A CUDA call is replayed from its plan
    after the first of its signature (_planned_append), as the decode step that follows it."""
    tensors = (q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, block_table)
    result = None
    if q.is_cuda and _plannable(q) and 0 <= cache_add < 2**31:  # cache_add: an i32 argument, as recorded
        result = _planned_append(tensors, interleaved, q_local, cache_add)
    if result is None:
        result = _append_launches(*tensors, interleaved, q_local, cache_add)
    return result[0] if rotary_cos is not None else q.new_empty(0)


def _append_launches(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, block_table, interleaved,
                     q_local, cache_add):
    """_kvcache_append's launch as it runs without a plan: (rotated q,) with rotary_cos, else ()."""
    rotary = rotary_cos is not None
    q_out = _empty(q.shape, q) if rotary else q  # without rotary q stands in, neither read nor written
    for launch in rotary_append_launches(q, q_out, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                                         block_table, interleaved, q_local, cache_add):
        launch.run()
    return (q_out,) if rotary else ()


# The append kernel's cache-length argument: a plan's per-call scalar (unspecialized, as the split-KV kernel's).
_CACHE_ADD_ARG = _rotary_append.arg_names.index("cache_add")


def _planned_append(tensors, interleaved, q_local, cache_add):
    """_append_launches' result from its plan (plans.py), or None (the caller runs the launch). The key: each of
    tensors' shape, strides, dtype and device (None for an absent one), which of them alias, interleaved and
    q_local; not the cache length cache_add, which each replay passes to the kernel (plans' scalar slot)."""
    inputs = tuple(t for t in tensors if t is not None)
    key = ("append", *(None if t is None else _signature(t) for t in tensors), plans.aliasing(inputs), interleaved,
           q_local)
    return _planned(key, inputs, None, lambda: _append_launches(*tensors, interleaved, q_local, cache_add),
                    slots=((_rotary_append, _CACHE_ADD_ARG),), scalars=(cache_add, ))


def _dkdv_descriptors(geo, q, dout, block_m, head_dim_pad):
    """TMA descriptors over q and dout viewed as (rows, heads_q * head_dim), block [block_m, head_dim_pad], for
    the dK/dV kernel's Q_DESC path; None where that view does not exist or TMA cannot address it (a padded head
    dim, heads not adjacent, batches not adjacent, 16-byte alignment)."""
    from triton.tools.tensor_descriptor import TensorDescriptor  # triton >= 3.4

    if geo.head_dim != head_dim_pad:
        return None
    descs = []
    for t in (q, dout):
        s = t.stride()
        rows = t.shape[0] if geo.is_varlen else t.shape[0] * t.shape[1]
        stride_m, stride_h = s[-3], s[-2]
        if (s[-1] != 1 or stride_h != geo.head_dim or (not geo.is_varlen and s[0] != t.shape[1] * stride_m)
                or (stride_m * t.element_size()) % 16 or t.data_ptr() % 16):
            return None
        descs.append(TensorDescriptor(t, [rows, geo.heads_q * geo.head_dim], [stride_m, 1],
                                      [block_m, head_dim_pad]))
    return descs


PRE_BLOCK = 64  # rows per preprocess program


def sink_parts(geo, like):
    """The preprocess's zero-filled (B * Hq, row blocks) buffer of sink-gradient pieces (varlen programs past
    a sequence's end write nothing)."""
    return torch.zeros((geo.batch * geo.heads_q, _cdiv(geo.seqlen_q, PRE_BLOCK)), dtype=torch.float32,
                       device=like.device)


def sink_grad(parts, heads_q):
    """d loss / d sink (Hq,) fp32 from sink_parts after the preprocess: -sum over batch and rows of
    exp(sink - lse) * (delta - dlse)."""
    return -parts.view(-1, heads_q, parts.shape[-1]).sum((0, 2))


def preprocess_launch(geo, out, dout, lse, dlse, delta, lse2, sink=None, parts=None, dq_accum=None, fold=None,
                      dq_tile=None):
    """The backward's preprocess: delta = rowsum(dO * O) - dlse and lse2 = lse * log2(e), both of shape
    geo.row_buffer_shape; dlse (lse's shape) or None; with sink (Hq,) fp32, the sink gradient's pieces into
    parts (sink_parts); with dq_accum (fp32, (B, Sq_pad, Hq, D), or (total_q + pad, Hq, D) for varlen), its rows
    of real queries zeroed. Shared by the portable and the Gluon backward. fold (dense only): (rows_pad, scale)
    for kernels/bwd.py's ROWS_IN_ACC (-lse2 / (scale * log2 e) and -delta on rows_pad rows: delta and lse2 are
    (B, Hq, rows_pad)). dq_tile (dense only): (rows, columns) of dq_accum's tiles in the tiled order
    (dq_tiled_offsets), or None for the row-major one."""
    rows_pad, fold_scale = (fold[0], -1.0 / (fold[1] * LOG2E)) if fold is not None else (geo.seqlen_q, 0.0)
    assert dq_tile is None or PRE_BLOCK == 64, "the tiled dQ buffer is zeroed 64 rows at a time (bwd._dq_tiled_rows)"
    return KernelLaunch(
        _attn_bwd_preprocess, (_cdiv(rows_pad, PRE_BLOCK), geo.batch * geo.heads_q),
        (out, dout, lse, dlse if dlse is not None else lse, delta, lse2, geo.cu_args(lse)[0],
         sink if sink is not None else lse, parts if parts is not None else lse,
         dq_accum if dq_accum is not None else lse, *_strides3(out), *_strides3(dout), *geo.lse_strides(lse),
         *geo.lse_strides(lse2), *(_strides3(dq_accum) if dq_accum is not None else (0, 0, 0)), geo.seqlen_q,
         geo.heads_q, rows_pad, fold_scale),
        dict(HEAD_DIM=geo.head_dim, HEAD_DIM_PAD=_head_dim_padded(geo.head_dim), BLOCK_M=PRE_BLOCK,
             IS_VARLEN=geo.is_varlen, HAS_DLSE=dlse is not None, HAS_SINK=sink is not None,
             ZERO_DQ=dq_accum is not None, **({"ROWS_IN_ACC": True} if fold is not None else {}),
             **(dict(DQ_TILE_M=dq_tile[0], DQ_TILE_N=dq_tile[1]) if dq_tile else {})),
    )


def dq_convert_launch(dq_accum, dq, scale, block_m=64, tile=None):
    """dq (B, Sq, Hq, D) = dq_accum[:, :Sq] * scale: the Gluon backward's fp32 (B, Sq_pad, Hq, D) dQ buffer, block_m
    rows per program; tile: (rows, columns) of its tiles in the tiled order (dq_tiled_offsets), or None."""
    batch, seqlen_q, heads_q, head_dim = dq.shape
    assert tile is None or block_m == 64, "the tiled order is read 64 rows at a time (kernels/bwd._dq_tiled_rows)"
    return KernelLaunch(
        _attn_bwd_dq_convert, (_cdiv(seqlen_q, block_m), batch * heads_q),
        (dq_accum, dq, dq_accum.stride(0), dq_accum.stride(1), *_strides3(dq), seqlen_q, heads_q, scale),
        dict(HEAD_DIM=head_dim, BLOCK_M=block_m, **(dict(TILE_M=tile[0], TILE_N=tile[1]) if tile else {})),
    )


def dq_tiled_offsets(batch, seqlen_q_pad, heads_q, head_dim, tile_m, tile_n):
    """Where each element of a (B, Sq_pad, Hq, D) dQ sits in the tiled fp32 buffer of the same size: a (B, Sq_pad,
    Hq, D) int64 tensor of flat offsets (kernels/bwd._dq_tiled_rows' map, which the preprocess and the dQ
    conversion use, and the Gluon dK/dV kernel's stores). For tests."""
    rows = torch.arange(seqlen_q_pad)[:, None, None]
    cols = torch.arange(heads_q * head_dim).view(1, heads_q, head_dim)
    r, c = rows % tile_m, cols % tile_n
    inner = (((((r // 64) * (tile_n // 8) + c // 8) * 4 + (r % 64) // 16) * 8 + r % 8) * 4 + (c % 8) // 2) * 4
    inner = inner + ((r % 16) // 8) * 2 + c % 2
    per_batch = (rows - r) * heads_q * head_dim + tile_m * (cols - c) + inner
    return torch.arange(batch).view(-1, 1, 1, 1) * seqlen_q_pad * heads_q * head_dim + per_batch


def backward_launches(geo, dout, q, k, v, out, lse, lse2, delta, dq, dk, dv, dbias, softmax_scale, sa, arch,
                      interpreter, mods=None, dlse=None, sink=None, sink_parts=None):
    """The backward's launches: preprocess (delta, lse2, of shape geo.row_buffer_shape), dK/dV (one launch, or
    dV then dK where cfg.dkdv_split == "dv-dk"), dQ (always the last); sa: ScoreArgs.

    dbias: a zero-filled fp32 (B, Hq, max_q, max_k) buffer that the dQ kernel fills with dS, or None.
    mods: ModArgs or None. dlse: the gradient flowing into lse (lse's shape), or None. sink, sink_parts: as
    preprocess_launch's.
    """
    group_size = geo.heads_q // geo.heads_kv
    head_dim_pad = _head_dim_padded(geo.head_dim)
    mods = mods or _NO_MODS
    precision = _dot_precision(q.dtype, arch)
    cfg = configs.bwd_config(arch, head_dim_pad, sa.constexprs["IS_LOCAL"], q.dtype, interpreter, precision)
    # (tiles, PART) of each dK/dV launch: one kernel for both, or dV then dK ("dv-dk": one accumulator each).
    parts = ([(cfg.dkdv, 1), (cfg.dk or cfg.dkdv, 2)] if cfg.dkdv_split == "dv-dk" else [(cfg.dkdv, 0)])
    cfg = replace(cfg, dkdv=mods.tiles(cfg.dkdv), dq=mods.tiles(cfg.dq))
    row_strides = geo.lse_strides(lse2)
    cu_q, cu_k = geo.cu_args(lse)
    common = dict(HEAD_DIM=geo.head_dim, HEAD_DIM_PAD=head_dim_pad, DOT_PRECISION=precision,
                  IS_VARLEN=geo.is_varlen, **sa.constexprs, **mods.constexprs(grad=True))
    preprocess = preprocess_launch(geo, out, dout, lse, dlse, delta, lse2, sink, sink_parts)
    dkdv_launches = []
    for tiles, part in parts:
        tiles = mods.tiles(tiles)
        assert tiles.BLOCK_M <= ROW_PAD, "the dK/dV kernel's query tiles may read ROW_PAD rows past the last sequence"
        descs = None
        if cfg.dkdv_variant == "desc":
            descs = _dkdv_descriptors(geo, q, dout, tiles.BLOCK_M, head_dim_pad)
        dkdv_launches.append(KernelLaunch(
            _attn_bwd_dkdv, (_cdiv(geo.seqlen_k, tiles.BLOCK_N), geo.batch * geo.heads_kv),
            (q, k, v, dout, lse2, delta, dk, dv, sa.alibi, cu_q, cu_k, sa.bias, sa.rng, *(descs or (q, dout)),
             *_strides3(q), *_strides3(k), *_strides3(v), *_strides3(dout), *_strides3(dk), *_strides3(dv),
             *row_strides, sa.stride_alibi_b, *sa.bias_strides,
             geo.seqlen_q, geo.seqlen_k, geo.heads_kv, group_size, softmax_scale, *sa.scalars(),
             *mods.args(lse, transposed=True)),
            dict(BLOCK_M=tiles.BLOCK_M, BLOCK_N=tiles.BLOCK_N, Q_DESC=descs is not None,
                 SPLIT_GROUP_SUM=precision != "tf32" and group_size > 1, PART=part, **common),
            tiles.num_warps, tiles.num_stages, shrink=() if descs else ("BLOCK_M",),
            grid_tile=("BLOCK_N", 0, geo.seqlen_k),
        ))
    dq_launch = KernelLaunch(
        _attn_bwd_dq, (_cdiv(geo.seqlen_q, cfg.dq.BLOCK_M), geo.batch * geo.heads_q),
        (q, k, v, dout, lse2, delta, dq, sa.alibi, cu_q, cu_k, sa.bias, dbias if dbias is not None else lse, sa.rng,
         *_strides3(q), *_strides3(k), *_strides3(v), *_strides3(dout), *_strides3(dq),
         *row_strides, sa.stride_alibi_b, *sa.bias_strides,
         geo.seqlen_q, geo.seqlen_k, geo.heads_q, group_size, softmax_scale, *sa.scalars(), *mods.args(lse)),
        dict(BLOCK_M=cfg.dq.BLOCK_M, BLOCK_N=cfg.dq.BLOCK_N, STORE_DBIAS=dbias is not None,
             LEFT_BOUNDED=sa.left_bounded, **common),
        cfg.dq.num_warps, cfg.dq.num_stages, shrink=("BLOCK_N",), grid_tile=("BLOCK_M", 0, geo.seqlen_q),
    )
    return [preprocess, *dkdv_launches, dq_launch]


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
    caller takes the portable path), in a plan of the portable kernels alone it raises (the normal path would launch
    the same kernels)."""
    poison = poison_outputs()
    try:
        return plans.replay(plan, inputs, lambda shape, dtype: _empty(shape, inputs[0], dtype, poison),
                            _gluon_modules()[0].tma_descriptor, scalars)
    except torch.OutOfMemoryError:
        raise
    except Exception as exc:  # noqa: BLE001  (as _try_gluon: the portable kernels still serve)
        plans.clear()
        portable = (_attn_fwd, _attn_bwd_preprocess, _attn_bwd_dkdv, _attn_bwd_dq, _attn_bwd_dq_convert,
                    _attn_fwd_splitkv, _attn_combine, _rotary_append)
        if all(launch.kernel in portable for launch in plan.launches):
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


def _flash_attn_forward_kvcache(q, k_cache, v_cache, seqused_k, block_table, softmax_scale, window_left, window_right,
                                softcap, alibi_slopes, max_seqlen_k, num_splits, key_start=None, seqused_add=0):
    """Forward over a KV cache: batch b attends to its first seqused_add + seqused_k[b] cached keys (seqused_k
    int32 (B,), or None for 0: an int cache length needs no tensor); out like q, lse (B, Hq, Sq).

    block_table: None (cache (B, capacity, Hk, D)) or int32 (B, max_pages) into a paged cache
    (num_pages, page_size, Hk, D), whose capacity per row is max_pages * page_size.
    max_seqlen_k: the largest key count (sizes the split heuristic); num_splits: 0 = heuristic, else
    the number of key-range splits (see uses_splitkv for when the split-KV kernel runs).
    key_start: None or int32 (B,): row b's keys are the cache tokens key_start[b] <= t < its key count.
    A decode step (fp16 / bf16, the Gluon head dims) on CUDA replays its launch plan (_planned_kvcache) after the
    first step of its signature.
    """
    if q.is_cuda and _plannable(q):
        result = _planned_kvcache(q, k_cache, v_cache, seqused_k, block_table, softmax_scale, window_left,
                                  window_right, softcap, alibi_slopes, max_seqlen_k, num_splits, key_start,
                                  seqused_add)
        if result is not None:
            return result
    return _kvcache_launches(q, k_cache, v_cache, seqused_k, block_table, softmax_scale, window_left, window_right,
                             softcap, alibi_slopes, max_seqlen_k, num_splits, key_start, seqused_add)


def _kvcache_launches(q, k_cache, v_cache, seqused_k, block_table, softmax_scale, window_left, window_right, softcap,
                      alibi_slopes, max_seqlen_k, num_splits, key_start, seqused_add):
    """_flash_attn_forward_kvcache's launchers, as they run without a plan."""
    geo = _kvcache_geometry(q, k_cache, seqused_k, block_table, key_start, seqused_add)
    out = _empty(q.shape, q)
    lse = _empty(geo.lse_shape(q), q, torch.float32)
    sa = ScoreArgs.make(geo, softmax_scale, window_left, window_right, softcap, alibi_slopes, lse,
                        approx_tanh=_approx_tanh(q))
    arch, interpreter = _arch(q.device), interpreter_active()
    if uses_splitkv(geo, num_splits):
        cfg, splits, precision = splitkv_plan(geo, max_seqlen_k, num_splits, arch, q.dtype, q.device, interpreter)
        launches = splitkv_launches(geo, q, k_cache, v_cache, out, lse, sa, cfg, splits, precision)
    else:
        launches = forward_launches(geo, q, k_cache, v_cache, out, lse, None, sa, arch, interpreter)
    for launch in launches:
        launch.run()
    return out, lse


def _kvcache_geometry(q, k_cache, seqused_k, block_table, key_start, seqused_add):
    geo = Geometry.of(q, k_cache)
    capacity = k_cache.shape[1] * (block_table.shape[1] if block_table is not None else 1)
    return replace(geo, batch=q.shape[0], seqlen_k=capacity, seqused_k=seqused_k, seqused_add=seqused_add,
                   block_table=block_table, key_start=key_start)


# Signatures of KV-cache calls (_planned_kvcache's key without the split count) -> (programs, BLOCK_N) of their
# split-KV plan, or False where the split-KV kernel does not serve them (longer query chunks: not planned).
_kvcache_tiles = {}
# The split-KV kernel's cache-length argument: a plan's per-call scalar (unspecialized: one compiled kernel for all).
_SEQUSED_ADD_ARG = _attn_fwd_splitkv.arg_names.index("seqused_add")


def _planned_kvcache(q, k_cache, v_cache, seqused_k, block_table, softmax_scale, window_left, window_right, softcap,
                     alibi_slopes, max_seqlen_k, num_splits, key_start, seqused_add):
    """(out, lse) of a decode step from its plan (plans.py), or None (the caller runs the launchers). The key: the
    tensors' shapes, strides, dtypes and devices (the optional ones too: length tensor, block table, ALiBi slopes,
    key_start), which of them alias, the scale, window and softcap, num_splits and the split count it comes to for
    max_seqlen_k; not the cache length seqused_add, which each replay passes to the split-KV kernel (plans' scalar
    slot). Only the split-KV kernel's calls (and its combine) are planned."""
    if not 0 <= seqused_add < 2**31:  # an i32 argument, as recorded
        return None
    optional = (seqused_k, block_table, alibi_slopes, key_start)
    inputs = (q, k_cache, v_cache) + tuple(t for t in optional if t is not None)
    signature = ("kvcache", q.shape, q.stride(), q.dtype, q.get_device(), k_cache.shape, k_cache.stride(),
                 k_cache.dtype, k_cache.get_device(), v_cache.shape, v_cache.stride(), v_cache.dtype,
                 *(None if t is None else _signature(t) for t in optional), plans.aliasing(inputs),
                 softmax_scale, window_left, window_right, softcap, num_splits)
    tiles = _kvcache_tiles.get(signature)
    if tiles is None:
        geo = _kvcache_geometry(q, k_cache, seqused_k, block_table, key_start, seqused_add)
        tiles = False
        if uses_splitkv(geo, num_splits):
            cfg = splitkv_plan(geo, max_seqlen_k, num_splits, _arch(q.device), q.dtype, q.device, False)[0]
            tiles = (splitkv_programs(geo, cfg), cfg.BLOCK_N)
        if len(_kvcache_tiles) >= plans.MAX_PLANS:  # bounded as the plans are
            _kvcache_tiles.clear()
        _kvcache_tiles[signature] = tiles
    if tiles is False:
        return None
    key = (*signature, split_count(num_splits, tiles[0], max_seqlen_k, tiles[1], q.device))
    return _planned(key, inputs, None,
                    lambda: _kvcache_launches(q, k_cache, v_cache, seqused_k, block_table, softmax_scale, window_left,
                                              window_right, softcap, alibi_slopes, max_seqlen_k, num_splits,
                                              key_start, seqused_add),
                    slots=((_attn_fwd_splitkv, _SEQUSED_ADD_ARG),), scalars=(seqused_add, ))


def _flash_attn_forward_varlen_paged(q, k_pages, v_pages, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                     block_table, softmax_scale, window_left, window_right, softcap, alibi_slopes,
                                     sink):
    """Varlen forward whose keys live in a paged cache (num_pages, page_size, Hk, D): sequence b's keys are
    in the pages block_table[b] lists, cu_seqlens_k gives their counts. out like q, lse (Hq, total_q)."""
    geo = Geometry(cu_seqlens_q.numel() - 1, max_seqlen_q, max_seqlen_k, q.shape[1], k_pages.shape[2], q.shape[2],
                   cu_seqlens_q, cu_seqlens_k, block_table=block_table)
    out = _empty(q.shape, q)
    lse = _empty(geo.lse_shape(q), q, torch.float32)
    sa = ScoreArgs.make(geo, softmax_scale, window_left, window_right, softcap, alibi_slopes, lse,
                        approx_tanh=_approx_tanh(q))
    for launch in forward_launches(geo, q, k_pages, v_pages, out, lse, sink, sa, _arch(q.device),
                                   interpreter_active()):
        launch.run()
    return out, lse


def _gluon_backward(dout, q, k, v, out, lse, dlse, softmax_scale, causal, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, sink=None, sink_parts=None, cu_seqlens_q=None, cu_seqlens_k=None,
                    max_seqlen_q=0, max_seqlen_k=0, attn_bias=None, dropout_p=0.0, rng=None):
    """(dq, dk, dv) from the Hopper Gluon backward (gluon_bwd_launch.py; plain, causal, sliding window, softcap,
    ALiBi, a bias without gradient (dense), dropout (D64 / D128: the forward's mask from rng); dense or varlen) where
    configs.py says it is faster on a tested triton, else None. causal / window_size as flash_attn_func's (a causal
    call with a left window is the window (left, 0)); features follow the plain / causal key thresholds (causal: any
    window whose right side is 0), windows narrower than configs.GLUON_BWD_MIN_WINDOW keys keep the portable
    kernels, and varlen is keyed by max_seqlen_k. FLASHTILE_GLUON_BWD=1 takes it wherever it is supported, =0
    never. A launch that fails to build disables it for the process (one warning), returns None."""
    gluon_launch, gluon_bwd_launch = _gluon_modules()
    left, right = window_size
    span = _window_span(left, right)
    varlen = cu_seqlens_q is not None
    keys = max_seqlen_k if varlen else k.shape[1]
    features = dict(window_size=tuple(window_size), softcap=softcap, alibi_slopes=alibi_slopes)
    if varlen:
        features.update(cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                        max_seqlen_k=max_seqlen_k)
    if attn_bias is not None:
        features["attn_bias"] = attn_bias
    if dropout_p:
        features.update(dropout_p=dropout_p, rng=rng)
    plain = not gluon_bwd_launch.refused_features(causal, window_size, softcap, alibi_slopes, attn_bias, cu_seqlens_q,
                                                  dropout_p=dropout_p)
    variant = configs.gluon_bwd_variant(q.shape[-1], gluon_launch.mask_mode(causal, window_size)[0], plain)
    return _try_gluon(
        "FLASHTILE_GLUON_BWD",
        lambda: gluon_launch.tested_triton() and configs.gluon_bwd_wanted(q.shape[-1], causal, keys, span),
        lambda: gluon_bwd_launch.gluon_bwd_supported(q, k, v, out, dout, causal=causal, **features),
        lambda: gluon_bwd_launch.gluon_backward(dout, q, k, v, out, lse, softmax_scale, causal, dlse, variant,
                                                **features, sink=sink, sink_parts=sink_parts),
        gluon_bwd_launch.disable)


def _planned_backward(dout, q, k, v, out, lse, softmax_scale, window_left, window_right):
    """(dq, dk, dv) of a CUDA call without optional features (no dlse, softcap, ALiBi, sink, bias, varlen, dropout,
    mods; not deterministic): the Gluon backward where _gluon_backward takes it, else the portable kernels, replayed
    from its plan after the first call of its signature (as _planned_forward; FLASHTILE_GLUON_BWD)."""
    gluon_bwd_launch = _gluon_modules()[1]
    inputs = (dout, q, k, v, out, lse)
    key = ("bwd", _gluon_bwd_env(), gluon_bwd_launch._disabled is None, _signature(dout),
           _signature(q), _signature(k), _signature(v), _signature(out), _signature(lse), plans.aliasing(inputs),
           softmax_scale, window_left, window_right)
    return _planned(key, inputs, gluon_bwd_launch,
                    lambda: (_gluon_backward(dout, q, k, v, out, lse, None, softmax_scale, window_right == 0,
                                             window_size=(window_left, window_right))
                             or _portable_backward(dout, q, k, v, out, lse, None, softmax_scale, window_left,
                                                   window_right, 0.0, None)[:3]))


def _gluon_sparse_backward(dout, q, k, v, out, lse, dlse, softmax_scale, window_left, window_right, mods):
    """(dq, dk, dv) of flashtile.attention's block-sparse call from the Hopper Gluon backward
    (gluon_bwd_launch.sparse_ok: a block mask with a mask_mod or none, no score_mod, query blocks a multiple of its
    64-row tile and key blocks of its key program: 128 keys, 64 at D256) on a tested triton, else None. The forward's
    switch: FLASHTILE_GLUON_SPARSE, read per call, "0" never (the portable backward, as the sparse bench's
    flashtile-sparse-portable provider times it), "1" wherever supported; unset: as FLASHTILE_GLUON_BWD. A launch
    that fails to build sends that mask_mod to the portable kernels (gluon_bwd_launch.sparse_failed)."""
    gluon_launch, gluon_bwd_launch = _gluon_modules()
    return _try_gluon(
        "FLASHTILE_GLUON_SPARSE" if "FLASHTILE_GLUON_SPARSE" in os.environ else "FLASHTILE_GLUON_BWD",
        gluon_launch.tested_triton,
        lambda: gluon_bwd_launch.sparse_ok(q, k, v, out, dout, (window_left, window_right), mods),
        lambda: gluon_bwd_launch.gluon_backward(dout, q, k, v, out, lse, softmax_scale, False, dlse, mods=mods),
        lambda exc: gluon_bwd_launch.sparse_failed(mods, exc))


def _gluon_bwd_candidate(bias_grad, dropout_p, mods, deterministic):
    """Whether _flash_attn_backward asks the Gluon backward at all: no bias gradient (the Gluon kernel reads a bias,
    it writes no dS), no mods, not deterministic (its dQ reductions run in no fixed order). Windows, softcap, ALiBi,
    varlen, dropout (D64 / D128) and a bias's layout (gluon_bwd_launch.bias_tma_ok, bias_shared_ok; dense only) are
    its own to refuse or take."""
    return not deterministic and not bias_grad and mods is None


def _flash_attn_backward(dout, q, k, v, out, lse, dlse, softmax_scale, window_left, window_right, softcap,
                         alibi_slopes, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0,
                         attn_bias=None, bias_grad=False, dropout_p=0.0, rng=None, mods=None, deterministic=False,
                         sink=None):
    """dq, dk, dv with the shapes and dtypes of q, k, v, recomputing P from q, k and lse (and the dropout
    mask from rng), dbias: the full (B, Hq, max_q, max_k) fp32 gradient of the scores when bias_grad, else an
    empty tensor, and dsink: the (Hq,) fp32 gradient of the sink logits when sink is given (the forward's), else
    an empty tensor. The sink joins no score, so dq, dk, dv do not depend on it (lse already holds it); its
    gradient comes from the preprocess's delta at no extra pass over dO and O.

    dlse (lse's shape) or None is the gradient flowing into lse: since d lse_i / d s_ij = P_ij it
    folds into delta (dS = P * (dP - (delta - dlse))), in the preprocess kernel. mods: as in the forward.
    deterministic: only the portable kernels (no atomics), never the Gluon backward.
    """
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    geo = None
    parts = None
    if sink is not None:
        geo = Geometry.of(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
        parts = sink_parts(geo, q)
    if (mods is not None and q.is_cuda and not deterministic and not bias_grad and not dropout_p and sink is None
            and attn_bias is None and alibi_slopes is None and not softcap and cu_seqlens_q is None):
        grads = _gluon_sparse_backward(dout, q, k, v, out, lse, dlse, softmax_scale, window_left, window_right, mods)
        if grads is not None:
            return (*grads, q.new_empty(0, dtype=torch.float32), q.new_empty(0, dtype=torch.float32))
    if q.is_cuda and _gluon_bwd_candidate(bias_grad, dropout_p, mods, deterministic):
        grads = None
        if (dlse is None and sink is None and alibi_slopes is None and not softcap and attn_bias is None
                and cu_seqlens_q is None and not dropout_p and _plannable(q)):
            grads = _planned_backward(dout, q, k, v, out, lse, softmax_scale, window_left, window_right)
        if grads is None:
            grads = _gluon_backward(dout, q, k, v, out, lse, dlse, softmax_scale, window_right == 0,
                                    window_size=(window_left, window_right), softcap=softcap,
                                    alibi_slopes=alibi_slopes, sink=sink, sink_parts=parts, cu_seqlens_q=cu_seqlens_q,
                                    cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                                    attn_bias=attn_bias, dropout_p=dropout_p, rng=rng)
        if grads is not None:
            return (*grads, q.new_empty(0, dtype=torch.float32), _dsink(parts, q))
    return _portable_backward(dout, q, k, v, out, lse, dlse, softmax_scale, window_left, window_right, softcap,
                              alibi_slopes, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, attn_bias,
                              bias_grad, dropout_p, rng, mods, sink, geo, parts)


def _portable_backward(dout, q, k, v, out, lse, dlse, softmax_scale, window_left, window_right, softcap,
                       alibi_slopes, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0,
                       attn_bias=None, bias_grad=False, dropout_p=0.0, rng=None, mods=None, sink=None, geo=None,
                       parts=None):
    """_flash_attn_backward on the portable Triton kernels (kernels/bwd.py), with dout of unit last stride; geo and
    the sink's parts where the caller has them."""
    if geo is None:
        geo = Geometry.of(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    poison = poison_outputs()
    delta = _empty(geo.row_buffer_shape(q), q, torch.float32, poison)
    lse2 = _empty(geo.row_buffer_shape(q), q, torch.float32, poison)
    dq, dk, dv = (_empty(t.shape, t, poison=poison) for t in (q, k, v))
    # Zeros, not poison: blocks the kernels skip (outside a window or causal mask) have dS = 0.
    dbias = (torch.zeros((geo.batch, geo.heads_q, geo.seqlen_q, geo.seqlen_k), dtype=torch.float32, device=q.device)
             if bias_grad else None)
    sa = ScoreArgs.make(geo, softmax_scale, window_left, window_right, softcap, alibi_slopes, lse, attn_bias,
                        dropout_p, rng, approx_tanh=_approx_tanh(q))
    if dlse is not None:  # read with lse's strides
        dlse = dlse.to(torch.float32).contiguous()
    for launch in backward_launches(geo, dout, q, k, v, out, lse, lse2, delta, dq, dk, dv, dbias, softmax_scale,
                                    sa, _arch(q.device), interpreter_active(), mods, dlse, sink, parts):
        launch.run()
    return dq, dk, dv, dbias if dbias is not None else q.new_empty(0, dtype=torch.float32), _dsink(parts, q)


def _dsink(parts, q):
    """The sink gradient from the preprocess's pieces, or an empty tensor without a sink."""
    return sink_grad(parts, q.shape[-2]) if parts is not None else q.new_empty(0, dtype=torch.float32)
