"""flashtile.attention: user score_mod / mask_mod, ready-made masks and block-sparse kernels, forward and
backward against the float64 reference built from the same definitions (their PyTorch forms)."""
import dataclasses

import pytest
import torch
import triton
import triton.language as tl

import flashtile
from flashtile import flex
from flashtile.flex import block_mask as block_mask_module
from flashtile.flex import tanh
from flashtile.flex.mods import Mod
from utils import assert_close_rule, check_rows_from_4, make_qkv, references, strided

TABLE_SIZE = tl.constexpr(256)  # relative positions -127..128 (q_idx - kv_idx + 127)


def rel_bias(score, b, h, q_idx, kv_idx, table):
    # Relative positions beyond the table share its end buckets (an index past it would read other memory).
    return score + tl.load(table + h * TABLE_SIZE + tl.minimum(tl.maximum(q_idx - kv_idx, -127), 128) + 127)


def unit_grad(score, b, h, q_idx, kv_idx, table):
    return score * 0.0 + 1.0


@triton.jit
def alibi_mod(score, b, h, q_idx, kv_idx, slopes):
    return score - tl.load(slopes + h) * tl.abs(q_idx - kv_idx).to(tl.float32)


def alibi_grad(score, b, h, q_idx, kv_idx, slopes):
    return score * 0.0 + 1.0


def softcap_mod(score, b, h, q_idx, kv_idx):
    return 5.0 * tanh(score / 5.0)


def softcap_grad(score, b, h, q_idx, kv_idx):
    t = tanh(score / 5.0)
    return 1.0 - t * t


def late_rows(b, h, q_idx, kv_idx):
    """Rows before 40 see nothing; the others see keys up to themselves."""
    return (q_idx >= 40) & (kv_idx <= q_idx)


def per_head(b, h, q_idx, kv_idx):
    return (kv_idx <= q_idx + h * 16) & (kv_idx + 24 * b >= q_idx)


DOC_IDS = torch.tensor([0] * 20 + [1] * 45 + [2] * 3 + [3] * 22)  # 90 tokens, 4 documents
MASKS = {
    "causal": lambda: flashtile.causal_mask,
    "window20": lambda: flashtile.sliding_window_mask(20),
    "window9-both": lambda: flashtile.sliding_window_mask(9, causal=False),
    "document": lambda: flashtile.document_mask(DOC_IDS),
    "document-causal": lambda: flashtile.and_masks(flashtile.causal_mask, flashtile.document_mask(DOC_IDS)),
    "prefix-lm": lambda: flashtile.prefix_lm_mask(10),
    "block-diagonal": lambda: flashtile.block_diagonal_mask(24),
    "dilated": lambda: flashtile.dilated_mask(2, block=32),
    "strided": lambda: flashtile.strided_mask(3),
    "or-masks": lambda: flashtile.or_masks(flashtile.block_diagonal_mask(32), flashtile.strided_mask(7)),
    "per-batch-head": lambda: per_head,
    "empty-rows": lambda: late_rows,
}


def check(q, k, v, dtype, mask=None, score=None, **kwargs):
    """attention vs the float64 reference: out, lse, dq, dk, dv (the tolerance rule of DESIGN.md).

    mask: the mask for the reference; it goes to attention as mask_mod only without a block_mask."""
    mask_ref = mask if mask is None or isinstance(mask, Mod) else Mod(mask)
    score_ref = None
    if score is not None:
        aux = kwargs.get("aux", ())
        aux = (aux,) if isinstance(aux, torch.Tensor) else aux
        score_ref = Mod(score, aux, ("score", "b", "h", "q_idx", "kv_idx"), "score_mod")
    if "block_mask" not in kwargs:
        kwargs["mask_mod"] = mask
    out, lse = flashtile.attention(q, k, v, score_mod=score, return_lse=True, **kwargs)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(dtype=dtype, device=q.device)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    ref64, ref_lowp = references(q, k, v, dout, kwargs.get("causal", False), kwargs.get("softmax_scale"),
                                 mask_mod=mask_ref, score_mod=score_ref)
    for name, got, r64, rlow in zip(("out", "dq", "dk", "dv"), (out, *grads), ref64, ref_lowp):
        assert_close_rule(name, got, r64, rlow, dtype)
    _, lse_ref = flashtile.attention_ref(q.detach(), k.detach(), v.detach(), causal=kwargs.get("causal", False),
                                         softmax_scale=kwargs.get("softmax_scale"),
                                         return_lse=True, mask_mod=mask_ref, score_mod=score_ref)
    empty = torch.isinf(lse_ref)
    assert torch.equal(torch.isinf(lse) & (lse < 0), empty), "lse must be -inf exactly for rows that see no key"
    torch.testing.assert_close(lse[~empty].double(), lse_ref[~empty].double(), atol=2e-3, rtol=1e-4)
    return out, lse


