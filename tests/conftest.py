"""Test setup: without a GPU, Triton kernels run through the interpreter on CPU tensors.

TRITON_INTERPRET must be set before triton kernels are defined, i.e. before flashtile is imported.
Outputs are NaN-poisoned before every kernel so unwritten elements fail the comparisons.
"""
import os

import pytest
import torch

HAS_GPU = torch.cuda.is_available()
if not HAS_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ["FLASHTILE_POISON_OUTPUTS"] = "1"
from flashtile import ops  # noqa: E402 (after TRITON_INTERPRET is set)
from flashtile.runtime import interpreter_active  # noqa: E402

if interpreter_active():
    # Define every kernel now, for the interpreter: the launcher modules are imported on first use (ops._launch),
    # and a first use inside a test that sets TRITON_INTERPRET=0 (the cpu.py backend, torch.compile tests) would
    # define the KV-cache kernels as compiled ones, which later interpreter tests in that worker cannot run.
    ops._launch()

DEVICE = "cuda" if HAS_GPU else "cpu"


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (the GPU tier)")
    for item in items:
        if "gpu" in item.keywords and not HAS_GPU:
            item.add_marker(skip_gpu)


@pytest.fixture(params=["triton", "cpu"])
def backend(request, monkeypatch):
    """Which implementation runs: the Triton kernels (GPU, or the interpreter on CPU) or flashtile.cpu."""
    if request.param == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        return "cpu", "cpu"
    return "triton", DEVICE


@pytest.fixture(autouse=True)
def _no_launch_plans():
    """Each test starts without launch plans (flashtile/plans.py): a replayed call skips the launcher functions
    that tests wrap (record_calls) or patch to see which path a call took."""
    from flashtile import plans
    plans.clear()


@pytest.fixture
def as_if_hopper(monkeypatch):
    """gluon_supported's device and interpreter checks passed on CPU tensors (nothing is launched): the Gluon
    forward's support-rule and dispatch tests (test_gluon_bias.py, test_gluon_dropout.py, test_gluon_varlen.py)."""
    from flashtile import gluon_launch

    monkeypatch.setattr(gluon_launch, "_disabled", None)
    monkeypatch.setattr(gluon_launch, "_supported_device", lambda *tensors: True)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
