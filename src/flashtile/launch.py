"""Host launchers for the Triton kernels: shapes, strides, grids, configurations, output allocation.

Inputs arrive validated and normalized by the API (interface.py, kvcache.py): dense (B, S, H, D) or packed
varlen (total, H, D) tensors with a unit last stride. Each kernel launch is data (KernelLaunch) so tests
can compile it ahead of time for GPUs that are not present.
"""
import os
from dataclasses import dataclass, replace

import torch
import triton

from . import configs
from .kernels.bwd import _attn_bwd_dkdv, _attn_bwd_dq, _attn_bwd_preprocess
from .kernels.fwd import _attn_fwd, _attn_probs

LOG2E = 1.4426950408889634


def interpreter_active():
    """True when Triton kernels run through the interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _empty(shape, like, dtype=None):
    # FLASHTILE_POISON_OUTPUTS=1 fills outputs with NaN before the kernels run, so tests catch
    # any element a kernel fails to write.
    dtype = dtype or like.dtype
    if os.environ.get("FLASHTILE_POISON_OUTPUTS", "0") not in ("", "0"):
        return torch.full(shape, float("nan"), dtype=dtype, device=like.device)
    return torch.empty(shape, dtype=dtype, device=like.device)


def _arch(device):
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_capability(device)


def _head_dim_padded(head_dim):
    # tl.dot needs at least 16 along the reduction; tiles need a power of two.
    return max(16, triton.next_power_of_2(head_dim))


def _dot_precision(dtype):
    # fp32 inputs follow PyTorch's TF32 switch, so flashtile is as exact as torch.matmul by default.
    if dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        return "ieee"
    return "tf32"


def _strides3(t):
    """(batch, sequence, head) strides of a (B, S, H, D) tensor, or of a packed varlen (total, H, D) one."""
    if t.dim() == 3:
        return 0, t.stride(0), t.stride(1)
    return t.stride(0), t.stride(1), t.stride(2)


@dataclass(frozen=True)
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
    seqused_k: object = None  # int32 (B,): keys each batch row uses (KV cache); seqlen_k is the capacity
    block_table: object = None  # int32 (B, max_pages) for a paged cache (num_pages, page_size, Hk, D)

    @staticmethod
    def of(q, k, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0):
        if cu_seqlens_q is None:
            return Geometry(q.shape[0], q.shape[1], k.shape[1], q.shape[2], k.shape[2], q.shape[3])
        return Geometry(cu_seqlens_q.numel() - 1, max_seqlen_q, max_seqlen_k, q.shape[1], k.shape[1], q.shape[2],
                        cu_seqlens_q, cu_seqlens_k)

    @property
    def is_varlen(self):
        return self.cu_seqlens_q is not None

    def lse_shape(self, q):
        return (self.heads_q, q.shape[0]) if self.is_varlen else (self.batch, self.heads_q, self.seqlen_q)

    def lse_strides(self, lse):
        return (0, lse.stride(0)) if self.is_varlen else (lse.stride(0), lse.stride(1))

    def page_args(self, k):
        """(block table batch stride, page size) for a paged cache; zeros otherwise (never read)."""
        if self.block_table is None:
            return 0, 0
        return self.block_table.stride(0), k.shape[1]

    def cu_args(self, placeholder):
        """The two cu_seqlens pointers (the second carries seqused_k for a KV cache); any tensor stands in
        for an absent one (never read)."""
        if self.is_varlen:
            return self.cu_seqlens_q, self.cu_seqlens_k
        return placeholder, self.seqused_k if self.seqused_k is not None else placeholder


@dataclass
class KernelLaunch:
    """One kernel launch as data: run it here, or compile it ahead of time for another GPU
    (tests/compile_check.py compiles every launch for sm90 and sm80 on a machine without a GPU)."""
    kernel: object
    grid: tuple
    args: tuple
    constexprs: dict
    num_warps: int = 4
    num_stages: int = 1

    def run(self):
        self.kernel[self.grid](*self.args, **self.constexprs, num_warps=self.num_warps, num_stages=self.num_stages)


@dataclass(frozen=True)
class ScoreArgs:
    """What turns q.k products into probabilities: kernels/common._scores's runtime arguments, dropout's
    (common._dropout_keep) and the constexpr switches.

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
    constexprs: dict

    @staticmethod
    def make(geo, softmax_scale, window_left, window_right, softcap, alibi_slopes, placeholder, attn_bias=None,
             dropout_p=0.0, rng=None):
        """placeholder: any fp32 tensor, passed where an optional tensor argument is absent.
        attn_bias: 4-D, broadcastable to (B, Hq, max_q, max_k) (size-1 dims are read with stride 0), or None;
        in varlen mode indexed by positions within each sequence. rng: int64 (1,) Philox seed when
        dropout_p > 0."""
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
            constexprs=dict(IS_LOCAL=window_left >= 0 or window_right >= 0, SOFTCAP=softcap > 0,
                            HAS_ALIBI=has_alibi, HAS_BIAS=has_bias, HAS_DROPOUT=dropout_p > 0),
        )

    def scalars(self):
        return self.qk_scale, self.softcap_log2, self.window_left, self.window_right, self.dropout_p