@pytest.mark.parametrize("name", list(MASKS))
def test_ready_made_and_custom_masks(backend, name):
    """Every mask through a block mask with partial, full and empty blocks (90 tokens, 32-blocks: edges)."""
    _, device = backend
    q, k, v = make_qkv(2, 90, 90, 2, 1, 32, torch.float16, device)
    mask = MASKS[name]()
    if name.startswith("document"):
        mask = Mod(mask.fn, tuple(a.to(device) for a in mask.aux))
    block_mask = flashtile.create_block_mask(mask, 2, 2, 90, 90, block_size=(32, 32), device=device)
    out, lse = check(q, k, v, torch.float16, mask, block_mask=block_mask)
    if name == "empty-rows":
        assert torch.all(out[:, :40] == 0) and torch.all(lse[:, :, :40] == float("-inf"))


@pytest.mark.parametrize("block_size", [(64, 32), (16, 64), (32, 128)], ids=["64x32", "16x64", "32x128"])
def test_block_sizes_and_shapes(backend, block_size):
    """Blocks larger than the tiles (sub-tiled) and smaller (tiles shrink); Sq != Sk; fp32; GQA."""
    _, device = backend
    q, k, v = make_qkv(1, 77, 150, 4, 2, 40, torch.float32, device)
    mask = flashtile.and_masks(flashtile.sliding_window_mask(60, causal=False), per_head)
    block_mask = flashtile.create_block_mask(mask, 1, 4, 77, 150, block_size=block_size, device=device)
    check(q, k, v, torch.float32, mask, block_mask=block_mask)


def test_mask_without_block_mask(backend):
    """A mask_mod alone is evaluated in every block; causal=True combines with it (bottom-right aligned)."""
    _, device = backend
    q, k, v = make_qkv(1, 50, 70, 2, 2, 32, torch.float16, device)
    check(q, k, v, torch.float16, mask=flashtile.block_diagonal_mask(16), causal=True)


def test_document_mask_per_batch(backend):
    _, device = backend
    ids = torch.stack([DOC_IDS[:70], torch.arange(70) // 30]).to(device)
    q, k, v = make_qkv(2, 70, 70, 2, 2, 16, torch.float16, device)
    mask = flashtile.and_masks(flashtile.causal_mask, flashtile.document_mask(ids))
    block_mask = flashtile.create_block_mask(mask, 2, None, 70, 70, block_size=(32, 32), device=device)
    check(q, k, v, torch.float16, mask, block_mask=block_mask)


def test_mods_made_in_the_other_interpreter_mode(monkeypatch):
    """Masks combined while TRITON_INTERPRET was 0 (triton.jit then makes compiled functions), then run by the
    interpreter: flex.mods.triton_form makes each function, a combination's parts too, in the current mode."""
    if torch.cuda.is_available():
        pytest.skip("the interpreter's mode switch: CPU only")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    mask = flashtile.and_masks(flashtile.causal_mask, flashtile.strided_mask(5), flashtile.block_diagonal_mask(24))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    q, k, v = make_qkv(1, 40, 40, 1, 1, 16, torch.float16, "cpu")
    check(q, k, v, torch.float16, mask=mask)


def test_relative_position_bias(backend):
    """A score_mod reading an aux table, with a block-sparse causal mask and GQA."""
    _, device = backend
    table = (torch.randn(4, 256, generator=torch.Generator().manual_seed(3)) * 0.5).to(device)
    q, k, v = make_qkv(1, 100, 100, 4, 2, 32, torch.float16, device)
    block_mask = flashtile.create_block_mask(flashtile.causal_mask, None, None, 100, 100, block_size=(32, 32),
                                             device=device)
    check(q, k, v, torch.float16, flashtile.causal_mask, score=rel_bias, block_mask=block_mask, aux=(table,),
          score_mod_grad=unit_grad)


def test_softcap_mod_dense_causal(backend):
    """A score_mod in the dense (not block-sparse) path, with causal, and its derivative."""
    _, device = backend
    q, k, v = make_qkv(2, 60, 80, 2, 1, 32, torch.float32, device)
    check(q, k, v, torch.float32, score=softcap_mod, score_mod_grad=softcap_grad, causal=True, softmax_scale=0.7)


def softcap_through_module(score, b, h, q_idx, kv_idx):
    return 5.0 * flex.tanh(score / 5.0)


def softcap_grad_through_module(score, b, h, q_idx, kv_idx):
    t = flex.tanh(score / 5.0)
    return 1.0 - t * t


def test_helpers_reached_through_a_module(backend):
    """A helper reached as a module attribute (flex.tanh) works in every form: the kernels, cpu.py and the reference
    (before: the PyTorch form called the @triton.jit function and failed), and gives what the builtin softcap gives."""
    _, device = backend
    q, k, v = make_qkv(1, 40, 50, 2, 2, 32, torch.float32, device)
    check(q, k, v, torch.float32, score=softcap_through_module, score_mod_grad=softcap_grad_through_module,
          causal=True)
    with torch.no_grad():
        torch.testing.assert_close(flashtile.attention(q, k, v, score_mod=softcap_through_module, causal=True),
                                   flashtile.flash_attn_func(q, k, v, softcap=5.0, causal=True), rtol=1e-5, atol=1e-5)


def test_alibi_mod_matches_builtin(backend):
    """ALiBi written as a score_mod gives flash_attn_func(alibi_slopes=...) (Sq == Sk: same alignment)."""
    _, device = backend
    slopes = torch.tensor([0.5, 0.125], device=device)
    q, k, v = make_qkv(1, 70, 70, 2, 2, 32, torch.float32, device)
    out = flashtile.attention(q, k, v, score_mod=alibi_mod, score_mod_grad=alibi_grad, aux=(slopes,))
    ref = flashtile.flash_attn_func(q, k, v, alibi_slopes=slopes)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    dout = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), dout), torch.autograd.grad(ref, (q, k, v), dout)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def hide_all(b, h, q_idx, kv_idx):
    return q_idx < 0


