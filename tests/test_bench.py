"""The benchmark command: FLOP formulas, report writers, flag validation and a tiny CPU run."""
import csv
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from flashtile.bench import __main__ as cli
from flashtile.bench import features, report, sweep
from flashtile.bench.flops import attention_flops, tflops
from flashtile.bench.providers import PROVIDERS, FlashAttnPackage, Provider
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


@pytest.mark.parametrize("sq, sk", [(1, 1), (7, 7), (5, 13), (13, 5), (16, 40)])
@pytest.mark.parametrize("window", [(0, 0), (3, 0), (2, 5), (-1, 4), (4, -1), (20, 20), (-1, 0)])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_flops_window_counts_visible_pairs(sq, sk, window, causal):
    rows = torch.arange(sq).unsqueeze(1) + (sk - sq)  # bottom-right aligned, as attention_ref
    cols = torch.arange(sk).unsqueeze(0)
    left, right = window[0], 0 if causal else window[1]
    visible = torch.ones(sq, sk, dtype=torch.bool)
    if right >= 0:
        visible &= cols <= rows + right
    if left >= 0:
        visible &= cols >= rows - left
    pairs = visible.sum().item()
    expect = sq * sk / 2 if causal and left < 0 else pairs  # plain causal keeps the papers' half
    assert attention_flops(2, 3, sq, sk, 8, causal, "fwd", window) == 4 * 2 * 3 * expect * 8
    assert attention_flops(2, 3, sq, sk, 8, causal, "fwd_bwd", window) == 3.5 * 4 * 2 * 3 * expect * 8


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


@pytest.mark.parametrize("spec, canon, window, softcap, alibi", [
    ("none", "none", (-1, -1), 0.0, False),
    (" Window:1024:0 ", "window:1024:0", (1024, 0), 0.0, False),
    ("window:-1:8", "window:-1:8", (-1, 8), 0.0, False),
    ("softcap:30.0", "softcap:30", (-1, -1), 30.0, False),
    ("alibi", "alibi", (-1, -1), 0.0, True),
    ("window:512:0+softcap:30+alibi", "window:512:0+softcap:30+alibi", (512, 0), 30.0, True),
])
def test_feature_spec_parsing(spec, canon, window, softcap, alibi):
    feature = features.parse(spec)
    assert (feature.spec, feature.window_size, feature.softcap, feature.alibi) == (canon, window, softcap, alibi)
    assert features.parse(feature.spec) == feature
    assert cli._feature(spec) == canon


@pytest.mark.parametrize("spec, message", [
    ("window:10", "window takes two values"),
    ("window:a:0", "window LEFT must be an integer"),
    ("window:0:-2", "window RIGHT must be >= -1"),
    ("window:-1:-1", "use 'none'"),
    ("softcap:0", "finite number > 0"),
    ("softcap:inf", "finite number > 0"),
    ("softcap", "finite number > 0"),
    ("alibi:2", "alibi takes no values"),
    ("none+alibi", "cannot be combined"),
    ("window:1:0+window:2:0", "appears twice"),
    ("dropout:1", "0 < P < 1"),
    ("dropout", "0 < P < 1"),
    ("sink:1", "sink takes no values"),
    ("bias+sink+bias", "appears twice"),
    ("rope", "unknown feature 'rope'"),
])
def test_bad_feature_specs(spec, message):
    with pytest.raises(ValueError, match=message):
        features.parse(spec)
    with pytest.raises(SystemExit):
        cli.main(["--device", "cpu", "--out", "unused", "--feature", spec])


def test_alibi_slopes():
    assert features.alibi_slopes(4).tolist() == [0.25, 0.0625, 0.015625, 0.00390625]
    twelve = features.alibi_slopes(12)  # 8 geometric slopes, then every other one of 16
    assert twelve.dtype == torch.float32 and twelve.shape == (12,)
    assert twelve[8].item() == pytest.approx(2 ** -0.5) and twelve[9].item() == pytest.approx(2 ** -1.5)


