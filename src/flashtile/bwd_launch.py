"""Host launchers of the backward: the portable kernels' launches (preprocess, dK / dV, dQ, and the dQ conversion the
Gluon backward shares), the dispatch between them and the Hopper Gluon backward (gluon_bwd_launch.py), and the plain
backward's launch plans (plans.py).

The shared pieces (Geometry, ScoreArgs, KernelLaunch, buffers, the Gluon dispatch policy and plans) come from
launch.py.
"""
import os
from dataclasses import replace

import torch

from . import configs, launch, plans
from .kernels.bwd import _attn_bwd_dkdv, _attn_bwd_dq, _attn_bwd_dq_convert, _attn_bwd_preprocess
# Types, constants and pure helpers by name; the launchers' policy functions (arch, precision, buffers, the Gluon
# dispatch, plans) through the module, so a test's patch of launch.<name> reaches every launcher.
from .launch import (LOG2E, ROW_PAD, _NO_MODS, Geometry, KernelLaunch, ScoreArgs, _cdiv, _env_reader, _head_dim_padded,
                     _signature, _strides3, _window_span)

_gluon_bwd_env = _env_reader("FLASHTILE_GLUON_BWD")  # read by the planned backward's key


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


def _dropout_as_factor():
    """Whether the dK/dV kernel applies the dropout mask as a factor (kernels/bwd._attn_bwd_dkdv_inner's
    DROPOUT_FACTOR): on ROCm, whose triton 3.9 fails to compile the boolean mask's way into the dot operand at D64
    (tests/compile_check.py). NVIDIA keeps the select: the factor form compiled for sm90 has ~24 % fewer loop
    instructions but more spills and shared memory (session 48), and on the H200 its backward was 1-4 % faster at
    D64 and D256 but 7 % slower at D128 non-causal (benchmarks/dropout_factor_ab.py, docs/perf-log.md session 49)."""
    return torch.version.hip is not None


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
    precision = launch._dot_precision(q.dtype, arch)
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
                 SPLIT_GROUP_SUM=q.dtype == torch.float32 and precision != "tf32" and group_size > 1, PART=part,
                 DROPOUT_FACTOR=sa.constexprs["HAS_DROPOUT"] and _dropout_as_factor(), **common),
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
    gluon_launch, gluon_bwd_launch = launch._gluon_modules()
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
    return launch._try_gluon(
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
    gluon_bwd_launch = launch._gluon_modules()[1]
    inputs = (dout, q, k, v, out, lse)
    key = ("bwd", _gluon_bwd_env(), gluon_bwd_launch._disabled is None, _signature(dout),
           _signature(q), _signature(k), _signature(v), _signature(out), _signature(lse), plans.aliasing(inputs),
           softmax_scale, window_left, window_right)
    return launch._planned(key, inputs, gluon_bwd_launch,
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
    gluon_launch, gluon_bwd_launch = launch._gluon_modules()
    return launch._try_gluon(
        "FLASHTILE_GLUON_SPARSE" if "FLASHTILE_GLUON_SPARSE" in os.environ else "FLASHTILE_GLUON_BWD",
        gluon_launch.tested_triton,
        lambda: gluon_bwd_launch.sparse_ok(q, k, v, out, dout, (window_left, window_right), mods),
        lambda: gluon_bwd_launch.gluon_backward(dout, q, k, v, out, lse, softmax_scale, False, dlse, mods=mods),
        lambda exc: gluon_bwd_launch.sparse_failed(mods, exc))


def _gluon_bwd_candidate(bias_grad, dropout_p, mods, deterministic):
    """Whether _flash_attn_backward asks the Gluon backward at all: no bias gradient (the Gluon kernel reads a bias,
    it writes no dS), no mods, not deterministic (its dQ reductions run in no fixed order). Windows, softcap, ALiBi,
    varlen, dropout (D64 / D128) and a bias's layout (gluon_bwd_bias.bias_tma_ok, gluon_bwd_launch.bias_shared_ok;
    dense only) are its own to refuse or take."""
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
                and cu_seqlens_q is None and not dropout_p and launch._plannable(q)):
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
    poison = launch.poison_outputs()
    delta = launch._empty(geo.row_buffer_shape(q), q, torch.float32, poison)
    lse2 = launch._empty(geo.row_buffer_shape(q), q, torch.float32, poison)
    dq, dk, dv = (launch._empty(t.shape, t, poison=poison) for t in (q, k, v))
    # Zeros, not poison: blocks the kernels skip (outside a window or causal mask) have dS = 0.
    dbias = (torch.zeros((geo.batch, geo.heads_q, geo.seqlen_q, geo.seqlen_k), dtype=torch.float32, device=q.device)
             if bias_grad else None)
    sa = ScoreArgs.make(geo, softmax_scale, window_left, window_right, softcap, alibi_slopes, lse, attn_bias,
                        dropout_p, rng, approx_tanh=launch._approx_tanh(q))
    if dlse is not None:  # read with lse's strides
        dlse = dlse.to(torch.float32).contiguous()
    for kernel_launch in backward_launches(geo, dout, q, k, v, out, lse, lse2, delta, dq, dk, dv, dbias, softmax_scale,
                                           sa, launch._arch(q.device), launch.interpreter_active(), mods, dlse, sink,
                                           parts):
        kernel_launch.run()
    return dq, dk, dv, dbias if dbias is not None else q.new_empty(0, dtype=torch.float32), _dsink(parts, q)


def _dsink(parts, q):
    """The sink gradient from the preprocess's pieces, or an empty tensor without a sink."""
    return sink_grad(parts, q.shape[-2]) if parts is not None else q.new_empty(0, dtype=torch.float32)