def full_causal_blocks(b, h, q_idx, kv_idx):
    return q_idx // 32 > kv_idx // 32


def test_strided_block_lists_give_the_contiguous_result(backend):
    """A block mask whose lists are views with a strided last dim (built by hand or with dataclasses.replace; the
    kernels read the index lists as ptr + i): forward and backward equal the contiguous mask's bit for bit."""
    _, device = backend
    block_mask = flashtile.create_block_mask(flashtile.causal_mask, None, None, 96, 96, block_size=(32, 32),
                                             device=device)
    lists = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices", "q_num_blocks", "q_indices",
             "full_q_num_blocks", "full_q_indices")
    views = dataclasses.replace(block_mask, **{name: strided(getattr(block_mask, name)) for name in lists})
    runs = []
    for mask in (block_mask, views):
        q, k, v = make_qkv(1, 96, 96, 2, 2, 32, torch.float32, device)
        out = flashtile.attention(q, k, v, block_mask=mask)
        out.backward(torch.ones_like(out))
        runs.append((out, q.grad, k.grad, v.grad))
    for want, got in zip(*runs):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_kernels_follow_the_block_lists(backend):
    """Full blocks skip the mask_mod, partial blocks evaluate it, empty blocks are never visited: with the block
    mask of causal_mask but a mask_mod that hides everything, exactly the full blocks stay visible."""
    name, device = backend
    if name == "cpu":
        pytest.skip("the CPU path evaluates the mask in every block (no block skipping)")
    q, k, v = make_qkv(1, 96, 96, 2, 2, 32, torch.float32, device)
    block_mask = flashtile.create_block_mask(flashtile.causal_mask, None, None, 96, 96, block_size=(32, 32),
                                             device=device)
    # causal_mask's block lists with another mask_mod (attention refuses the two as separate arguments)
    block_mask = dataclasses.replace(block_mask, mask_mod=Mod(hide_all))
    out = flashtile.attention(q, k, v, block_mask=block_mask)
    ref = flashtile.attention_ref(q, k, v, mask_mod=full_causal_blocks)
    assert torch.all(out[:, :32] == 0)  # the first query block has no full key block
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)