@pytest.mark.parametrize("spec", ["window:7:3", "window:-1:2", "window:5:-1+alibi", "window:10:0+softcap:3+alibi"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_flex_mods_match_reference(spec, causal):
    flex_attention = pytest.importorskip("torch.nn.attention.flex_attention").flex_attention
    from flashtile.bench import flex
    from flashtile.reference import attention_ref

    feature, heads, sq, sk = features.parse(spec), 4, 40, 100
    q, k, v = (torch.randn(1, s, heads, 16, dtype=torch.float64) for s in (sq, sk, sk))
    block_mask = flex.block_mask_for(sq, sk, causal, feature, "cpu")
    score_mod = flex.score_mod_for(sq, sk, feature, features.alibi_slopes(heads))
    with warnings.catch_warnings():  # eager flex warns (once) that it is unfused
        warnings.simplefilter("ignore", UserWarning)
        out = flex_attention(*(x.transpose(1, 2) for x in (q, k, v)), score_mod=score_mod, block_mask=block_mask)
    ref = attention_ref(q, k, v, causal=causal, **feature.kwargs(heads, "cpu"))
    torch.testing.assert_close(out.transpose(1, 2), ref)


def test_unsupported_features_are_skips(monkeypatch):
    shape = sweep.Shape(1, 16, 16, 2, 2, 64, False, "fp32", "softcap:30")
    inputs = sweep.make_inputs(shape, torch.device("cpu"))
    recs = sweep.measure(PROVIDERS["sdpa-flash"], shape, inputs, ["fwd"], torch.device("cpu"), 0, 1)
    assert recs[0]["error"] == "skipped: softcap not supported by SDPA" and recs[0]["features"] == "softcap:30"
    assert PROVIDERS["sdpa-cudnn"].unsupported(features.parse("none")) is None

    calls = []
    fake = type(sys)("fake_fa4")
    fake.flash_attn_func = lambda q, k, v, softmax_scale=None, causal=False, window_size=(None, None), \
        softcap=0.0: calls.append(window_size) or q
    monkeypatch.setitem(sys.modules, "fake_fa4", fake)
    fa4 = FlashAttnPackage("fa4", "fake_fa4")
    reason = fa4.unsupported(features.parse("window:8:0+alibi"))
    assert reason == "fake_fa4.flash_attn_func does not accept alibi_slopes"
    assert fa4.unsupported(features.parse("window:8:0+softcap:5")) is None
    fa4.prepare(*inputs, False, features.parse("window:-1:4")).fn()
    assert calls == [(None, 4)]  # flash-attn 4 spells unbounded None


def test_dropout_sink_bias_features(tmp_path):
    """The features flashtile has beyond the others: parsed, passed to flash_attn_func, the accuracy check
    rebuilds the sink and bias slice (and skips dropout), and the other providers decline them."""
    feature = features.parse("dropout:0.1+sink+bias")
    assert (feature.spec, feature.dropout, feature.sink, feature.bias) == ("dropout:0.1+sink+bias", 0.1, True, True)
    assert feature.parts() == ["dropout", "sink", "bias"] and not feature.window_only
    for name in ("standard", "flex", "sdpa-cudnn"):
        assert PROVIDERS[name].unsupported(feature)
    shape = sweep.Shape(1, 40, 70, 4, 2, 16, True, "fp32")
    q, k, v = sweep.make_inputs(shape, torch.device("cpu"))
    for spec in ("sink+bias", "dropout:0.3"):
        prep = PROVIDERS["flashtile"].prepare(q, k, v, True, features.parse(spec))
        out = prep.fn()
        err = sweep.max_error(out.detach(), q, k, v, True, features.parse(spec))
        assert (err is None) == (spec == "dropout:0.3") and (err is None or err < 1e-5), (spec, err)
        torch.autograd.grad(out, prep.inputs, torch.ones_like(out))


def test_varlen_provider_equals_dense():
    """flashtile-varlen packs the batch into equal-length sequences: the same outputs as the dense call."""
    shape = sweep.Shape(3, 40, 70, 4, 2, 16, True, "fp32")
    q, k, v = sweep.make_inputs(shape, torch.device("cpu"))
    feature = features.parse("window:20:0+bias")
    dense, packed = (PROVIDERS[name].prepare(q, k, v, True, feature) for name in ("flashtile", "flashtile-varlen"))
    out = packed.to_bshd(packed.fn())
    assert out.shape == q.shape
    torch.testing.assert_close(out, dense.fn(), atol=1e-5, rtol=1e-5)


def test_standard_memory_prediction_covers_measured_peak():
    shape = sweep.Shape(1, 256, 256, 2, 2, 64, False, "fp32")
    q, k, v = sweep.make_inputs(shape, torch.device("cpu"))
    for spec in ("none", "softcap:30+alibi+window:64:0"):
        feature = features.parse(spec)
        prep = PROVIDERS["standard"].prepare(q, k, v, False, feature)
        dout = torch.randn_like(q)
        peak = peak_memory_mb(lambda: torch.autograd.grad(prep.fn(), prep.inputs, dout), torch.device("cpu"),
                              (*prep.inputs, dout))
        predicted = PROVIDERS["standard"].predicted_bytes(1, 2, 256, 256, 4, feature) / 2**20
        assert peak <= predicted < 1.35 * peak, (spec, peak, predicted)


def test_feature_tables(records):
    assert report.feature_summaries(records) == ""
    recs = []
    for spec, ms in (("none", 2.0), ("window:64:0", 1.0), ("window:16:0", 0.5), ("softcap:30+alibi", 2.2)):
        rec = _rec("flashtile", 512, "fwd", ms, 1.0)
        recs.append(dict(rec, features=spec))
    text = report.feature_summaries(report.annotate(recs))
    assert "feature cost for flashtile" in text and "0.50x" in text and "1.10x" in text
    scaling = text[text.index("window scaling"):]
    assert scaling.index("16:0") < scaling.index("64:0") < scaling.index("full") and "0.500" in scaling
    table = report.format_table(recs, "fwd")
    assert "features" in table and "softcap:30+alibi" in table


class _Broken(Provider):
    name = "broken"
    needs_cuda = False

    def prepare(self, q, k, v, causal, feature=None):
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


def _run_cli(argv):
    """``python -m flashtile.bench argv`` on the CPU path (flashtile.cpu, not the interpreter)."""
    import flashtile

    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "FLASHTILE_POISON_OUTPUTS")}
    src = str(Path(flashtile.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([src, *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.run([sys.executable, "-m", "flashtile.bench", "--device", "cpu", "--rep", "1", *argv],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_cpu_run_end_to_end(tmp_path):
    """The command on the CPU: both providers, small errors."""
    proc = _run_cli(["--quick", "--seqlens", "64,200", "--out", str(tmp_path), "--no-plots"])
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


def test_cpu_run_with_features(tmp_path):
    """Three feature settings on one Sq != Sk shape: records carry them, errors stay small, cost table prints."""
    specs = ["none", "window:64:0", "softcap:30+alibi"]
    proc = _run_cli(["--quick", "--seqlens", "200", "--seqlens-k", "256", "--causal", "1", "--out", str(tmp_path),
                     "--no-plots", *(a for spec in specs for a in ("--feature", spec))])
    assert "feature cost for flashtile" in proc.stdout and "window scaling" not in proc.stdout
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["meta"]["config"]["features"] == specs
    recs = data["records"]
    assert sorted(r["features"] for r in recs) == sorted(specs * 2 * 2)  # providers x modes
    for rec in recs:
        assert rec["error"] is None and rec["max_err"] < 1e-4, rec
    fwd = {(r["provider"], r["features"]): r for r in recs if r["mode"] == "fwd"}
    window_flops = fwd["flashtile", "window:64:0"]["tflops"] * fwd["flashtile", "window:64:0"]["ms"]
    full_flops = fwd["flashtile", "none"]["tflops"] * fwd["flashtile", "none"]["ms"]
    visible = sum(range(57, 65)) + 192 * 65  # rows 0-7 see keys 0..i+56, the rest 65 keys
    assert window_flops / full_flops == pytest.approx(visible / (200 * 256 / 2))
    with open(tmp_path / "results.csv", newline="") as f:
        assert next(csv.DictReader(f))["features"] == "none"


def test_decode_bytes_and_bandwidth():
    from flashtile.bench import decode

    assert decode.kv_bytes(8, 4096, 4, 128, 2) == 2 * 8 * 4096 * 4 * 128 * 2
    assert decode.gbps(4.3e9, 1.0) == pytest.approx(4300.0)  # 4.3 GB in 1 ms = 4.3 TB/s
    assert decode.gbps(1, None) is None and decode.gbps(1, 0) is None
    assert decode.frac_of_copy(2150.0, torch.device("cuda")) == pytest.approx(0.5)
    assert decode.frac_of_copy(2150.0, torch.device("cpu")) is None


def test_decode_paged_layout_is_a_view_with_a_random_table():
    from flashtile.bench import decode

    assert decode.capacity_for(37, [0, 16]) == 48 and decode.capacity_for(37, [0]) == 37
    assert decode.capacity_for(300, [16, 256, 0]) == 512 and decode.capacity_for(5, [4, 6]) == 12
    k = torch.randn(2, 48, 3, 8)
    gen = torch.Generator().manual_seed(0)
    kp, vp, table = decode.paged(k, k + 1, 37, 16, gen)
    assert kp.shape == (2 * 3, 16, 3, 8) and table.shape == (2, 3) and table.dtype == torch.int32
    assert kp.data_ptr() == k.data_ptr()  # a view: no copy
    assert sorted(table.flatten().tolist()) == list(range(6))  # every physical page once, any order
    pages = k.view(6, 16, 3, 8)
    for b in range(2):
        row = decode.logical_row(kp, table, 37, row=b)
        assert row.shape == (1, 37, 3, 8)
        assert torch.equal(row[0], torch.cat([pages[i] for i in table[b].tolist()])[:37])
        assert torch.equal(decode.logical_row(vp, table, 37, row=b), row + 1)
    assert torch.equal(decode.logical_row(k, None, 37), k[:1, :37])
    with pytest.raises(ValueError, match="not a multiple"):
        decode.paged(k, k, 37, 32, gen)


def test_decode_sweep_order_contiguous_first():
    from argparse import Namespace

    from flashtile.bench import decode

    args = Namespace(decode_batch=[8, 64], cache_lens=[16384, 4096], page_size=[16, 0, 256])
    order = decode._order(args)
    assert order[:2] == [(8, 0, 4096), (8, 0, 16384)] and order[2] == (8, 16, 4096)
    assert order[6:8] == [(64, 0, 4096), (64, 0, 16384)] and len(order) == 12


def test_cpu_decode_run_end_to_end(tmp_path):
    """--modes decode alone on the CPU: flashtile contiguous and paged, sdpa contiguous, paged sdpa skipped."""
    proc = _run_cli(["--modes", "decode", "--cache-lens", "256", "--decode-batch", "2", "--page-size", "0,16",
                     "--out", str(tmp_path), "--no-plots"])
    assert "== decode" in proc.stdout and "== fwd ==" not in proc.stdout
    data = json.loads((tmp_path / "results.json").read_text())
    recs = {(r["provider"], r["page_size"]): r for r in data["records"]}
    assert all(r["mode"] == "decode" and r["cache_len"] == 256 and r["batch"] == 2 for r in recs.values())
    for page_size in (0, 16):
        rec = recs["flashtile", page_size]
        assert rec["error"] is None and rec["max_err"] < 1e-4, rec
        assert rec["ms"] > 0 and rec["gbps"] == pytest.approx(2 * 2 * 256 * 4 * 128 * 4 / (rec["ms"] * 1e6))
        assert rec["frac_of_copy"] is None and rec["heads_q"] == 32 and rec["head_dim"] == 128
        assert rec["vs_best_other"] > 0 and rec["best_other"].startswith("sdpa")
    assert recs["sdpa", 0]["error"] is None and recs["sdpa", 0]["max_err"] < 1e-4
    assert recs["sdpa", 16]["error"].startswith("skipped:")
    with open(tmp_path / "results.csv", newline="") as f:
        assert {row["page_size"] for row in csv.DictReader(f)} == {"0", "16"}


def test_cpu_sparse_run_end_to_end(tmp_path):
    """--modes sparse on the CPU: block-sparse and dense flashtile (flex needs a GPU), same outputs."""
    proc = _run_cli(["--modes", "sparse", "--sparse-seqlens", "256", "--sparse-masks", "window:64,dilated:2",
                     "--heads", "2", "--heads-kv", "2", "--head-dims", "32", "--out", str(tmp_path), "--no-plots"])
    assert "== sparse" in proc.stdout and "== fwd ==" not in proc.stdout
    data = json.loads((tmp_path / "results.json").read_text())
    recs = {(r["provider"], r["mask"], r["mode"]): r for r in data["records"]}
    assert set(recs) == {(p, m, mode) for p in ("flashtile-sparse", "flashtile-dense")
                         for m in ("window:64", "dilated:2") for mode in ("fwd", "fwd_bwd")}
    assert all(r["error"] is None and r["ms"] > 0 and r["speedup_vs_dense"] > 0 for r in recs.values())
    assert recs["flashtile-sparse", "dilated:2", "fwd"]["density"] == 0.5
    assert recs["flashtile-sparse", "window:64", "fwd"]["max_diff"] == 0.0


def test_sparse_mask_specs():
    from flashtile.bench import sparse

    assert sparse.parse_mask("window:512") == ("window", 512) and sparse.parse_mask("causal") == ("causal", 0)
    for bad in ("window", "window:0", "blocks:3", "dilated:x"):
        with pytest.raises(ValueError, match="expected window:W"):
            sparse.parse_mask(bad)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--device", "cpu", "--modes", "sparse", "--sparse-masks", "window:-4"])
    assert exit_info.value.code == 2


def test_cpu_decode_streams_jsonl_and_stops_at_max_seconds(tmp_path):
    """Every decode record is printed as one line and appended to decode.jsonl as it is measured; a spent
    --max-seconds budget stops the sweep cleanly and the results still get written."""
    argv = ["--modes", "decode", "--providers", "flashtile,sdpa", "--cache-lens", "64,128", "--decode-batch", "1",
            "--page-size", "0,16", "--heads", "4", "--heads-kv", "2", "--head-dims", "16", "--no-plots"]
    proc = _run_cli([*argv, "--out", str(tmp_path / "all")])
    lines = [json.loads(line) for line in (tmp_path / "all" / "decode.jsonl").read_text().splitlines()]
    assert [(r["provider"], r["page_size"], r["cache_len"]) for r in lines] == [
        (p, page, n) for page in (0, 16) for n in (64, 128) for p in ("flashtile", "sdpa")]
    assert all(r["elapsed_s"] >= 0 and r["batch"] == 1 and r["heads_kv"] == 2 for r in lines)
    streamed = [line for line in proc.stdout.splitlines() if line.startswith("decode ")]
    assert len(streamed) == 8 and "GB/s" in streamed[0] and "page=contig" in streamed[0]
    assert "skipped: paged KV cache" in streamed[-1] and "backend" in streamed[1]
    data = json.loads((tmp_path / "all" / "results.json").read_text())
    assert len(data["records"]) == 8 and data["meta"]["config"]["decode_rep"] == 1

    # a budget far below one measurement: the first shape (both providers) runs, then the sweep stops
    proc = _run_cli([*argv, "--out", str(tmp_path / "short"), "--max-seconds", "0.001"])
    assert "time budget (--max-seconds) reached" in proc.stdout and "3 of 4" in proc.stdout
    lines = (tmp_path / "short" / "decode.jsonl").read_text().splitlines()
    data = json.loads((tmp_path / "short" / "results.json").read_text())
    assert len(lines) == len(data["records"]) == 2 and "== decode" in proc.stdout


def test_decode_sigterm_stops_cleanly(tmp_path):
    """SIGTERM (e.g. from `timeout`) mid-sweep: the records so far are kept in decode.jsonl and results.json."""
    import signal as _signal
    import time as _time

    import flashtile

    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "FLASHTILE_POISON_OUTPUTS")}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(flashtile.__file__).resolve().parents[1]),
                                         *filter(None, [env.get("PYTHONPATH")])])
    argv = ["--modes", "decode", "--device", "cpu", "--providers", "flashtile", "--cache-lens", "64",
            "--decode-batch", ",".join(str(b) for b in range(1, 400)),  # far more than can run
            "--page-size", "0", "--heads", "2", "--heads-kv", "1", "--head-dims", "16", "--rep", "1", "--no-plots",
            "--out", str(tmp_path)]
    proc = subprocess.Popen([sys.executable, "-m", "flashtile.bench", *argv], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    jsonl = tmp_path / "decode.jsonl"
    end = _time.time() + 100
    while _time.time() < end and not (jsonl.exists() and jsonl.read_text().count("\n") >= 2):
        _time.sleep(0.2)
    proc.send_signal(_signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-3000:]
    assert "interrupted" in out
    kept = len(json.loads((tmp_path / "results.json").read_text())["records"])
    streamed = len(jsonl.read_text().splitlines())
    assert 2 <= kept < 399 and abs(kept - streamed) <= 1  # the signal may land between the two writes


def test_missing_standard_entries_say_why():
    """The paper tables' entry without a standard number: out of memory (or skipped because it would be) reads "std
    failed"; a feature the standard baseline does not implement, "std n/a"."""
    assert report._std_missing(dict(error="OutOfMemoryError: ...")) == "std failed"
    assert report._std_missing(dict(error="skipped: would need 40.0 GB (20.0 GB free)")) == "std failed"
    assert report._std_missing(dict(error="skipped: sink not in the standard baseline")) == "std n/a"
