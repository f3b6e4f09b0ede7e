"""Autograd for the forward op: what is saved, what the backward calls.

Registered on the custom op itself (torch.library.register_autograd) rather than wrapped in a
torch.autograd.Function, so `torch.ops.flashtile.fwd` is differentiable on its own and
torch.compile traces it without a graph break. Saved: q, k, v, out, lse (and ALiBi slopes), O(N) memory.
"""
import torch

from . import ops


def _setup_context(ctx, inputs, output):
    q, k, v, softmax_scale, window_left, window_right, softcap, alibi_slopes = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, alibi_slopes)
    ctx.scalars = (softmax_scale, window_left, window_right, softcap)


def _backward(ctx, dout, dlse):
    q, k, v, out, lse, alibi_slopes = ctx.saved_tensors
    dq, dk, dv = ops.bwd(dout, q, k, v, out, lse, dlse, *ctx.scalars, alibi_slopes)
    return dq, dk, dv, None, None, None, None, None


torch.library.register_autograd("flashtile::fwd", _backward, setup_context=_setup_context)