def test_create_block_mask_lists():
    """The lists match a direct block reduction of the dense mask, also when evaluated in small chunks."""
    dense = torch.zeros(2, 3, 100, 130, dtype=torch.bool)
    b, h = torch.arange(2).view(-1, 1, 1, 1), torch.arange(3).view(1, -1, 1, 1)
    qi, ki = torch.arange(100).view(1, 1, -1, 1), torch.arange(130).view(1, 1, 1, -1)
    dense |= per_head(b, h, qi, ki)
    padded = torch.zeros(2, 3, 128, 160, dtype=torch.bool)
    padded[..., :100, :130] = dense
    tiles = padded.view(2, 3, 4, 32, 5, 32)
    any_, all_ = tiles.any(5).any(3), tiles.all(5).all(3)
    for chunk in (1 << 24, 2000):
        block_mask_module._CHUNK_ELEMENTS = chunk
        try:
            bm = flashtile.create_block_mask(per_head, 2, 3, 100, 130, block_size=(32, 32), device="cpu")
        finally:
            block_mask_module._CHUNK_ELEMENTS = 1 << 24
        for num, idx, blocks in ((bm.kv_num_blocks, bm.kv_indices, any_ & ~all_),
                                 (bm.full_kv_num_blocks, bm.full_kv_indices, all_),
                                 (bm.q_num_blocks, bm.q_indices, (any_ & ~all_).transpose(-1, -2)),
                                 (bm.full_q_num_blocks, bm.full_q_indices, all_.transpose(-1, -2))):
            assert torch.equal(num, blocks.sum(-1).int())
            for pos in torch.nonzero(torch.ones(blocks.shape[:-1], dtype=torch.bool)).tolist():
                listed = sorted(idx[tuple(pos)][:num[tuple(pos)]].tolist())
                assert listed == torch.nonzero(blocks[tuple(pos)]).flatten().tolist()


def test_block_mask_density():
    bm = flashtile.create_block_mask(flashtile.dilated_mask(4, block=64), None, None, 1024, 1024,
                                     block_size=(64, 64), device="cpu")
    assert bm.density() == 0.25 and bm.kv_num_blocks.sum() == 0  # every visited block is full
    causal = flashtile.create_block_mask(flashtile.causal_mask, None, None, 1024, 1024, device="cpu")
    assert causal.full_kv_num_blocks.sum() == 28 and causal.kv_num_blocks.sum() == 8


def test_mod_torch_form():
    """A Mod called on tensors runs its PyTorch form: tl.load on aux tensors becomes indexing."""
    ids = torch.tensor([0, 0, 1, 1, 1])
    mask = flashtile.document_mask(ids)
    got = mask(0, 0, torch.arange(5).view(-1, 1), torch.arange(5).view(1, -1))
    assert torch.equal(got, ids.view(-1, 1) == ids.view(1, -1))
    got = flashtile.causal_mask(0, 0, torch.tensor([3]), torch.tensor([2, 4]))
    assert torch.equal(got, torch.tensor([True, False]))