def forward_launches(geo, q, k, v, out, lse, sink, sa, arch, interpreter):
    """The forward's one launch, writing out (q's shape) and lse (geo.lse_shape).

    sa: ScoreArgs; sink: fp32 (Hq,) attention-sink logits or None.
    """
    head_dim_pad = _head_dim_padded(geo.head_dim)
    cfg = configs.fwd_config(arch, head_dim_pad, sa.constexprs["IS_LOCAL"], q.dtype, interpreter)
    return [KernelLaunch(
        _attn_fwd, (triton.cdiv(geo.seqlen_q, cfg.BLOCK_M), geo.batch * geo.heads_q),
        (q, k, v, out, lse, sa.alibi, sink if sink is not None else lse, *geo.cu_args(lse), sa.bias,
         geo.block_table if geo.block_table is not None else lse, sa.rng,
         *_strides3(q), *_strides3(k), *_strides3(v), *_strides3(out), *geo.lse_strides(lse),
         sa.stride_alibi_b, *sa.bias_strides, *geo.page_args(k),
         geo.seqlen_q, geo.seqlen_k, geo.heads_q, geo.heads_q // geo.heads_kv, *sa.scalars()),
        dict(HEAD_DIM=geo.head_dim, HEAD_DIM_PAD=head_dim_pad, BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N,
             HAS_SINK=sink is not None, IS_VARLEN=geo.is_varlen, SEQUSED_K=geo.seqused_k is not None,
             PAGED=geo.block_table is not None,
             DOT_PRECISION=_dot_precision(q.dtype),
             **sa.constexprs),
        cfg.num_warps, cfg.num_stages,
    )]


def backward_launches(geo, dout, q, k, v, out, lse, lse2, delta, dq, dk, dv, dbias, softmax_scale, sa, arch,
                      interpreter):
    """The backward's three launches: preprocess (delta, lse2, laid out as lse), dK/dV, dQ; sa: ScoreArgs.

    dbias: a zero-filled fp32 (B, Hq, max_q, max_k) buffer that the dQ kernel fills with dS, or None.
    """
    group_size = geo.heads_q // geo.heads_kv
    head_dim_pad = _head_dim_padded(geo.head_dim)
    cfg = configs.bwd_config(arch, head_dim_pad, sa.constexprs["IS_LOCAL"], q.dtype, interpreter)
    precision = _dot_precision(q.dtype)
    pre_block = 64
    cu_q, cu_k = geo.cu_args(lse)
    common = dict(HEAD_DIM=geo.head_dim, HEAD_DIM_PAD=head_dim_pad, DOT_PRECISION=precision,
                  IS_VARLEN=geo.is_varlen, **sa.constexprs)
    preprocess = KernelLaunch(
        _attn_bwd_preprocess, (triton.cdiv(geo.seqlen_q, pre_block), geo.batch * geo.heads_q),
        (out, dout, lse, delta, lse2, cu_q, *_strides3(out), *_strides3(dout), *geo.lse_strides(lse),
         geo.seqlen_q, geo.heads_q),
        dict(HEAD_DIM=geo.head_dim, HEAD_DIM_PAD=head_dim_pad, BLOCK_M=pre_block, IS_VARLEN=geo.is_varlen),
    )
    dkdv = KernelLaunch(
        _attn_bwd_dkdv, (triton.cdiv(geo.seqlen_k, cfg.dkdv.BLOCK_N), geo.batch * geo.heads_kv),
        (q, k, v, dout, lse2, delta, dk, dv, sa.alibi, cu_q, cu_k, sa.bias, sa.rng,
         *_strides3(q), *_strides3(k), *_strides3(v), *_strides3(dout), *_strides3(dk), *_strides3(dv),
         *geo.lse_strides(lse), sa.stride_alibi_b, *sa.bias_strides,
         geo.seqlen_q, geo.seqlen_k, geo.heads_kv, group_size, softmax_scale, *sa.scalars()),
        dict(BLOCK_M=cfg.dkdv.BLOCK_M, BLOCK_N=cfg.dkdv.BLOCK_N,
             SPLIT_GROUP_SUM=precision == "ieee" and group_size > 1, **common),
        cfg.dkdv.num_warps, cfg.dkdv.num_stages,
    )
    dq_launch = KernelLaunch(
        _attn_bwd_dq, (triton.cdiv(geo.seqlen_q, cfg.dq.BLOCK_M), geo.batch * geo.heads_q),
        (q, k, v, dout, lse2, delta, dq, sa.alibi, cu_q, cu_k, sa.bias, dbias if dbias is not None else lse, sa.rng,
         *_strides3(q), *_strides3(k), *_strides3(v), *_strides3(dout), *_strides3(dq),
         *geo.lse_strides(lse), sa.stride_alibi_b, *sa.bias_strides,
         geo.seqlen_q, geo.seqlen_k, geo.heads_q, group_size, softmax_scale, *sa.scalars()),
        dict(BLOCK_M=cfg.dq.BLOCK_M, BLOCK_N=cfg.dq.BLOCK_N, STORE_DBIAS=dbias is not None, **common),
        cfg.dq.num_warps, cfg.dq.num_stages,
    )
    return [preprocess, dkdv, dq_launch]


def probs_launches(geo, q, k, lse, probs, sa, arch, interpreter):
    """The attention-probabilities kernel (return_attn_probs): writes probs (B, Hq, max_q, max_k) from q, k, lse."""
    head_dim_pad = _head_dim_padded(geo.head_dim)
    cfg = configs.fwd_config(arch, head_dim_pad, sa.constexprs["IS_LOCAL"], q.dtype, interpreter)
    return [KernelLaunch(
        _attn_probs, (triton.cdiv(geo.seqlen_q, cfg.BLOCK_M), geo.batch * geo.heads_q),
        (q, k, lse, probs, sa.alibi, *geo.cu_args(lse), sa.bias, sa.rng,
         *_strides3(q), *_strides3(k), *geo.lse_strides(lse), sa.stride_alibi_b, *sa.bias_strides,
         geo.seqlen_q, geo.seqlen_k, geo.heads_q, geo.heads_q // geo.heads_kv, *sa.scalars()),
        dict(HEAD_DIM=geo.head_dim, HEAD_DIM_PAD=head_dim_pad, BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N,
             IS_VARLEN=geo.is_varlen, DOT_PRECISION=_dot_precision(q.dtype), **sa.constexprs),
        cfg.num_warps, 1,
    )]


def _flash_attn_forward(q, k, v, softmax_scale, window_left, window_right, softcap, alibi_slopes, sink,
                        cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0, attn_bias=None,
                        dropout_p=0.0, rng=None):
    """out (q's shape and dtype) and lse fp32 (B, Hq, Sq), or (Hq, total_q) when cu_seqlens are given.

    dropout_p > 0: rng is the int64 (1,) Philox seed on q's device; the backward gets the same one.
    """
    geo = Geometry.of(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    out = _empty(q.shape, q)
    lse = _empty(geo.lse_shape(q), q, torch.float32)
    sa = ScoreArgs.make(geo, softmax_scale, window_left, window_right, softcap, alibi_slopes, lse, attn_bias,
                        dropout_p, rng)
    for launch in forward_launches(geo, q, k, v, out, lse, sink, sa, _arch(q.device), interpreter_active()):
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
                        dropout_p, rng)
    for launch in probs_launches(geo, q, k, lse, probs, sa, _arch(q.device), interpreter_active()):
        launch.run()
    return probs


def _flash_attn_forward_kvcache(q, k_cache, v_cache, seqused_k, block_table, softmax_scale, window_left, window_right,
                                softcap, alibi_slopes):
    """Forward over a KV cache: batch b attends to its first seqused_k[b] cached keys; out like q, lse (B, Hq, Sq).

    block_table: None (cache (B, capacity, Hk, D)) or int32 (B, max_pages) into a paged cache
    (num_pages, page_size, Hk, D), whose capacity per row is max_pages * page_size.
    """
    geo = Geometry.of(q, k_cache)
    capacity = k_cache.shape[1] * (block_table.shape[1] if block_table is not None else 1)
    geo = replace(geo, batch=q.shape[0], seqlen_k=capacity, seqused_k=seqused_k, block_table=block_table)
    out = _empty(q.shape, q)
    lse = _empty(geo.lse_shape(q), q, torch.float32)
    sa = ScoreArgs.make(geo, softmax_scale, window_left, window_right, softcap, alibi_slopes, lse)
    for launch in forward_launches(geo, q, k_cache, v_cache, out, lse, None, sa, _arch(q.device),
                                   interpreter_active()):
        launch.run()
    return out, lse


def _flash_attn_backward(dout, q, k, v, out, lse, dlse, softmax_scale, window_left, window_right, softcap,
                         alibi_slopes, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0,
                         attn_bias=None, bias_grad=False, dropout_p=0.0, rng=None):
    """dq, dk, dv with the shapes and dtypes of q, k, v, recomputing P from q, k and lse (and the dropout
    mask from rng), and dbias: the full (B, Hq, max_q, max_k) fp32 gradient of the scores when bias_grad,
    else an empty tensor.

    dlse (lse's shape) or None is the gradient flowing into lse: since d lse_i / d s_ij = P_ij it
    folds into delta (dS = P * (dP - (delta - dlse))), so the kernels do not change.
    """
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    geo = Geometry.of(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    delta = _empty(lse.shape, q, torch.float32)
    lse2 = _empty(lse.shape, q, torch.float32)
    dq, dk, dv = _empty(q.shape, q), _empty(k.shape, k), _empty(v.shape, v)
    # Zeros, not poison: blocks the kernels skip (outside a window or causal mask) have dS = 0.
    dbias = (torch.zeros((geo.batch, geo.heads_q, geo.seqlen_q, geo.seqlen_k), dtype=torch.float32, device=q.device)
             if bias_grad else None)
    sa = ScoreArgs.make(geo, softmax_scale, window_left, window_right, softcap, alibi_slopes, lse, attn_bias,
                        dropout_p, rng)
    preprocess, *grads = backward_launches(geo, dout, q, k, v, out, lse, lse2, delta, dq, dk, dv, dbias, softmax_scale,
                                           sa, _arch(q.device), interpreter_active())
    preprocess.run()
    if dlse is not None:
        delta -= dlse
    for launch in grads:
        launch.run()
    return dq, dk, dv, dbias if dbias is not None else q.new_empty(0, dtype=torch.float32)
