"""The benchmark command: FLOP formulas, report writers, flag validation and a tiny CPU run."""
import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from flashtile.bench import __main__ as cli
from flashtile.bench import report, sweep
from flashtile.bench.flops import attention_flops, tflops
from flashtile.bench.providers import Provider
from flashtile.bench.timing import peak_memory_mb


def test_flops_known_values():
    assert attention_flops(1, 1, 1, 1, 1) == 4
    assert attention_flops(2, 16, 1024, 512, 64) == 4 * 2 * 16 * 1024 * 512 * 64
    # The papers' setup: 16K tokens, hidden 2048, seqlen 2048, head dim 64 -> B=8, H=32.
    assert attention_flops(8, 32, 2048, 2048, 64) == 4 * 8 * 32 * 2048 * 2048 * 64


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_flops_causal_and_modes(causal):
    fwd = attention_flops(4, 8, 1000, 1000, 128, causal=causal)
    assert fwd == 4 * 4 * 8 * 1000 * 1000 * 128 / (2 if causal else 1)
    assert attention_flops(4, 8, 1000, 1000, 128, causal, mode="bwd") == 2.5 * fwd
    assert attention_flops(4, 8, 1000, 1000, 128, causal, mode="fwd_bwd") == 3.5 * fwd


def test_flops_rejects_unknown_mode_and_tflops():
    with pytest.raises(ValueError, match="mode"):
        attention_flops(1, 1, 1, 1, 1, mode="sideways")
    assert tflops(2e12, 1000.0) == pytest.approx(2.0)
    assert tflops(1e12, None) is None


def _rec(provider, seqlen, mode, ms, mem, error=None):
    return dict(provider=provider, mode=mode, batch=1, seqlen_q=seqlen, seqlen_k=seqlen, heads_q=4,
                heads_kv=4, head_dim=64, causal=False, dtype="fp32", ms=ms,
                tflops=None if ms is None else 1.0 / ms, peak_mem_mb=mem, max_err=None if ms is None else 1e-6,
                error=error)


@pytest.fixture
def records():
    recs = []
    for mode in ("fwd", "bwd"):
        recs += [_rec("flashtile", 512, mode, 1.0, 2.0), _rec("standard", 512, mode, 4.0, 16.0),
                 _rec("sdpa-flash", 512, mode, 0.5, 1.0),
                 _rec("flashtile", 1024, mode, 2.0, 4.0),
                 _rec("standard", 1024, mode, None, None, "skipped: would need 9.0 GB (1.0 GB free)")]
    return report.annotate(recs)


def test_annotate_speedup_and_best_other(records):
    ours = next(r for r in records if r["provider"] == "flashtile" and r["seqlen_q"] == 512)
    assert ours["speedup_vs_standard"] == pytest.approx(4.0)
    assert ours["best_other"] == "sdpa-flash" and ours["vs_best_other"] == pytest.approx(0.5)
    long = next(r for r in records if r["provider"] == "flashtile" and r["seqlen_q"] == 1024)
    assert long["speedup_vs_standard"] is None and long["vs_best_other"] is None


def test_tables(records):
    table = report.format_table(records, "fwd")
    assert "== fwd ==" in table and "TFLOP/s" in table and "skipped: would need" in table
    assert table.count("\n") == 2 + 5  # title+header, rule, five rows
    probes = [dict(provider="standard", batch=1, heads_q=16, heads_kv=16, head_dim=128, causal=True,
                   dtype="bf16", cap=262144, max_seqlen=16384, stopped="at 32768: OutOfMemoryError: ...")]
    text = report.paper_tables(records, probes)
    assert "(a)" in text and "4.00x" in text
    assert "(b)" in text and "8.0x" in text and "std failed" in text
    assert "(c)" in text and "16384" in text