@pytest.mark.parametrize("param", [0, 1, 7, 24, 2**30, 2**31 + 5])
def test_ready_made_masks_keep_their_definitions(param):
    """Windows and block diagonals are written as per-row bounds compared with kv_idx (the kernels' cheap form):
    the same masks as the definitions on positions, wide parameters included."""
    q_idx, kv_idx = torch.arange(200).view(-1, 1), torch.arange(200).view(1, -1)
    diff = q_idx - kv_idx
    got = flashtile.sliding_window_mask(param)(0, 0, q_idx, kv_idx)
    assert torch.equal(got, (diff >= 0) & (diff <= param))
    got = flashtile.sliding_window_mask(param, causal=False)(0, 0, q_idx, kv_idx)
    assert torch.equal(got, diff.abs() <= param)
    if param > 0:
        got = flashtile.block_diagonal_mask(param)(0, 0, q_idx, kv_idx)
        assert torch.equal(got, q_idx // param == kv_idx // param)


# Bad input: a clear error before any kernel runs.

def _qkv(seqlen=64):
    return make_qkv(1, seqlen, seqlen, 2, 2, 16, torch.float32, "cpu")


def test_wrong_signature():
    q, k, v = _qkv()

    def three(b, h, q_idx):
        return q_idx >= 0

    with pytest.raises(TypeError, match=r"mask_mod must take \(b, h, q_idx, kv_idx\).*three\(b, h, q_idx\)"):
        flashtile.attention(q, k, v, mask_mod=three)
    with pytest.raises(TypeError, match="one argument per aux tensor"):
        flashtile.attention(q, k, v, score_mod=rel_bias, score_mod_grad=unit_grad)  # the table is missing
    with pytest.raises(TypeError, match="not lambda"):
        flashtile.attention(q, k, v, mask_mod=lambda b, h, i, j: i >= j)
    with pytest.raises(TypeError, match="mask_mod must be a function"):
        flashtile.attention(q, k, v, mask_mod=3)


def test_block_mask_for_another_shape():
    q, k, v = _qkv()
    bm = flashtile.create_block_mask(flashtile.causal_mask, None, None, 64, 96, block_size=(32, 32), device="cpu")
    with pytest.raises(ValueError, match=r"block_mask was built for .*\(1, 1, 64, 96\).*\(1, 2, 64, 64\)"):
        flashtile.attention(q, k, v, block_mask=bm)
    bm = flashtile.create_block_mask(flashtile.causal_mask, 1, 3, 64, 64, block_size=(32, 32), device="cpu")
    with pytest.raises(ValueError, match="block_mask was built for"):
        flashtile.attention(q, k, v, block_mask=bm)
    with pytest.raises(TypeError, match="block_mask must be a flashtile BlockMask"):
        flashtile.attention(q, k, v, block_mask=torch.ones(1))
    bm = flashtile.create_block_mask(flashtile.causal_mask, None, None, 64, 64, block_size=(32, 32), device="cpu")
    with pytest.raises(ValueError, match="causal=True cannot be combined with block_mask"):
        flashtile.attention(q, k, v, block_mask=bm, causal=True)


def test_aux_on_wrong_device():
    q, k, v = _qkv()
    table = torch.zeros(2, 256, device="meta")
    with pytest.raises(ValueError, match="aux tensor 0 of score_mod is on meta but q is on cpu"):
        flashtile.attention(q, k, v, score_mod=rel_bias, score_mod_grad=unit_grad, aux=(table,))
    with pytest.raises(ValueError, match="aux tensor 0 of the mask is on meta"):
        flashtile.create_block_mask(flashtile.document_mask(torch.zeros(64, dtype=torch.int64, device="meta")),
                                    None, None, 64, 64, device="cpu")
    with pytest.raises(ValueError, match="at most 4"):
        flashtile.attention(q, k, v, mask_mod=flashtile.and_masks(*[flashtile.document_mask(torch.zeros(64).long())
                                                                   for _ in range(5)]))


def test_missing_score_mod_grad():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="score_mod needs score_mod_grad"):
        flashtile.attention(q, k, v, score_mod=softcap_mod)
    with torch.no_grad():  # no gradient needed: fine
        flashtile.attention(q, k, v, score_mod=softcap_mod)
    with pytest.raises(ValueError, match="score_mod_grad was given without a score_mod"):
        flashtile.attention(q, k, v, score_mod_grad=softcap_grad)


def test_bad_block_size_and_dims():
    with pytest.raises(ValueError, match="powers of two >= 16"):
        flashtile.create_block_mask(flashtile.causal_mask, None, None, 64, 64, block_size=(48, 64), device="cpu")
    with pytest.raises(ValueError, match="Sq must be an int >= 1"):
        flashtile.create_block_mask(flashtile.causal_mask, None, None, 0, 64, device="cpu")
    for dims in ((0, None), (None, 0)):  # 0 is not None: it was taken as 1 and skipped the broadcast check
        with pytest.raises(ValueError, match="must be an int >= 1, got 0"):
            flashtile.create_block_mask(flashtile.causal_mask, *dims, 64, 64, device="cpu")
    with pytest.raises(ValueError, match="doc_ids must be an integer tensor"):
        flashtile.document_mask(torch.zeros(4, 4, 4))
    with pytest.raises(ValueError, match="window must be an int >= 0"):
        flashtile.sliding_window_mask(-3)



def per_head_window(b, h, q_idx, kv_idx):
    return q_idx - kv_idx <= 4 * h


def allow_all(b, h, q_idx, kv_idx):
    return True


def test_constant_mask_broadcasts():
    """A mask returning a constant (a 0-dim result) is the same for every b and h: accepted with B, H None."""
    mask = flashtile.create_block_mask(allow_all, None, None, 40, 40, block_size=(16, 16), device="cpu")
    assert mask.shape == (1, 1, 40, 40)


def table_bias(score, b, h, q_idx, kv_idx, table):
    return score + tl.load(table + h * 16 + kv_idx)


def _returns_none(score, b, h, q_idx, kv_idx):
    return None


def _returns_a_tuple(score, b, h, q_idx, kv_idx):
    return score, score


def _returns_nothing(score, b, h, q_idx, kv_idx):
    score = score * 2


def _mask_returns_bare(b, h, q_idx, kv_idx):
    if q_idx > 0:
        return q_idx >= kv_idx
    return


def _nested_bare_return_is_fine(score, b, h, q_idx, kv_idx):
    def unused():
        return
    return score


