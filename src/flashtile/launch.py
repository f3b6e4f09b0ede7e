"""Host launchers for the Triton kernels: shapes, strides, grids, configurations, output allocation.

Inputs arrive validated and normalized by interface.py: (B, S, H, D) tensors with a unit last stride.
"""
import os
from dataclasses import dataclass

import torch
import triton

from . import configs
from .kernels.bwd import _attn_bwd_dkdv, _attn_bwd_dq, _attn_bwd_preprocess
from .kernels.fwd import _attn_fwd

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
    """(batch, sequence, head) strides of a (B, S, H, D) tensor."""
    return t.stride(0), t.stride(1), t.stride(2)


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
    """What kernels/common._scores needs: runtime arguments and the constexpr switches.

    window_left / window_right are -1 for unbounded at the API (causal is right = 0); the kernels get
    Sq + Sk instead, which no position difference reaches, so the loop bounds need no special case.
    """
    alibi: torch.Tensor
    stride_alibi_b: int
    qk_scale: float
    softcap_log2: float
    window_left: int
    window_right: int
    constexprs: dict

    @staticmethod
    def make(q, k, softmax_scale, window_left, window_right, softcap, alibi_slopes, placeholder):
        """placeholder: any fp32 tensor, passed where an optional tensor argument is absent."""
        unbounded = q.shape[1] + k.shape[1]
        has_alibi = alibi_slopes is not None
        return ScoreArgs(
            alibi=alibi_slopes if has_alibi else placeholder,
            stride_alibi_b=alibi_slopes.stride(0) if has_alibi and alibi_slopes.dim() == 2 else 0,
            qk_scale=softmax_scale / softcap if softcap > 0 else softmax_scale * LOG2E,
            softcap_log2=softcap * LOG2E,
            window_left=window_left if window_left >= 0 else unbounded,
            window_right=window_right if window_right >= 0 else unbounded,
            constexprs=dict(IS_LOCAL=window_left >= 0 or window_right >= 0, SOFTCAP=softcap > 0,
                            HAS_ALIBI=has_alibi),
        )

    def scalars(self):
        return self.qk_scale, self.softcap_log2, self.window_left, self.window_right


