"""benchmarks/gluon_check.py's A/B timing of variants (CPU: the timer and the kernels replaced by recorders)."""
from pathlib import Path

import pytest
import torch


@pytest.fixture
def gluon_check(monkeypatch):
    monkeypatch.setenv("FLASHTILE_GLUON", "0")  # what the script sets on import; restored after the test
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "benchmarks"))
    pytest.importorskip("triton.experimental.gluon", reason="gluon_launch needs triton's Gluon")
    import gluon_check
    return gluon_check


def _run(gluon_check, monkeypatch, fake_ms):
    """variant_feature_times of "default" and "default-lr" with fake_ms as the timer and no feature arguments: the
    lines it says and the rows it times."""
    lines = []
    monkeypatch.setattr(gluon_check, "_ms", fake_ms)
    monkeypatch.setattr(gluon_check, "feature_args", lambda spec, *args: {})
    monkeypatch.setattr(gluon_check, "say", lines.append)
    q = torch.empty(2, 256, 4, 64)
    gluon_check.variant_feature_times(q, q, q, 0.125, ["default", "default-lr"])
    return lines, gluon_check.VARIANT_FEATURE_ROWS


def test_variant_feature_times_interleaves_the_variants(gluon_check, monkeypatch):
    """Every row is timed with each variant in turn, the order reversed in the second round, and each variant's mean
    over the rounds is reported against the first variant's plain / causal mean."""
    order = []
    clock = iter(range(1, 1000))  # a drifting clock: each timing takes longer than the one before

    def fake_ms(fn):
        order.append((fn.args[4], fn.keywords["variant"]))
        return float(next(clock))

    lines, rows = _run(gluon_check, monkeypatch, fake_ms)
    assert order[:4] == [(False, "default"), (False, "default-lr"), (False, "default-lr"), (False, "default")]
    assert len(order) == 4 * len(rows)
    # A linear drift lands on both variants alike: the same mean for each row (plain: (1 + 4) / 2 = (2 + 3) / 2).
    times = [line for line in lines if line.startswith("TIME")]
    assert len(times) == 2 * len(rows)
    assert all("1.000x" in line for line in times if line.split()[6] in ("plain", "causal"))
    assert "2.500 ms" in times[0] and "(rounds 1.000 / 4.000)" in times[0]
    assert "(rounds 2.000 / 3.000)" in times[len(rows)]


def test_variant_feature_times_reports_a_failing_variant_once(gluon_check, monkeypatch):
    def fake_ms(fn):
        if fn.keywords["variant"] == "default-lr":
            raise RuntimeError("no kernel")
        return 1.0

    lines, rows = _run(gluon_check, monkeypatch, fake_ms)
    assert sum(line.startswith("ERROR") for line in lines) == len(rows)  # one per row, not one per round
    assert sum(line.startswith("TIME") for line in lines) == len(rows)