@pytest.mark.parametrize("mods,match", [
    (dict(score_mod=_returns_none), "score_mod _returns_none returns None"),
    (dict(score_mod=_returns_a_tuple), "score_mod _returns_a_tuple returns a tuple of 2"),
    (dict(score_mod=_returns_nothing), "score_mod _returns_nothing has no return statement: it must return the new "
                                       "score"),
    (dict(mask_mod=_mask_returns_bare), "mask_mod _mask_returns_bare returns None"),
], ids=["none", "tuple", "no-return", "mask-bare-return"])
def test_mods_must_return_one_value(mods, match):
    """A mod that returns None, a tuple or nothing gets a TypeError that says so (before: the Triton compiler's or the
    PyTorch form's unrelated error). Read from its source; a nested function's bare return is its own."""
    q = torch.randn(1, 8, 2, 16)
    with pytest.raises(TypeError, match=match):
        flashtile.attention(q, q, q, **mods)
    assert Mod(_nested_bare_return_is_fine, base=("score", "b", "h", "q_idx", "kv_idx"), name="score_mod")


def _float_mask(b, h, q_idx, kv_idx):
    return (q_idx >= kv_idx).to(tl.float32)


def test_mask_mod_must_return_booleans(monkeypatch):
    """A mask_mod that returns numbers is refused by cpu.py and create_block_mask (before: read as nonzero = visible
    there, while the kernels fail on it with Triton's type error)."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # cpu.py
    q = torch.randn(1, 8, 2, 16)
    with pytest.raises(TypeError, match=r"mask_mod must return booleans .*, got torch.float32"):
        flashtile.attention(q, q, q, mask_mod=_float_mask)
    with pytest.raises(TypeError, match=r"mask_fn must return booleans .*, got torch.float32"):
        flashtile.create_block_mask(_float_mask, 1, 2, 8, 8, block_size=(16, 16), device="cpu")


def test_score_mod_aux_that_requires_grad_is_refused():
    """No gradient flows into aux tensors: one that requires grad (a learned table) is refused while grad mode is
    on, instead of leaving its .grad None (or the output off the graph when only it required grad)."""
    q, k, v = _qkv()
    table = torch.zeros(2 * TABLE_SIZE, requires_grad=True)
    for inputs in ((q, k, v), tuple(t.detach() for t in (q, k, v))):
        with pytest.raises(ValueError, match="no gradient flows into aux tensors"):
            flashtile.attention(*inputs, score_mod=rel_bias, score_mod_grad=unit_grad, aux=table)
    with torch.no_grad():
        flashtile.attention(q, k, v, score_mod=rel_bias, aux=table)
    flashtile.attention(q, k, v, score_mod=rel_bias, score_mod_grad=unit_grad, aux=table.detach())


def test_aux_must_be_contiguous():
    """The kernels read an aux tensor's memory flat (tl.load(aux + i)), so a transposed view or an expanded tensor
    would be read in the wrong order or past its storage: refused with the fix, not read wrongly."""
    q, k, v = (torch.randn(1, 16, 2, 16) for _ in range(3))
    table = torch.randn(16, 2).t()
    with pytest.raises(ValueError, match=r"aux\[0\] of score_mod must be contiguous"):
        flashtile.attention(q, k, v, score_mod=table_bias, aux=table)
    with pytest.raises(ValueError, match=r"aux\[0\] of mask_fn must be contiguous"):
        flashtile.create_block_mask(per_head_window_table, None, None, 16, 16, block_size=(16, 16), device="cpu",
                                    aux=torch.tensor([3]).expand(2))
    with torch.no_grad():
        flashtile.attention(q, k, v, score_mod=table_bias, aux=table.contiguous())  # fine


def per_head_window_table(b, h, q_idx, kv_idx, widths):
    return q_idx - kv_idx <= tl.load(widths + h)


def constant_score(score, b, h, q_idx, kv_idx):
    return 0.0


def distance_score(score, b, h, q_idx, kv_idx):
    return q_idx - kv_idx  # an integer tile without the score


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_score_mod_may_ignore_the_score(backend, causal):
    """A score_mod returning a constant or a function of the indices alone replaces every score (broadcast to the
    tile): the CPU path refused the shape, the kernels' row reductions the 0-dim constant."""
    _, device = backend
    q, k, v = (torch.randn(1, 40, 2, 16, device=device) for _ in range(3))
    rows, cols = torch.arange(40, device=device)[:, None], torch.arange(40, device=device)[None]
    for mod, scores in ((constant_score, torch.zeros(40, 40, device=device)), (distance_score, (rows - cols).float())):
        if causal:
            scores = scores.masked_fill(cols > rows, float("-inf"))
        want = torch.einsum("qk,bkhd->bqhd", torch.softmax(scores.double(), -1), v.double())
        with torch.no_grad():
            got = flashtile.attention(q, k, v, score_mod=mod, causal=causal)
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5, msg=lambda m, mod=mod: f"{mod}: {m}")


