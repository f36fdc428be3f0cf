"""Sweeps: value parsing, the physics the table must show (monotone where it must be), the JSON and table."""
from __future__ import annotations

import dataclasses

import pytest
from rich.console import Console

from trainfit import api
from trainfit.errors import SetupError
from trainfit.report.sweep import parse_values, render_table, run_sweep, sweep_html_table


def test_parse_values():
    assert parse_values("seq", "512:16384") == [512, 1024, 2048, 4096, 8192, 16384]
    assert parse_values("batch", "1:48") == [1, 2, 4, 8, 16, 32, 48]  # the upper end asked for is kept
    assert parse_values("batch", "8,1,4,4") == [1, 4, 8]
    assert parse_values("zero", "0:3") == [0, 1, 2, 3]
    assert parse_values("attention", "eager, flash") == ["eager", "flash"]
    for knob, text in [("batch", "0:8"), ("batch", "8:1"), ("batch", "a:b"), ("color", "1,2"), ("recompute", "a:b"),
                       ("batch", ""), ("seq", "1:1e30")]:
        with pytest.raises(SetupError):
            parse_values(knob, text)


def _series(s, variant=""):
    return [r for r in s.rows if r["variant"] == variant and r["error"] is None]


def test_batch_sweep_is_monotone_and_marks_the_fit():
    s = run_sweep(api.Request("llama-3.2-1b", gpu="H100-80GB"), "batch", "1:64")
    rows = _series(s)
    assert [r["value"] for r in rows] == [1, 2, 4, 8, 16, 32, 64]
    peaks = [r["peak"] for r in rows]
    times = [r["step_seconds"] for r in rows]
    assert all(a <= b for a, b in zip(peaks, peaks[1:])) and peaks[-1] > peaks[0]
    assert all(a < b for a, b in zip(times, times[1:]))
    acts = [r["activations"] for r in rows]  # activations are affine in the micro-batch (1, 2, 4, ...)
    assert acts[2] - acts[1] == pytest.approx(2 * (acts[1] - acts[0]), rel=1e-6)
    fits = [r["fits"] for r in rows]
    assert fits[0] and not fits[-1] and fits == sorted(fits, reverse=True)  # fits, then stops fitting for good
    up = s.fits_up_to("")
    assert up == max(r["value"] for r in rows if r["fits"])
    gpu = api.load_gpu("H100-80GB")
    # the device total: peak + one cached block of the largest freed tensor (the loss's fp32 logits: batch × 2048
    # tokens × vocab 128,256 × 4 bytes) + the H100's two 32 MiB cuBLAS workspaces + the CUDA context after a step; at
    # batch 1 the gradients' own segments too (tests/test_settings.py GRAD_SEGMENTS: 832 MiB; from batch 2 the 64 MiB
    # fp32 gradients fit the bf16 MLP intermediates); never below what the fit requires (overheads.device_memory)
    def total(r):
        grads = 832 * 2**20 if r["value"] == 1 else 0
        cached = r["peak"] + r["value"] * 2048 * 128_256 * 4 + grads
        return max(cached, r["required"]) + 64 * 2**20 + 820_838_400

    assert all(r["device_total"] == total(r) for r in rows)
    # the fit is judged on required within the capacity: the GPU less the same workspaces and context
    capacity = gpu.memory - 64 * 2**20 - 820_838_400
    assert all(r["fits"] == (r["required"] <= capacity) for r in rows)


def test_seq_sweep_eager_vs_flash():
    s = run_sweep(api.Request("llama-3.1-8b"), "seq", "512:16384", {"attention": "eager,flash"})
    assert s.variants == ["eager", "flash"]
    eager, flash = _series(s, "eager"), _series(s, "flash")
    for e, f in zip(eager, flash):
        assert e["value"] == f["value"]
        assert e["peak"] >= f["peak"]
        assert e["activations"] > f["activations"]
    for series in (eager, flash):
        peaks = [r["peak"] for r in series]
        assert all(a <= b for a, b in zip(peaks, peaks[1:]))
    # eager stores the s×s scores: its extra activation memory over flash grows quadratically with seq
    extra = [e["activations"] - f["activations"] for e, f in zip(eager, flash)]
    assert extra[-1] / extra[-2] == pytest.approx(4, rel=0.05)


def test_recompute_and_zero_sweeps_decrease():
    # selective recompute drops the attention core: it matters when that is stored (eager attention)
    s = run_sweep(api.Request("llama-3.2-1b", batch=8, attention="eager"), "recompute", "none,selective,full")
    acts = [r["activations"] for r in _series(s)]
    assert acts[0] > acts[1] > acts[2]
    s = run_sweep(api.Request("llama-3.1-8b", dp=8), "zero", "0:3")
    peaks = [r["peak"] for r in _series(s)]
    assert all(a >= b for a, b in zip(peaks, peaks[1:])) and peaks[-1] < peaks[0]
    s = run_sweep(api.Request("llama-3.1-70b", zero=3), "gpus", "1:64")
    peaks = [r["peak"] for r in _series(s)]
    assert all(a >= b for a, b in zip(peaks, peaks[1:])) and peaks[-1] < peaks[0] / 4  # states sharded 64 ways; activations are not
    assert any("ZeRO is off" in n for n in s.notes)


