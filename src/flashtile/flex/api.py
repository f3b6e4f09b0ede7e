"""flashtile.attention: programmable attention (score_mod, mask_mod, block-sparse) without torch.compile."""
import torch

from .. import checks, cpu, ops
from ..autograd import first_order_only
from ..runtime import interpreter_active
from .block_mask import BlockMask, dense_block_mask
from .mods import MASK_ARGS, SCORE_ARGS, Mod, adapter, aux_pool


class _Spec:
    """One call's mods and block mask, already checked; builds the kernels' ModArgs or the CPU path's mods."""

    def __init__(self, score, grad, mask, block_mask):
        self.score, self.grad, self.mask, self.block_mask = score, grad, mask, block_mask

    def mod_args(self):
        from ..launch import ModArgs

        pool = aux_pool(self.score, self.grad, self.mask)
        score, grad, mask = (adapter(mod, pool) if mod is not None else None
                             for mod in (self.score, self.grad, self.mask))
        return ModArgs.make(pool, score, grad, mask, self.block_mask)

    def cpu_mods(self):
        return cpu.Mods(self.score, self.grad, self.mask)


def _check_block_mask(block_mask, q, k):
    if not isinstance(block_mask, BlockMask):
        raise TypeError(f"block_mask must be a flashtile BlockMask (from create_block_mask), got "
                        f"{type(block_mask).__name__}")
    B, H, Sq, Sk = block_mask.shape
    want = (q.shape[0], q.shape[2], q.shape[1], k.shape[1])
    if B not in (1, want[0]) or H not in (1, want[1]) or (Sq, Sk) != want[2:]:
        raise ValueError(f"block_mask was built for (B, H, Sq, Sk) = {block_mask.shape} but the inputs have "
                         f"{want} (B and H may be 1); build it with create_block_mask(mask, {want[0]}, "
                         f"{want[1]}, {want[2]}, {want[3]})")
    if block_mask.device != q.device:
        raise ValueError(f"block_mask is on {block_mask.device} but q is on {q.device}")


def _check_extents(mods, q, k):
    """Aux tables indexed by position must cover the inputs (the kernels read them unchecked)."""
    for mod in mods:
        for what, positions, batch in mod.extents if mod is not None else ():
            if positions < max(q.shape[1], k.shape[1]):
                raise ValueError(f"{what} covers {positions} positions but the inputs have {q.shape[1]} queries "
                                 f"and {k.shape[1]} keys")
            if batch is not None and batch != q.shape[0]:
                raise ValueError(f"{what} has {batch} rows but the inputs have batch {q.shape[0]}")


def _as_mod(fn, aux, base, name):
    """A plain or @triton.jit function gets the call's aux tensors; a Mod keeps its own."""
    if fn is None or isinstance(fn, Mod):
        return fn
    return Mod(fn, aux, base, name)


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, scale, causal, spec):
        window_right = 0 if causal else -1
        if q.device.type != "cpu" or interpreter_active():
            from ..launch import _flash_attn_forward

            out, lse = _flash_attn_forward(q, k, v, scale, -1, window_right, 0.0, None, None,
                                           mods=spec.mod_args())
        else:
            out, lse = cpu.forward(q, k, v, scale, -1, window_right, 0.0, None, None, mods=spec.cpu_mods())
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (scale, window_right, spec)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    @first_order_only
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        scale, window_right, spec = ctx.args
        if q.device.type != "cpu" or interpreter_active():
            from ..bwd_launch import _flash_attn_backward

            dq, dk, dv, *_ = _flash_attn_backward(dout, q, k, v, out, lse, None, scale, -1, window_right, 0.0, None,
                                                  mods=spec.mod_args())
        else:
            dq, dk, dv, _ = cpu.backward(dout, q, k, v, out, lse, None, scale, -1, window_right, 0.0, None,
                                         mods=spec.cpu_mods())
        return dq, dk, dv, None, None, None


