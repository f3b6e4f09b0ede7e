"""Attention implementations to benchmark, each behind one small interface.

A provider turns flash-attn layout inputs q (B, Sq, Hq, D), k/v (B, Sk, Hk, D) and a feature setting
(features.Feature: window, softcap, ALiBi) into a ``Prepared``: leaf tensors in the provider's own layout
(converted before timing, so transposes are never timed) and a forward closure. Third-party imports
happen inside the methods, so this module imports without a GPU, flash-attn or triton.
"""
import contextlib
import importlib
import inspect

from flashtile.bench.features import Feature

# Causal is bottom-right aligned everywhere (flash-attn >= 2.1 semantics), so all providers compute
# the same function when seqlen_q != seqlen_k.


class Prepared:
    """One provider bound to one set of inputs.

    inputs: leaf tensors (requires_grad) in the provider's layout; backward differentiates w.r.t. them.
    fn(): the forward; returns the output in the provider's layout.
    to_bshd(out): that output as (B, Sq, Hq, D), for the accuracy check (not timed).
    context(): entered around every call (e.g. to pin an SDPA backend); costs nothing per call.
    """

    def __init__(self, inputs, fn, to_bshd=None, context=None):
        self.inputs = inputs
        self.fn = fn
        self.to_bshd = to_bshd or (lambda out: out)
        self.context = context or contextlib.nullcontext


def _leaf(x):
    return x.detach().clone().requires_grad_(True)


def _leaf_bhsd(x):
    return x.detach().transpose(1, 2).contiguous().requires_grad_(True)


def _first(out):
    # Some versions of flash-attn return (out, lse) or (out, lse, probs).
    return out[0] if isinstance(out, (tuple, list)) else out


class Provider:
    """Base class: ``name``, whether it needs CUDA, and how to bind it to inputs."""

    name = ""
    needs_cuda = True
    opt_in = False

    def unavailable(self, device):
        """None when the provider can run on ``device``, else a short reason."""
        if self.needs_cuda and device.type != "cuda":
            return "needs a CUDA GPU"
        return None

    def unsupported(self, feature):
        """None when the provider can run ``feature`` (a features.Feature), else a short reason."""
        return None

    def prepare(self, q, k, v, causal, feature=Feature()):
        raise NotImplementedError

    def predicted_bytes(self, batch, heads_q, seqlen_q, seqlen_k, element_size, feature=Feature()):
        """Memory a fwd+bwd is expected to need beyond the inputs (0 = linear, never skipped)."""
        return 0


class FlashTile(Provider):
    name = "flashtile"
    needs_cuda = False

    def unavailable(self, device):
        try:
            flashtile = importlib.import_module("flashtile")
            flashtile.flash_attn_func
        except (ImportError, AttributeError) as e:
            return f"flashtile.flash_attn_func not importable ({e})"
        return None

    def prepare(self, q, k, v, causal, feature=Feature()):
        from flashtile import flash_attn_func

        extra = feature.kwargs(q.shape[2], q.device, q.shape[1], k.shape[1], q.dtype)
        q, k, v = _leaf(q), _leaf(k), _leaf(v)
        return Prepared((q, k, v), lambda: flash_attn_func(q, k, v, causal=causal, **extra))


class FlashTileVarlen(Provider):
    """flashtile.flash_attn_varlen_func on the same batch packed as B sequences of equal length (the
    overhead of the varlen path over the dense one, same tokens and FLOPs)."""

    name = "flashtile-varlen"
    needs_cuda = False
    opt_in = True  # not in the default provider list: name it in --providers

    def prepare(self, q, k, v, causal, feature=Feature()):
        import torch

        from flashtile import flash_attn_varlen_func

        (batch, sq), sk = q.shape[:2], k.shape[1]
        extra = feature.kwargs(q.shape[2], q.device, sq, sk, q.dtype)
        cu_q = torch.arange(0, (batch + 1) * sq, sq, dtype=torch.int32, device=q.device)
        cu_k = torch.arange(0, (batch + 1) * sk, sk, dtype=torch.int32, device=q.device)
        q, k, v = (_leaf(x.reshape(-1, *x.shape[2:])) for x in (q, k, v))

        def fn():
            return flash_attn_varlen_func(q, k, v, cu_q, cu_k, sq, sk, causal=causal, **extra)

        return Prepared((q, k, v), fn, lambda out: out.reshape(batch, sq, *out.shape[1:]))


class Standard(Provider):
    """The paper's baseline: materialized softmax in the inputs' dtype (flashtile.reference)."""

    name = "standard"
    needs_cuda = False

    def unsupported(self, feature):
        extra = [p for p in feature.parts() if p in ("dropout", "sink", "bias")]
        return f"{'/'.join(extra)} not in the standard baseline" if extra else None

    def prepare(self, q, k, v, causal, feature=Feature()):
        from flashtile.reference import standard_attention

        extra = feature.kwargs(q.shape[2], q.device)
        q, k, v = _leaf(q), _leaf(k), _leaf(v)
        return Prepared((q, k, v), lambda: standard_attention(q, k, v, causal=causal, **extra))

    def predicted_bytes(self, batch, heads_q, seqlen_q, seqlen_k, element_size, feature=Feature()):
        # Measured with the CPU tracker (timing.TensorMemoryTracker), B1 H4 S512: the peak, in backward,
        # holds four score-sized tensors in the input dtype (forward saves softmax's output and its
        # nan_to_num copy; backward adds gradients of that size): 16.25 B/element in fp32, 9.75 in bf16.
        # Bool masks and CPU bf16 temporaries make the rest, hence + 2 B. Softcap saves tanh's output,
        # one more (20.25 / 11.75); windows and ALiBi measured no extra. 10% margin for the allocator.
        tensors = 5 if feature.softcap else 4
        return int(1.1 * batch * heads_q * seqlen_q * seqlen_k * (tensors * element_size + 2))


