"""The tolerance rule itself (tests/utils.assert_close_rule) and the fuzz's bounds on the cases the H200 found them
wrong on (docs/gpu-tests.md, session 45)."""
import pytest
import torch

import fuzz_cases
from utils import assert_close_rule


def test_floor_is_the_rounding_of_the_shifted_value():
    """A bf16 result equal to ref64 + shift rounded to bf16 passes where ref64 is 0 (PyTorch exact) and the shift is
    not: the floor is that value's rounding (fuzz seed 485: dq of rows with one key under dropout)."""
    ref64 = torch.zeros(64, dtype=torch.float64)
    shift = torch.linspace(-0.18, 0.18, 64, dtype=torch.float64)
    got = (ref64 + shift).to(torch.bfloat16)
    assert_close_rule("dq", got, ref64, ref64.to(torch.bfloat16), torch.bfloat16, shift)
    with pytest.raises(AssertionError, match="max error"):  # an ulp more than the rounding is still an error
        assert_close_rule("dq", got + 2e-3, ref64, ref64.to(torch.bfloat16), torch.bfloat16, shift)


def test_negative_slack_is_refused():
    ref64 = torch.zeros(4, dtype=torch.float64)
    with pytest.raises(AssertionError, match="negative slack"):
        assert_close_rule("dq", ref64.float(), ref64, ref64.float(), torch.float32, slack=-torch.ones(4).double())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_negative_scale_rows_with_one_key(dtype, monkeypatch):
    """Fuzz seed 771 in small: window (0, k) with more queries than keys leaves rows that see one key (dq = dk = 0
    in PyTorch), and a negative softmax scale; the design slack takes |scale| (it was negative, stricter than 0).
    On cpu.py (as the CPU backend of tests/conftest.backend): the bound is what is tested, not a kernel."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    case = fuzz_cases.Case(seed=771, varlen=False, seqlens_q=(40, 40), seqlens_k=(9, 9), heads_q=2, heads_kv=1,
                           head_dim=32, dtype=dtype, window=(0, 5), softmax_scale=-0.141)
    fuzz_cases.check(case, "cpu")