def late_keys_score(score, b, h, q_idx, kv_idx):
    return tl.where((kv_idx >= 96) & (q_idx >= 4), score, float("-inf"))


def late_keys_grad(score, b, h, q_idx, kv_idx):
    return tl.where((kv_idx >= 96) & (q_idx >= 4), 1.0, 0.0)


def test_score_mod_of_minus_inf_hides_whole_blocks(backend):
    """A score_mod that masks by returning -inf (FlexAttention's idiom) hides whole key blocks from every row, and
    every key from rows 0-3: blocks without masks must not take exp2(-inf - -inf) = NaN. As a -inf bias does."""
    _, device = backend
    q, k, v = make_qkv(1, 48, 128, 2, 1, 16, torch.float32, device)
    out, lse = flashtile.attention(q, k, v, score_mod=late_keys_score, score_mod_grad=late_keys_grad,
                                   return_lse=True)
    assert torch.all(out[:, :4] == 0) and torch.all(lse[..., :4] == float("-inf"))
    bias = torch.zeros(48, 128, device=device)
    bias[:, :96] = float("-inf")
    bias[:4] = float("-inf")
    check_rows_from_4(out, q, k, v, bias)


def test_mask_that_depends_on_b_or_h_needs_the_count():
    """B or H None with a mask that reads b or h would give silently wrong blocks: refused."""
    with pytest.raises(ValueError, match="H=None but the mask differs between h = 0 and h = 1"):
        flashtile.create_block_mask(per_head_window, 1, None, 64, 64, device="cpu")
    per_batch = flashtile.document_mask(torch.stack([DOC_IDS, DOC_IDS.flip(0)]))
    with pytest.raises(ValueError, match="B=None"):
        flashtile.create_block_mask(per_batch, None, 1, 90, 90, device="cpu")
    flashtile.create_block_mask(per_head_window, 1, 2, 64, 64, device="cpu")  # with the counts: fine
    flashtile.create_block_mask(per_batch, 2, None, 90, 90, device="cpu")

# The GPU tier (pytest -m gpu): bf16, realistic block sizes (128 x 128) and long sequences.

GPU_MASKS = {
    "causal": lambda ids: flashtile.causal_mask,
    "window256": lambda ids: flashtile.sliding_window_mask(256),
    "document-causal": lambda ids: flashtile.and_masks(flashtile.causal_mask, flashtile.document_mask(ids)),
    "prefix-lm": lambda ids: flashtile.prefix_lm_mask(300),
    "dilated4": lambda ids: flashtile.dilated_mask(4),
    "strided": lambda ids: flashtile.strided_mask(5),
}


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128], ids=["d64", "d128"])
@pytest.mark.parametrize("name", list(GPU_MASKS))
def test_gpu_masks(name, head_dim):
    ids = (torch.arange(1500, device="cuda") * 7 // 1500).to(torch.int32)  # 7 documents
    q, k, v = make_qkv(2, 1500, 1500, 8, 2, head_dim, torch.bfloat16, "cuda")
    mask = GPU_MASKS[name](ids)
    block_mask = flashtile.create_block_mask(mask, None, None, 1500, 1500)
    check(q, k, v, torch.bfloat16, mask, block_mask=block_mask)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_gpu_score_mods(dtype):
    table = torch.randn(8, 256, device="cuda") * 0.5
    q, k, v = make_qkv(1, 1000, 1000, 8, 2, 128, dtype, "cuda")
    block_mask = flashtile.create_block_mask(flashtile.causal_mask, None, None, 1000, 1000)
    check(q, k, v, dtype, flashtile.causal_mask, score=rel_bias, block_mask=block_mask, aux=(table,),
          score_mod_grad=unit_grad)
    check(q, k, v, dtype, score=softcap_mod, score_mod_grad=softcap_grad, causal=True)


@pytest.mark.gpu
def test_gpu_block_sparse_causal_equals_builtin_causal():
    """The same causal attention through block lists and through the built-in loop bounds."""
    q, k, v = make_qkv(1, 8192, 8192, 16, 16, 128, torch.bfloat16, "cuda")
    block_mask = flashtile.create_block_mask(flashtile.causal_mask, None, None, 8192, 8192)
    out = flashtile.attention(q, k, v, block_mask=block_mask)
    ref = flashtile.flash_attn_func(q, k, v, causal=True)
    assert (out.float() - ref.float()).abs().max().item() < 2e-2
    dout = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), dout), torch.autograd.grad(ref, (q, k, v), dout)):
        assert (a.float() - b.float()).abs().max().item() <= 2e-2 * max(1.0, b.float().abs().max().item())