def forward_launches(q, k, v, out, lse, sink, softmax_scale, sa, arch, interpreter):
    """The forward's one launch, writing out (B, Sq, Hq, D) and lse (B, Hq, Sq).

    sa: ScoreArgs; sink: fp32 (Hq,) attention-sink logits or None.
    """
    batch, seqlen_q, heads_q, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    head_dim_pad = _head_dim_padded(head_dim)
    cfg = configs.fwd_config(arch, head_dim_pad, sa.constexprs["IS_LOCAL"], q.dtype, interpreter)
    return [KernelLaunch(
        _attn_fwd, (triton.cdiv(seqlen_q, cfg.BLOCK_M), batch * heads_q),
        (q, k, v, out, lse, sa.alibi, sink if sink is not None else lse,
         *_strides3(q), *_strides3(k), *_strides3(v), *_strides3(out),
         sa.stride_alibi_b, seqlen_q, seqlen_k, heads_q, heads_q // heads_kv, *sa.scalars()),
        dict(HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad, BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N,
             HAS_SINK=sink is not None, DOT_PRECISION=_dot_precision(q.dtype), **sa.constexprs),
        cfg.num_warps, cfg.num_stages,
    )]


def backward_launches(dout, q, k, v, out, lse, lse2, delta, dq, dk, dv, softmax_scale, sa, arch, interpreter):
    """The backward's three launches: preprocess (delta, lse2), dK/dV, dQ; sa: ScoreArgs."""
    batch, seqlen_q, heads_q, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    group_size = heads_q // heads_kv
    head_dim_pad = _head_dim_padded(head_dim)
    cfg = configs.bwd_config(arch, head_dim_pad, sa.constexprs["IS_LOCAL"], q.dtype, interpreter)
    precision = _dot_precision(q.dtype)
    pre_block = 64
    common = dict(HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad, DOT_PRECISION=precision, **sa.constexprs)
    preprocess = KernelLaunch(
        _attn_bwd_preprocess, (triton.cdiv(seqlen_q, pre_block), batch * heads_q),
        (out, dout, lse, delta, lse2, *_strides3(out), *_strides3(dout), seqlen_q, heads_q),
        dict(HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad, BLOCK_M=pre_block),
    )
    dkdv = KernelLaunch(
        _attn_bwd_dkdv, (triton.cdiv(seqlen_k, cfg.BLOCK_N1), batch * heads_kv),
        (q, k, v, dout, lse2, delta, dk, dv, sa.alibi,
         *_strides3(q), *_strides3(k), *_strides3(v), *_strides3(dout), *_strides3(dk), *_strides3(dv),
         sa.stride_alibi_b, seqlen_q, seqlen_k, heads_kv, group_size, softmax_scale, *sa.scalars()),
        dict(BLOCK_M=cfg.BLOCK_M1, BLOCK_N=cfg.BLOCK_N1, SPLIT_GROUP_SUM=precision == "ieee" and group_size > 1,
             **common),
        cfg.num_warps, cfg.num_stages,
    )
    dq_launch = KernelLaunch(
        _attn_bwd_dq, (triton.cdiv(seqlen_q, cfg.BLOCK_M2), batch * heads_q),
        (q, k, v, dout, lse2, delta, dq, sa.alibi,
         *_strides3(q), *_strides3(k), *_strides3(v), *_strides3(dout), *_strides3(dq),
         sa.stride_alibi_b, seqlen_q, seqlen_k, heads_q, group_size, softmax_scale, *sa.scalars()),
        dict(BLOCK_M=cfg.BLOCK_M2, BLOCK_N=cfg.BLOCK_N2, **common),
        cfg.num_warps, cfg.num_stages,
    )
    return [preprocess, dkdv, dq_launch]


def _flash_attn_forward(q, k, v, softmax_scale, window_left, window_right, softcap, alibi_slopes, sink):
    """out (B, Sq, Hq, D) in q's dtype and lse (B, Hq, Sq) fp32 for q (B, Sq, Hq, D), k/v (B, Sk, Hk, D)."""
    batch, seqlen_q, heads_q, _ = q.shape
    out = _empty(q.shape, q)
    lse = _empty((batch, heads_q, seqlen_q), q, torch.float32)
    sa = ScoreArgs.make(q, k, softmax_scale, window_left, window_right, softcap, alibi_slopes, lse)
    for launch in forward_launches(q, k, v, out, lse, sink, softmax_scale, sa, _arch(q.device),
                                   interpreter_active()):
        launch.run()
    return out, lse


def _flash_attn_backward(dout, q, k, v, out, lse, dlse, softmax_scale, window_left, window_right, softcap,
                         alibi_slopes):
    """dq, dk, dv with the shapes and dtypes of q, k, v, recomputing P from q, k and lse.

    dlse (B, Hq, Sq) or None is the gradient flowing into lse: since d lse_i / d s_ij = P_ij it
    folds into delta (dS = P * (dP - (delta - dlse))), so the kernels do not change.
    """
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    batch, seqlen_q, heads_q, _ = q.shape
    delta = _empty((batch, heads_q, seqlen_q), q, torch.float32)
    lse2 = _empty((batch, heads_q, seqlen_q), q, torch.float32)
    dq, dk, dv = _empty(q.shape, q), _empty(k.shape, k), _empty(v.shape, v)
    sa = ScoreArgs.make(q, k, softmax_scale, window_left, window_right, softcap, alibi_slopes, lse)
    preprocess, *grads = backward_launches(dout, q, k, v, out, lse, lse2, delta, dq, dk, dv, softmax_scale, sa,
                                           _arch(q.device), interpreter_active())
    preprocess.run()
    if dlse is not None:
        delta -= dlse
    for launch in grads:
        launch.run()
    return dq, dk, dv
