"""Autograd for the forward op: what is saved, what the backward calls.

Registered on the custom op itself (torch.library.register_autograd), so `torch.ops.flashtile.fwd` is
differentiable on its own and torch.compile traces it without a graph break. In eager mode `forward`
runs the same context and backward through a torch.autograd.Function instead, skipping the custom-op
dispatch (see ops.call). Saved: q, k, v, out, lse (and ALiBi slopes, sinks, bias, the dropout seed):
O(N) memory beyond the bias; the dropout mask is regenerated, never stored.
"""
import functools
from operator import itemgetter

import torch

from . import ops

# Positions in flashtile::fwd's inputs of the tensors that can require grad (q, k, v, alibi_slopes, sink, attn_bias):
# the others are numbers or integer tensors (cu_seqlens, the dropout seed), which never do.
_FLOAT_TENSOR_INPUTS = (0, 1, 2, 7, 8, 13)
_SINK, _BIAS = 8, 13
_float_tensors = itemgetter(*_FLOAT_TENSOR_INPUTS)  # the op's inputs (or their gradients) at those positions


def _setup_context(ctx, inputs, output):
    (q, k, v, softmax_scale, window_left, window_right, softcap, alibi_slopes, sink,
     cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, attn_bias, dropout_p, rng, deterministic) = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, alibi_slopes, sink, cu_seqlens_q, cu_seqlens_k, attn_bias, rng)
    ctx.scalars = (softmax_scale, window_left, window_right, softcap)
    ctx.max_seqlens = (max_seqlen_q, max_seqlen_k)
    ctx.dropout_p = dropout_p
    ctx.deterministic = deterministic


def _bias_grad(dscores, attn_bias):
    """Sum the full (B, Hq, Sq, Sk) score gradient over the dims the bias broadcasts along."""
    dims = tuple(i for i, size in enumerate(attn_bias.shape) if size == 1 and dscores.shape[i] != 1)
    return (dscores.sum(dims, keepdim=True) if dims else dscores).to(attn_bias.dtype)


def _grads(ctx, dout, dlse, bias_wanted, sink_wanted):
    """One gradient per input of flashtile::fwd; bias_wanted / sink_wanted: whether attn_bias / sink need theirs."""
    # dout / dlse None: that output took no part in the loss (_EagerForward does not materialize zero gradients:
    # a zero-filled dlse cost an allocation, a fill and the preprocess's dlse term on every backward).
    q, k, v, out, lse, alibi_slopes, sink, cu_seqlens_q, cu_seqlens_k, attn_bias, rng = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(out)
    bias_grad = attn_bias is not None and bias_wanted
    sink_grad = sink is not None and sink_wanted
    dq, dk, dv, dscores, dsink = ops.call(ops.bwd, dout, q, k, v, out, lse, dlse, *ctx.scalars, alibi_slopes,
                                          cu_seqlens_q, cu_seqlens_k, *ctx.max_seqlens, attn_bias, bias_grad,
                                          ctx.dropout_p, rng, ctx.deterministic, sink if sink_grad else None)
    dbias = _bias_grad(dscores, attn_bias) if bias_grad else None
    dsink = dsink if sink_grad else None
    return dq, dk, dv, None, None, None, None, None, dsink, None, None, None, None, dbias, None, None, None


def _backward(ctx, dout, dlse):
    return _grads(ctx, dout, dlse, ctx.needs_input_grad[_BIAS], ctx.needs_input_grad[_SINK])


_SECOND_ORDER = (b"flashtile's attention backward is not differentiable: second-order gradients (double backward, "
                 b"e.g. a gradient penalty) are not supported, as in flash-attn")


def first_order_only(backward):
    """Wrap an autograd.Function backward: it runs without recording a graph, and under create_graph=True its
    gradients are marked so that differentiating them raises _SECOND_ORDER. (Without this the kernels' gradients
    had no graph, and a second grad call failed with torch's "does not require grad"; the CPU path's recorded one
    through its blockwise algorithm that nothing checks.)"""
    @functools.wraps(backward)
    def wrapper(ctx, *grads):
        with torch.no_grad():
            outputs = backward(ctx, *grads)
        if not torch.is_grad_enabled():  # create_graph=False: the usual backward
            return outputs
        present = [g for g in outputs if g is not None]
        # The node's inputs also hold what the gradients depend on (the incoming gradients, the saved q, k, v, ...):
        # a grad call from a gradient to q must pass through it and raise. (Fed only detached copies, as torch's
        # once_differentiable does, autograd.grad(dq, q) found no path to q: "not used in the graph", or zeros.)
        sources = [t for t in (*grads, *ctx.saved_tensors) if t is not None and t.requires_grad]
        marked = torch._C._functions.DelayedError(_SECOND_ORDER, len(present) + len(sources))(
            *[g.detach().requires_grad_() for g in present], *sources)
        marked = iter(marked if isinstance(marked, tuple) else (marked,))
        return tuple(None if g is None else next(marked) for g in outputs)
    return wrapper


# The op's own backward refuses second order too (torch.ops.flashtile.fwd called directly, or under a dispatch mode
# such as FlopCounterMode, where flash_attn_func takes the op: the CPU path had silently recorded a graph through its
# blockwise algorithm, the kernels failed with torch's generic "does not require grad").
torch.library.register_autograd("flashtile::fwd", first_order_only(_backward), setup_context=_setup_context)

# ctx.needs_input_grad positions of attn_bias and sink in _EagerForward.apply(inputs, *_float_tensors(inputs))
_EAGER_BIAS, _EAGER_SINK = 1 + _FLOAT_TENSOR_INPUTS.index(_BIAS), 1 + _FLOAT_TENSOR_INPUTS.index(_SINK)


class _EagerForward(torch.autograd.Function):
    """flashtile::fwd with the registration's context and backward, called without the op's dispatch.
    apply(inputs, *_float_tensors(inputs)): the op's inputs as one tuple, and apart the tensors that can require
    grad, which autograd must see (torch's apply costs host time per argument: ~2.5 us more for all 17).
    (forward takes ctx itself: with a separate setup_context, torch binds the arguments through
    inspect.signature on every call, ~40 us.)"""

    @staticmethod
    def forward(ctx, inputs, *float_tensors):
        output = ops.eager_call(ops.fwd, *inputs)  # only applied in eager mode (forward below)
        _setup_context(ctx, inputs, output)
        ctx.set_materialize_grads(False)  # _grads takes None for an unused output's gradient
        return output

    @staticmethod
    @first_order_only
    def backward(ctx, dout, dlse):
        needs = ctx.needs_input_grad
        return None, *_float_tensors(_grads(ctx, dout, dlse, needs[_EAGER_BIAS], needs[_EAGER_SINK]))


def forward(*inputs):
    """(out, lse) = flashtile::fwd(*inputs), differentiable: the op under torch.compile, else _EagerForward, or
    without autograd where no input needs a gradient (inference: most of the ~60 us of host time between
    flash_attn_func and the op's implementation on the H200 machine, benchmarks/host_time.py --parts)."""
    if not ops.eager():
        return ops.fwd(*inputs)
    ops.refuse_func_transforms()
    if torch.is_grad_enabled():
        for i in _FLOAT_TENSOR_INPUTS:  # a loop, not any() over a generator (host time); each a tensor or None
            t = inputs[i]
            if t is not None and t.requires_grad:
                return _EagerForward.apply(inputs, *_float_tensors(inputs))
    return ops.eager_call(ops.fwd, *inputs)