def test_the_fit_line_follows_the_rows_where_larger_values_fit():
    """More GPUs fit where fewer do not: the line under the table said "fits on H100-80GB at every gpus swept"
    (terminal) and "up to gpus 64" (the HTML report) beside rows that do not fit; it says where the fit starts."""
    from trainfit.report.html import build_report

    req = api.Request("llama-3.1-70b", dp=8, zero=3, recompute="full", gpu="H100-80GB")
    s = run_sweep(req, "gpus", "8:64")
    assert [r["fits"] for r in _series(s)] == [False, False, True, True]
    console = Console(record=True, width=200)
    render_table(s, console)
    text = console.export_text()
    assert "fits on H100-80GB from gpus 32 on" in text and "at every" not in text
    page = build_report(req, trace=False, vary=("gpus", "8:64"))
    assert "fits on H100-80GB from gpus 32 on" in page and "up to gpus" not in page


def test_invalid_points_are_rows_with_errors():
    s = run_sweep(api.Request("llama-3.1-8b"), "tp", "1,2,3,4")
    bad = [r for r in s.rows if r["error"]]
    assert [r["value"] for r in bad] == [3] and "does not divide" in bad[0]["error"]
    with pytest.raises(SetupError):
        run_sweep(api.Request("llama-3.1-8b"), "tp", "3,5")  # no valid point at all
    with pytest.raises(SetupError):
        run_sweep(api.Request("llama-3.1-8b"), "attention", "eager,flash", {"attention": "eager,flash"})


def test_json_says_where_fitting_starts_as_the_table_does():
    # more GPUs under ZeRO-3: the values that fit are the highest swept, so `fits_up_to` (the largest that fits)
    # alone would read as a limit; fit_where carries the table's words, from the rows' own verdicts
    s = run_sweep(api.Request("llama-3.1-70b", gpu="H100-80GB", zero=3, seq=2048, recompute="full"), "gpus",
                  "8,16,32,64")
    d = s.to_dict()
    fits = [r for r in d["rows"] if r["fits"]]
    assert 0 < len(fits) < len(d["rows"]) and all(r["fits"] for r in d["rows"][len(d["rows"]) - len(fits):])
    assert d["fit_where"] == {"": f"from gpus {fits[0]['value']} on"} and d["fits_up_to"] == {"": 64}


def test_json_and_tables_hold_the_same_numbers():
    s = run_sweep(api.Request("llama-3.2-1b", gpu="A100-40GB"), "batch", "1,4,16", {"recompute": "none,full"})
    d = s.to_dict()
    assert d["gpu"] == "A100-40GB" and d["vary"] == "batch" and len(d["rows"]) == 6
    assert set(d["fits_up_to"]) == {"none", "full"}
    e = api.analytic(api.Request("llama-3.2-1b", gpu="A100-40GB", batch=4, recompute="full"))
    row = next(r for r in d["rows"] if r["variant"] == "full" and r["value"] == 4)
    assert row["peak"] == e.memory.peak and row["step_seconds"] == e.time.step_seconds
    console = Console(record=True, width=200)
    render_table(s, console)
    text = console.export_text()
    from trainfit.units import fmt_bytes

    assert fmt_bytes(row["peak"]) in text
    assert fmt_bytes(row["peak"]) in sweep_html_table(s)
    # the fit column sits beside the number it is judged on (the fit rule's required)
    assert row["required"] == e.memory.required and row["fits"] == e.fit.fits
    assert fmt_bytes(row["required"]) in text and fmt_bytes(row["required"]) in sweep_html_table(s)


def test_inference_caption_names_only_what_inference_reads():
    """An inference sweep's 'fixed:' caption has no optimizer, accumulation or ZeRO stage (training's settings)."""
    s = run_sweep(api.Request("llama-3.2-1b", gpu="H100-80GB", mode="infer"), "batch", "1,2")
    fixed = s.caption.split(" · ")[0]
    assert "mode infer" in fixed and "seq" in fixed
    assert not any(w in fixed for w in ("optimizer", "grad-accum", "zero", "recompute"))