def test_json_and_csv_round_trip(records, tmp_path):
    meta = {"device": "cpu", "command": "python -m flashtile.bench"}
    report.write_json(tmp_path / "results.json", meta, records)
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["meta"] == meta and len(data["records"]) == len(records)
    for rec in data["records"]:
        assert set(report.RECORD_KEYS) <= set(rec)
    failed = [r for r in data["records"] if r["error"]]
    assert failed and all(r["ms"] is None and r["tflops"] is None for r in failed)

    report.write_csv(tmp_path / "results.csv", records)
    with open(tmp_path / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(records) and tuple(rows[0]) == report.RECORD_KEYS
    assert rows[0]["provider"] == "flashtile" and float(rows[0]["ms"]) == 1.0


def test_plots(records, tmp_path):
    pytest.importorskip("matplotlib")
    paths = report.write_plots(str(tmp_path), records, "test")
    assert [os.path.basename(p) for p in paths] == ["tflops.png", "memory.png"]
    assert all(os.path.getsize(p) > 0 for p in paths)


def test_plots_and_progress_degrade_without_optional_packages(records, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` raise ImportError
    with pytest.raises(ImportError):
        report.write_plots(str(tmp_path), records)
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    bar = sweep._progress(2)
    bar.set_postfix_str("flashtile B1")
    bar.update()
    bar.close()
    assert "[1/2] flashtile B1" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--providers", "flashtile,nope"], "unknown provider 'nope'"),
    (["--head-dims", "60"], "multiple of 8"),
    (["--head-dims", "264"], "multiple of 8"),
    (["--seqlens", "0,128"], "must be >= 1"),
    (["--seqlens", "128,abc"], "comma-separated integers"),
    (["--seqlens", "128,256", "--seqlens-k", "1,2,3"], "--seqlens-k needs one value or 2"),
    (["--modes", "fwd,sideways"], "unknown mode 'sideways'"),
    (["--dtype", "fp8"], "invalid choice"),
    (["--heads", "6", "--heads-kv", "4"], "must be a multiple of key/value heads"),
    (["--heads-kv", "2", "--gqa", "2"], "not allowed with"),
    (["--batch", "0"], "--batch must be >= 1"),
], ids=["provider", "head-dim-60", "head-dim-264", "seqlen-0", "seqlen-text", "seqlens-k-count", "mode",
        "dtype", "heads-kv", "kv-and-gqa", "batch-0"])
def test_bad_flags_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--device", "cpu", "--out", "unused", *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "usage:" in err and message in err


def test_int_list_accepts_k_suffix():
    assert cli._int_list("512,1k,16K") == [512, 1024, 16384]


class _Broken(Provider):
    name = "broken"
    needs_cuda = False

    def prepare(self, q, k, v, causal):
        raise RuntimeError("unsupported head dim\nsecond line")


class _Huge(_Broken):
    name = "huge"

    def predicted_bytes(self, *shape):
        return 1 << 60


def test_failures_become_record_errors():
    shape = sweep.Shape(1, 16, 16, 2, 2, 64, False, "fp32")
    inputs = sweep.make_inputs(shape, torch.device("cpu"))
    recs = sweep.measure(_Broken(), shape, inputs, ["fwd", "bwd"], torch.device("cpu"), 0, 1)
    assert [r["mode"] for r in recs] == ["fwd", "bwd"]
    assert all(r["error"] == "RuntimeError: unsupported head dim" and r["ms"] is None for r in recs)
    recs = sweep.measure(_Huge(), shape, inputs, ["fwd"], torch.device("cpu"), 0, 1)
    assert recs[0]["error"].startswith("skipped: would need")


def test_cpu_peak_memory_tracker():
    keep = torch.zeros(10)

    def fn():
        a = torch.ones(1 << 18)  # 1 MB of fp32
        b = a * 2  # another 1 MB, alive together with a
        keep.add_(1)  # in place on a pre-existing tensor: not an allocation
        del a, b
        torch.ones(1 << 17)  # 0.5 MB after the others were freed

    assert peak_memory_mb(fn, torch.device("cpu"), keep=(keep,)) == pytest.approx(2.0)


def test_cpu_run_end_to_end(tmp_path):
    """The command on the CPU path (flashtile.cpu, not the interpreter): both providers, small errors."""
    import flashtile

    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "FLASHTILE_POISON_OUTPUTS")}
    src = str(Path(flashtile.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([src, *filter(None, [env.get("PYTHONPATH")])])
    argv = ["--quick", "--device", "cpu", "--seqlens", "64,200", "--rep", "1", "--out", str(tmp_path),
            "--no-plots"]
    proc = subprocess.run([sys.executable, "-m", "flashtile.bench", *argv], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "skip sdpa-flash: needs a CUDA GPU" in proc.stdout
    assert "== fwd ==" in proc.stdout and "== bwd ==" in proc.stdout and "(a) speedup" in proc.stdout
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["meta"]["device"] == "cpu" and "--quick" in data["meta"]["command"]
    by_provider = {}
    for rec in data["records"]:
        by_provider.setdefault(rec["provider"], []).append(rec)
    assert set(by_provider) == {"flashtile", "standard"}
    for recs in by_provider.values():
        assert len(recs) == 2 * 2 * 2  # seqlens x causal x modes
        for rec in recs:
            assert rec["error"] is None, rec
            assert rec["ms"] > 0 and rec["tflops"] > 0 and rec["peak_mem_mb"] > 0
            assert rec["max_err"] < 1e-4
    assert (tmp_path / "results.csv").exists() and not (tmp_path / "tflops.png").exists()
