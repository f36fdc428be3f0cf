"""Plots: files in the format their extension names, non-empty, valid SVG; drawn from synthetic timelines
(the trace engine's format) so these tests need no torch."""
from __future__ import annotations

import dataclasses
import xml.etree.ElementTree as ET

import pytest

pytest.importorskip("matplotlib")

from trainfit import api  # noqa: E402
from trainfit.errors import TrainfitError  # noqa: E402
from trainfit.estimate import Detail  # noqa: E402
from trainfit.hardware import get_gpu  # noqa: E402
from trainfit.report import plots  # noqa: E402
from trainfit.report.sweep import run_sweep  # noqa: E402

MiB = 2**20


def synthetic_timeline(layers: int = 4, accum: int = 1) -> list[dict]:
    """A training step as the trace engine records it: activations rise through forward, gradients build and
    activations fall through backward, the optimizer step adds temporaries; phase names as in the Estimate."""
    base = {"weights": 100 * MiB, "optimizer_states": 200 * MiB, "inputs": 1 * MiB}
    out, ev = [], 1000
    grads = 0
    for m in range(accum):
        for i in range(layers + 1):
            out.append({"event": ev, "phase": "forward_end", "bytes": {**base, "activations": i * 30 * MiB,
                                                                        "gradients": grads, "temporaries": 2 * MiB}})
            ev += 10
        for i in range(layers + 1):
            grads = min(100 * MiB, grads + 20 * MiB)
            out.append({"event": ev, "phase": "backward", "bytes": {**base, "activations": (layers - i) * 30 * MiB,
                                                                     "gradients": grads, "temporaries": 5 * MiB}})
            ev += 10
    for i in range(3):
        out.append({"event": ev, "phase": "optimizer_step", "bytes": {**base, "gradients": 100 * MiB,
                                                                       "temporaries": (i + 1) * 40 * MiB}})
        ev += 2
    return out


def traced_like(timeline: list[dict], mode: str = "train"):
    e = api.analytic(api.Request("tiny-llama", batch=2, seq=128, device="cpu", mode=mode))
    peak_pt = max(timeline, key=lambda p: sum(p["bytes"].values()))
    mem = dataclasses.replace(e.memory, peak=sum(peak_pt["bytes"].values()), peak_phase=peak_pt["phase"],
                              at_peak=dict(peak_pt["bytes"]))
    top = [{"bytes": 40 * MiB, "category": "temporaries", "module": "optimizer.exp_avg_sq", "shape": [10], "dtype": "float32",
            "born": "optimizer_step"}]
    return dataclasses.replace(e, engine="trace", memory=mem,
                               detail=Detail(records={"timeline": timeline, "top_tensors": top}))


@pytest.mark.parametrize("ext", ["png", "svg"])
def test_timeline_file_by_extension(tmp_path, ext):
    e = traced_like(synthetic_timeline())
    path = tmp_path / f"step.{ext}"
    plots.plot_timeline(e, path, gpu=get_gpu("T4"))
    data = path.read_bytes()
    assert len(data) > 5000
    if ext == "png":
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        root = ET.fromstring(data)
        assert root.tag.endswith("svg")
        text = data.decode()
        assert "optimizer state" in text and "activations" in text  # the legend names the categories
        assert "T4 memory" in text  # the capacity line is labelled
        assert "peak" in text


def test_timeline_series_stacks_and_phases():
    s = plots.timeline_series(synthetic_timeline(accum=2))
    assert list(s.stacks) == ["params", "opt", "grads", "acts", "temps", "inputs"]  # stack order, zeros dropped
    assert [p for p, _, _ in s.spans] == ["forward_end", "backward", "forward_end", "backward", "optimizer_step"]
    # spans tile the x axis in order and every phase gets a visible share (the optimizer step is 3 points)
    for (_, a, b), (_, c, _) in zip(s.spans, s.spans[1:]):
        assert a < b == c
    width = s.spans[-1][2]
    assert all((b - a) / width >= 0.09 for _, a, b in s.spans)
    assert all(s.x[i] <= s.x[i + 1] for i in range(len(s.x) - 1))
    assert s.totals == [sum(v[i] for v in s.stacks.values()) for i in range(len(s.x))]


def test_timeline_with_measured_overlay(tmp_path):
    e = traced_like(synthetic_timeline())
    measured = dataclasses.replace(e, engine="measure", memory=dataclasses.replace(
        e.memory, peak=e.memory.peak + 3 * MiB, phases={"forward_end": 400 * MiB, "backward": 450 * MiB,
                                                         "optimizer_step": 460 * MiB}))
    path = plots.save(plots.plot_timeline(e, measured=measured), tmp_path / "m.svg")
    assert "measured peak" in path.read_text()


def test_timeline_needs_a_timeline():
    e = api.analytic(api.Request("tiny-llama"))
    with pytest.raises(TrainfitError, match="timeline"):
        plots.plot_timeline(e)