class Sdpa(Provider):
    """torch.nn.functional.scaled_dot_product_attention pinned to one backend."""

    def __init__(self, name, backend):
        self.name = name
        self.backend = backend

    def unsupported(self, feature):
        return f"{'/'.join(feature.parts())} not supported by SDPA" if feature.parts() else None

    def prepare(self, q, k, v, causal, feature=Feature()):
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = getattr(SDPBackend, self.backend)
        sq, sk = q.shape[1], k.shape[1]
        gqa = q.shape[2] != k.shape[2]
        kwargs = {"enable_gqa": True} if gqa else {}
        mask = None
        if causal and sq != sk:
            from torch.nn.attention.bias import causal_lower_right

            # is_causal=True is top-left aligned; the lower-right bias matches flash-attn.
            mask = causal_lower_right(sq, sk)
        is_causal = causal and mask is None
        q, k, v = _leaf_bhsd(q), _leaf_bhsd(k), _leaf_bhsd(v)

        def fn():
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, **kwargs)

        return Prepared((q, k, v), fn, lambda out: out.transpose(1, 2), lambda: sdpa_kernel(backend))


class Flex(Provider):
    name = "flex"

    def unsupported(self, feature):
        extra = [p for p in feature.parts() if p in ("dropout", "sink", "bias")]
        return f"{'/'.join(extra)} not set up for FlexAttention here" if extra else None

    def unavailable(self, device):
        reason = super().unavailable(device)
        if reason is None:
            try:
                importlib.import_module("torch.nn.attention.flex_attention")
            except ImportError as e:
                reason = f"torch.nn.attention.flex_attention not importable ({e})"
        return reason

    def prepare(self, q, k, v, causal, feature=Feature()):
        from flashtile.bench import flex as flex_parts
        from flashtile.bench.features import alibi_slopes

        sq, sk = q.shape[1], k.shape[1]
        block_mask = flex_parts.block_mask_for(sq, sk, causal, feature, q.device)
        slopes = alibi_slopes(q.shape[2], q.device) if feature.alibi else None
        score_mod = flex_parts.score_mod_for(sq, sk, feature, slopes)
        gqa = q.shape[2] != k.shape[2]
        flex = flex_parts.compiled_flex()
        q, k, v = _leaf_bhsd(q), _leaf_bhsd(k), _leaf_bhsd(v)

        def fn():
            return flex(q, k, v, score_mod=score_mod, block_mask=block_mask, enable_gqa=gqa)

        return Prepared((q, k, v), fn, lambda out: out.transpose(1, 2))


class FlashAttnPackage(Provider):
    """flash-attn 2/3 (``flash_attn``) or flash-attn 4 (``flash_attn.cute``), same layout as ours."""

    def __init__(self, name, module):
        self.name = name
        self.module = module

    def unavailable(self, device):
        reason = super().unavailable(device)
        if reason is None:
            try:
                importlib.import_module(self.module).flash_attn_func
            except Exception as e:  # a broken CUDA extension raises OSError/RuntimeError, not ImportError
                reason = f"{self.module}.flash_attn_func not importable ({type(e).__name__}: {e})"
        return reason

    def _params(self):
        try:
            return inspect.signature(importlib.import_module(self.module).flash_attn_func).parameters
        except (TypeError, ValueError):  # no introspectable signature: let the call decide
            return None

    def unsupported(self, feature):
        params = self._params()
        names = {"window": "window_size", "softcap": "softcap", "alibi": "alibi_slopes", "dropout": "dropout_p",
                 "sink": "sink", "bias": "attn_bias"}
        missing = [names[p] for p in feature.parts() if params is not None and names[p] not in params]
        return f"{self.module}.flash_attn_func does not accept {', '.join(missing)}" if missing else None

    def prepare(self, q, k, v, causal, feature=Feature()):
        func = importlib.import_module(self.module).flash_attn_func
        extra = feature.kwargs(q.shape[2], q.device, q.shape[1], k.shape[1], q.dtype)
        params = self._params()
        if "window_size" in extra and params and params["window_size"].default == (None, None):
            # flash-attn 4 spells an unbounded side None, not -1.
            extra["window_size"] = tuple(None if w < 0 else w for w in extra["window_size"])
        q, k, v = _leaf(q), _leaf(k), _leaf(v)
        return Prepared((q, k, v), lambda: _first(func(q, k, v, causal=causal, **extra)))


PROVIDERS = {
    p.name: p
    for p in (
        FlashTile(),
        FlashTileVarlen(),
        Standard(),
        Sdpa("sdpa-flash", "FLASH_ATTENTION"),
        Sdpa("sdpa-efficient", "EFFICIENT_ATTENTION"),
        Sdpa("sdpa-cudnn", "CUDNN_ATTENTION"),
        Flex(),
        FlashAttnPackage("flash-attn", "flash_attn"),
        FlashAttnPackage("fa4", "flash_attn.cute"),
    )
}