def attention(q, k, v, score_mod=None, mask_mod=None, block_mask=None, softmax_scale=None, causal=False,
              return_lse=False, aux=(), score_mod_grad=None):
    """Attention with user score and mask functions and block sparsity, without torch.compile.

    q: (batch, seqlen_q, nheads, headdim); k, v: (batch, seqlen_k, nheads_k, headdim) as flash_attn_func
    (fp16/bf16/fp32, GQA/MQA, head dims multiple of 8 up to 256).
    score_mod(score, b, h, q_idx, kv_idx, *aux) -> new score: score is q.k * softmax_scale (natural-log
    units, fp32), b / h the batch and query-head index, q_idx / kv_idx positions (from 0).
    mask_mod(b, h, q_idx, kv_idx, *aux) -> bool: True where the key is visible. Either may be a plain
    function (flashtile applies triton.jit), a @triton.jit function, or a Mod (e.g. document_mask(ids)).
    Only elementwise arithmetic, comparisons, tl.* math and tl.load(aux + index) are allowed in them.
    aux: up to 4 tensors on q's device passed to a plain score_mod / score_mod_grad / mask_mod as extra
    arguments (Triton pointers in the kernels, so a mod reads tl.load(table + index); see
    docs/programmable.md); a Mod (document_mask(ids), and_masks(...)) carries its own aux tensors.
    score_mod_grad(score, b, h, q_idx, kv_idx, *aux) -> d score_mod / d score (elementwise, same
    arguments): needed for the backward whenever score_mod is given; no gradient flows into aux tensors
    (score_mod aux tensors that require grad are refused while grad mode is on).
    block_mask: a BlockMask from create_block_mask for these shapes; its mask_mod is used when mask_mod is
    None, and a mask_mod given with it must be that one (the same function over the same aux tensors:
    ValueError otherwise, since full blocks skip the mask). Without a block mask a mask_mod is evaluated in
    every block (correct, but nothing is skipped). Position-indexed aux tables of the ready-made masks
    (document_mask's ids) must cover the inputs (ValueError otherwise).
    causal: bottom-right aligned as in flash_attn_func; not combinable with block_mask (use
    and_masks(causal_mask, ...) when building the block mask instead).
    Returns out (q's shape and dtype), and lse (batch, nheads, seqlen_q) fp32 when return_lse (no gradient
    flows through lse). Runs the Triton kernels on GPUs and under TRITON_INTERPRET=1; other CPU tensors
    run flashtile.cpu with the mods' PyTorch forms (blockwise, every block evaluated).
    """
    ops.refuse_func_transforms()
    checks.check_qkv(q, k, v)
    checks.flag("causal", causal)
    checks.flag("return_lse", return_lse)
    if isinstance(aux, torch.Tensor):
        aux = (aux,)
    aux = tuple(aux)
    score = _as_mod(score_mod, aux, SCORE_ARGS, "score_mod")
    grad = _as_mod(score_mod_grad, aux, SCORE_ARGS, "score_mod_grad")
    if grad is not None and score is None:
        raise ValueError("score_mod_grad was given without a score_mod")
    if block_mask is not None:
        _check_block_mask(block_mask, q, k)
        if causal:
            raise ValueError("causal=True cannot be combined with block_mask: build the block mask from "
                             "and_masks(causal_mask, your_mask) instead")
    mask = _as_mod(mask_mod, aux, MASK_ARGS, "mask_mod")
    if mask is not None and block_mask is not None and not mask.same_as(block_mask.mask_mod):
        # The kernels skip the mask in the block mask's full blocks: another mask_mod would hold only in the rest.
        raise ValueError(f"mask_mod {mask!r} is not the mask block_mask was built from ({block_mask.mask_mod!r}): "
                         f"pass block_mask alone (its mask_mod is used), or build it from this mask_mod with "
                         f"create_block_mask")
    if mask is None and block_mask is not None:
        mask = block_mask.mask_mod
    if mask is not None and block_mask is None:
        block_mask = dense_block_mask(mask, q.shape[1], k.shape[1], q.device)
    for mod in (score, grad, mask):
        for i, a in enumerate(mod.aux if mod is not None else ()):
            if a.device != q.device:
                raise ValueError(f"aux tensor {i} of {mod.name} is on {a.device} but q is on {q.device}; "
                                 f"aux tensors must be on the inputs' device")
    if torch.is_grad_enabled() and score is not None and any(a.requires_grad for a in score.aux):
        # Its gradient would be silently missing (.grad None, or an output cut off from the graph).
        raise ValueError("an aux tensor of score_mod requires grad, but no gradient flows into aux tensors: pass it "
                         "detached (.detach()), or give a learned bias as flash_attn_func's attn_bias, which has "
                         "a gradient")
    aux_pool(score, grad, mask)
    _check_extents((score, grad, mask), q, k)
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    if score is not None and grad is None and needs_grad:
        raise ValueError("score_mod needs score_mod_grad(score, b, h, q_idx, kv_idx, *aux) -> d score_mod / d score "
                         "for the backward (q, k or v requires grad); pass it, or run under torch.no_grad()")
    scale = checks.softmax_scale_or_default(softmax_scale, q.shape[-1])
    out, lse = _Attention.apply(q, k, v, scale, causal, _Spec(score, grad, mask, block_mask))
    return (out, lse) if return_lse else out