def test_bad_extension_is_a_user_error(tmp_path):
    e = traced_like(synthetic_timeline())
    with pytest.raises(TrainfitError, match=r"\.png, \.svg"):
        plots.plot_timeline(e, tmp_path / "step.jpeg")
    with pytest.raises(TrainfitError, match="does not exist"):
        plots.plot_timeline(e, tmp_path / "nope" / "step.png")


def test_phase_breakdown_adds_up_to_each_phase():
    for mode in ("train", "infer"):
        e = api.analytic(api.Request("llama-3.1-8b", batch=4, seq=4096, mode=mode))
        items = plots.phase_breakdown(e)
        assert [p for p, _ in items] == list(e.memory.phases)
        for phase, cats in items:
            assert sum(cats.values()) == e.memory.phases[phase]
            assert all(v > 0 for v in cats.values())
        peak = dict(items)[e.memory.peak_phase]
        assert peak == plots.by_category(e.memory.at_peak)


def test_phase_compare_and_sweep_plots(tmp_path):
    gpu = get_gpu("H100-80GB")
    e = api.analytic(api.Request("llama-3.2-1b", gpu="H100-80GB"))
    for name, fig in {
        "phases.png": plots.plot_phases(e, gpu=gpu),
        "compare.svg": plots.plot_compare(api.compare(api.Request("llama-3.2-1b", batch=8, seq=2048, gpu="H100-80GB")), gpu=gpu),
        "sweep.png": plots.plot_sweep(run_sweep(api.Request("llama-3.2-1b", gpu="H100-80GB"), "batch", "1:64")),
        "variants.svg": plots.plot_sweep(run_sweep(api.Request("llama-3.2-1b"), "seq", "512:8192",
                                                   {"attention": "eager,flash"})),
        "categorical.png": plots.plot_sweep(run_sweep(api.Request("llama-3.2-1b", gpu="A10G", batch=8), "recompute",
                                                      "none,selective,full")),
    }.items():
        path = plots.save(fig, tmp_path / name)
        assert path.stat().st_size > 5000
        if name.endswith(".svg"):
            ET.fromstring(path.read_bytes())


def test_inline_svg_has_no_external_reference():
    e = traced_like(synthetic_timeline())
    svg = plots.svg_text(plots.plot_timeline(e))
    assert svg.startswith("<svg") and svg.rstrip().endswith("</svg>")
    assert "http://" not in svg and "https://" not in svg
    ET.fromstring(svg.replace("<svg", '<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink"', 1))


def test_timeline_draws_reserved_and_device_total_levels():
    """The allocated curve, with the caching allocator's reserved high-water and the device total as dashed levels
    and the caption's one sentence on the difference (issue 13)."""
    e = traced_like(synthetic_timeline())
    m = dataclasses.replace(e.memory, reserved=e.memory.peak + 50 * MiB,
                            device_total=e.memory.peak + 50 * MiB + 400 * MiB)
    fig = plots.plot_timeline(dataclasses.replace(e, memory=m))
    labels = fig.axes[0].get_legend_handles_labels()[1]
    levels = {lab.split(" (")[0]: line.get_ydata()[0] for line, lab in zip(*fig.axes[0].get_legend_handles_labels())
              if lab.startswith(("reserved", "device total"))}
    assert any(lab.startswith("reserved (caching allocator)") for lab in labels)
    assert levels["device total"] - levels["reserved"] == pytest.approx(400)  # MiB: the plot's unit here
    assert "caching allocator" in "".join(t.get_text() for t in fig.texts)


def test_a_long_caption_does_not_widen_the_image(tmp_path):
    """A timeline's caption (the setup line, then the held-memory sentence, ~330 characters) was one line under the
    plot: saved tight, the PNG was 2,878 px wide for an 11 in figure at 110 dpi, the chart a third of it. The caption
    is wrapped: the image is the figure's width and its legend, and the caption's words are all there."""
    from PIL import Image

    from trainfit.report.held import held_sentence

    e = traced_like(synthetic_timeline())
    on_gpu = api.analytic(api.Request("tiny-llama", batch=2, seq=128, gpu="H100-80GB")).memory  # (its device total)
    e = dataclasses.replace(e, memory=dataclasses.replace(e.memory, reserved=on_gpu.reserved,
                                                          device_total=on_gpu.device_total))
    assert e.memory.reserved != e.memory.peak and e.memory.device_total  # (the whole sentence is drawn)
    fig = plots.plot_timeline(e, tmp_path / "t.png")
    width = Image.open(tmp_path / "t.png").size[0]
    assert width <= fig.get_figwidth() * 110 * 1.3  # (save's dpi; the legend beside the axes)
    caption = " ".join(t.get_text() for t in fig.texts).split()
    assert " ".join(held_sentence("The curve", device_total=e.memory.device_total is not None).split()) in " ".join(
        caption)
