"""Sliding windows, softcap and ALiBi, alone and combined with causal and GQA, forward and backward."""
import pytest
import torch

import flashtile
from test_attention import run_and_check
from utils import make_qkv

WINDOWS = [(16, 0), (8, 8), (0, 0), (40, -1), (-1, 5), (3, 70)]
SEQLENS = [(97, 97), (50, 130), (130, 50)]


@pytest.mark.parametrize("seqlen_q,seqlen_k", SEQLENS, ids=[f"q{a}-k{b}" for a, b in SEQLENS])
@pytest.mark.parametrize("window", WINDOWS, ids=[f"w{a}_{b}" for a, b in WINDOWS])
def test_window(backend, window, seqlen_q, seqlen_k):
    _, device = backend
    run_and_check(1, seqlen_q, seqlen_k, 2, 1, 32, False, torch.float16, device, window_size=window)


@pytest.mark.parametrize("window", [(16, 4), (-1, 3)], ids=["w16_4", "w-1_3"])
def test_window_with_causal(backend, window):
    """causal=True forces the right side to 0, as flash-attn does."""
    _, device = backend
    run_and_check(1, 90, 120, 2, 2, 32, True, torch.float16, device, window_size=window)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("softcap", [0.5, 30.0], ids=["cap0.5", "cap30"])
def test_softcap(backend, softcap, causal):
    _, device = backend
    run_and_check(2, 70, 90, 4, 2, 64, causal, torch.float32, device, softmax_scale=0.5, softcap=softcap)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("per_batch", [False, True], ids=["slopes-h", "slopes-bh"])
def test_alibi(backend, per_batch, causal):
    _, device = backend
    gen = torch.Generator().manual_seed(7)
    slopes = torch.rand((2, 4) if per_batch else (4,), generator=gen).to(device)
    run_and_check(2, 65, 80, 4, 2, 40, causal, torch.float16, device, alibi_slopes=slopes)


def test_everything_together(backend):
    _, device = backend
    slopes = torch.tensor([0.5, 0.25, 0.125], device=device)
    run_and_check(2, 77, 100, 3, 1, 48, True, torch.float32, device, window_size=(20, 10), softcap=5.0,
                  alibi_slopes=slopes)


def test_window_rows_without_keys(backend):
    """A window that leaves rows without keys gives 0 output, -inf lse and finite gradients."""
    _, device = backend
    q, k, v = make_qkv(1, 64, 16, 2, 2, 16, torch.float32, device)
    # With Sq - Sk = 48 and right = 0, rows i < 48 see nothing.
    out, lse, _ = flashtile.flash_attn_func(q, k, v, window_size=(4, 0), return_attn_probs=True)
    assert torch.all(out[:, :48] == 0) and torch.all(lse[:, :, :48] == float("-inf"))
    assert torch.isfinite(lse[:, :, 48:]).all()
    assert all(torch.isfinite(g).all() for g in torch.autograd.grad(out.sum(), (q, k, v)))


def test_window_skips_blocks(monkeypatch):
    """Work scales with the window: the CPU path visits only key blocks inside it."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    import flashtile.cpu as cpu_impl

    visited = []
    real = cpu_impl._Scores.__call__

    def spy(self, qb, kb, m0, m1, n0, n1):
        visited.append(n1 - n0)
        return real(self, qb, kb, m0, m1, n0, n1)

    monkeypatch.setattr(cpu_impl._Scores, "__call__", spy)
    q, k, v = make_qkv(1, 2048, 2048, 1, 1, 16, torch.float32, "cpu", requires_grad=False)
    flashtile.flash_attn_func(q, k, v, window_size=(100, 0))
    # 8 query blocks of 256 rows; a window of 100 keys reaches at most 2 key blocks each.
    assert sum(visited) <= 8 * 2 * cpu_impl.BLOCK_N