@pytest.mark.gpu
def test_gpu_64k_sliding_window():
    """64K tokens, a 1K sliding window: runs in O(N) memory; rows checked against the reference on their keys."""
    seqlen, window, heads = 65536, 1024, 8
    q, k, v = make_qkv(1, seqlen, seqlen, heads, heads, 64, torch.bfloat16, "cuda")
    mask = flashtile.sliding_window_mask(window)
    block_mask = flashtile.create_block_mask(mask, None, None, seqlen, seqlen)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = flashtile.attention(q, k, v, block_mask=block_mask)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    torch.cuda.synchronize()
    assert (torch.cuda.max_memory_allocated() - base) / 2**30 < 1.0
    assert all(torch.isfinite(g).all() for g in (out, dq, dk, dv))
    for r0 in (0, 40000):
        c0 = max(0, r0 - window)
        rows, keys = slice(r0, r0 + 128), slice(c0, r0 + 128)

        def shifted(b, h, q_idx, kv_idx, r0=r0, c0=c0):
            return mask(b, h, q_idx + r0, kv_idx + c0)

        ref = flashtile.attention_ref(q[:, rows].detach(), k[:, keys].detach(), v[:, keys].detach(),
                                      mask_mod=shifted)
        assert (out[:, rows].double() - ref).abs().max().item() < 2e-2


def test_mods_are_reused_across_calls():
    """Rebuilding the same masks (new document ids each step) reuses the generated functions and adapters."""
    from flashtile.flex import mods

    ids_a, ids_b = torch.zeros(64, dtype=torch.int64), torch.ones(64, dtype=torch.int64)
    a = flashtile.and_masks(flashtile.causal_mask, flashtile.document_mask(ids_a))
    b = flashtile.and_masks(flashtile.causal_mask, flashtile.document_mask(ids_b))
    assert a.fn is b.fn and a.aux[0] is ids_a and b.aux[0] is ids_b
    assert mods.adapter(a, [ids_a]) is mods.adapter(b, [ids_b])
    assert Mod(softcap_mod, (), ("score", "b", "h", "q_idx", "kv_idx")).triton() is mods.triton_form(softcap_mod)


def test_mods_compile_under_distinct_names():
    """Triton inlines each called function under its module + qualified name + argument types and reuses
    the first body compiled under a name (the interpreter does not, so only the GPU showed it): a score_mod
    and its derivative, or two masks from one factory, must reach the kernels under distinct names."""
    from flashtile.flex import mods

    def get_full_name(fn):  # what Triton's code generator names fn by (a JITFunction copies these)
        py = mods.python_function(fn)
        return f"{py.__module__}.{py.__qualname__}"

    score = Mod(softcap_mod, (), mods.SCORE_ARGS, "score_mod")
    grad = Mod(softcap_grad, (), mods.SCORE_ARGS, "score_mod_grad")
    assert get_full_name(mods.adapter(score, [])) != get_full_name(mods.adapter(grad, []))
    both = flashtile.and_masks(flashtile.sliding_window_mask(4), flashtile.sliding_window_mask(9))
    inner = [both.fn.__globals__[f"F{i}"] for i in range(2)]
    assert get_full_name(inner[0]) != get_full_name(inner[1])
    same_name = [Mod(f).triton() for f in (flashtile.sliding_window_mask(3).fn, flashtile.sliding_window_mask(5).fn)]
    assert get_full_name(same_name[0]) != get_full_name(same_name[1])


def test_user_aux_and_mask_objects(backend):
    """The call's aux goes to the plain score_mod; document_mask keeps its own ids (two aux tensors in the kernel)."""
    _, device = backend
    table = (torch.randn(2, 256, generator=torch.Generator().manual_seed(5)) * 0.5).to(device)
    q, k, v = make_qkv(1, 70, 70, 2, 2, 16, torch.float32, device)
    mask = flashtile.document_mask(DOC_IDS[:70].to(device))
    check(q, k, v, torch.float32, mask, score=rel_bias, score_mod_grad=unit_grad, aux=table)