def test_many_variants_stay_readable_at_80_columns():
    """sweep --vary batch 1:2 --gpu H100-80GB --recompute none,full --optimizer adamw,adamw-8bit at 80 columns:
    rich shrank the 17 columns until every cell read '6…' and every header 'r…'; each variant is now a table of its
    own there, every number whole."""
    import re

    from trainfit.units import fmt_bytes, fmt_seconds

    req = api.Request("llama-3.1-8b", gpu="H100-80GB", precision="bf16")
    s = run_sweep(req, "batch", "1:2", {"recompute": "none,full", "optimizer": "adamw,adamw-8bit"})
    console = Console(record=True, width=80)
    render_table(s, console)
    text = console.export_text()
    assert "…" not in text and max(map(len, text.splitlines())) <= 80
    for recompute in ("none", "full"):
        for optimizer in ("adamw", "adamw-8bit"):
            e = api.analytic(api.Request("llama-3.1-8b", gpu="H100-80GB", precision="bf16", batch=2,
                                         recompute=recompute, optimizer=optimizer))
            assert f"recompute {recompute} optimizer {optimizer}" in text
            peak, step = (re.escape(x) for x in (fmt_bytes(e.memory.peak), fmt_seconds(e.time.step_seconds)))
            assert re.search(rf"│\s+2 │\s+{peak} │\s+{step} │", text)
    wide = Console(record=True, width=400)  # (piped: report/console.py PIPED_WIDTH) side by side, one table
    render_table(s, wide)
    assert wide.export_text().count("┏") == 1


def test_an_inference_sweep_names_its_time_the_prefill():
    """sweep --mode infer --gpu headed its time column 'step time' (terminal, report, plot) over the prefill's time
    (Timing.step_seconds of an inference): estimate's table calls the same number 'prefill time'."""
    from trainfit.units import fmt_seconds

    req = api.Request("llama-3.1-8b", mode="infer", gpu="H100-80GB")
    s = run_sweep(req, "seq", "1024,4096")
    t = api.analytic(api.Request("llama-3.1-8b", mode="infer", gpu="H100-80GB", seq=4096)).time
    console = Console(record=True, width=200)
    render_table(s, console)
    text, page = console.export_text(), sweep_html_table(s)
    assert "prefill time" in text and "step time" not in text
    assert "<th>prefill time</th>" in page and "step time" not in page
    assert fmt_seconds(t.prefill_seconds) in text and fmt_seconds(t.prefill_seconds) in page
    train = run_sweep(api.Request("llama-3.1-8b", gpu="H100-80GB"), "seq", "1024")
    console = Console(record=True, width=200)
    render_table(train, console)
    assert "step time" in console.export_text()


def test_a_gpus_sweep_is_refused_where_a_point_runs_more_gpus():
    """sweep llama-3.1-70b --vary gpus 8:32 --tp 8 --stack megatron labelled rows 'gpus 8, 16, 32' and said 'fits from
    gpus 16 on' while each point ran dp × tp = 64, 128, 256 GPUs (the knob sets dp). Refused in one line, naming
    --vary dp, which sweeps the same points under their own name."""
    req = api.Request("llama-3.1-70b", tp=8, stack="megatron", zero=1, gpu="H100-80GB")
    spec = api.load_spec(req.model)
    assert dataclasses.replace(req, dp=8).setup(spec).world_size == 64  # the point 'gpus 8' is
    with pytest.raises(SetupError, match=r"--vary gpus .* with --tp 8 each point runs 8x as many GPUs: use --vary dp"):
        run_sweep(req, "gpus", "8:32")
    s = run_sweep(req, "dp", "8:32")
    e = api.analytic(dataclasses.replace(req, dp=16))
    assert [r["peak"] for r in s.rows if r["value"] == 16] == [e.memory.peak]
    run_sweep(api.Request("llama-3.1-70b", zero=3, gpu="H100-80GB"), "gpus", "8,16")  # (dp alone: GPUs = dp)


def test_a_variant_list_is_its_values_each_once():
    """'bf16,,' is one precision, fixed (its caption said 'precision bf16,,'); 'bf16,bf16,fp32' is two variants
    (it drew bf16 twice); a list of no value is refused in one line (it raised IndexError)."""
    req = api.Request("llama-3.2-1b")
    one = run_sweep(req, "batch", "1,2", {"precision": "bf16,,"})
    assert one.variants == [""] and "precision bf16," in one.caption and "bf16,," not in one.caption
    assert run_sweep(req, "batch", "1,2", {"precision": "bf16,bf16,fp32"}).variants == ["bf16", "fp32"]
    with pytest.raises(SetupError, match="names no value"):
        run_sweep(req, "batch", "1,2", {"precision": ",,"})


def test_the_caption_reads_at_the_consoles_width_not_a_narrow_tables():
    """A one-variant sweep's table is ~35 columns wide, and its 'fixed:' caption, a rich table caption, wrapped to that
    width (six lines of a few words). It prints under the table at the console's width: at 80 columns, lines of up to
    80 characters, the whole caption's words in order."""
    s = run_sweep(api.Request("llama-3.2-1b"), "batch", "1,2")
    console = Console(record=True, width=80)
    render_table(s, console)
    lines = console.export_text().splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith("fixed: "))
    caption = lines[start:]
    assert " ".join(caption).split() == s.caption.split()
    assert max(map(len, caption)) <= 80 and len(caption) <= len(s.caption) // 60 + 1
    # the defaults as the estimate took them ('seq default', 'precision default' said nothing)
    e = api.analytic(api.Request("llama-3.2-1b", batch=1))
    assert f"seq {e.setup.seq}," in s.caption and f"precision {e.setup.precision}," in s.caption
    assert "default" not in s.caption
