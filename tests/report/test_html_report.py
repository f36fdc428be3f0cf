"""`trainfit report`: one self-contained HTML file with every section."""
from __future__ import annotations

import importlib.util
import json
import re
from html.parser import HTMLParser

import pytest

pytest.importorskip("matplotlib")

from trainfit import api  # noqa: E402
from trainfit.report.html import build_report, plan_candidates, write_report  # noqa: E402

HAS_TORCH = importlib.util.find_spec("torch") is not None and importlib.util.find_spec("transformers") is not None


class Refs(HTMLParser):
    """Every attribute that makes a browser fetch something, and the tags seen."""

    def __init__(self):
        super().__init__()
        self.refs: list[tuple[str, str, str]] = []
        self.tags: set[str] = set()

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        for k, v in attrs:
            if k in ("src", "href", "xlink:href", "srcset", "action", "data", "poster") and v:
                self.refs.append((tag, k, v))


def assert_self_contained(text: str) -> Refs:
    p = Refs()
    p.feed(text)
    for tag, k, v in p.refs:
        assert v.startswith("#") or v.startswith("data:"), f"<{tag} {k}={v!r}> points outside the file"
    assert not re.search(r"https?://", text), "no absolute URL anywhere (not even namespaces)"
    assert "@import" not in text and "url(" not in text.replace("url(#", "")
    assert "script" not in p.tags or all(k != "src" for t, k, _ in p.refs if t == "script")
    assert "link" not in p.tags
    return p


def test_report_is_self_contained_with_every_section(tmp_path):
    req = api.Request("llama-3.2-1b", batch=4, gpu="H100-80GB")
    path = write_report(req, tmp_path / "report.html", trace=False, gpus=8)
    text = path.read_text()
    assert text.startswith("<!DOCTYPE html>")
    p = assert_self_contained(text)
    assert "svg" in p.tags and "style" in p.tags
    for section in ("breakdown", "timeline", "compare", "sweep", "plan"):
        assert f"id='{section}'" in text
    e = api.analytic(req)
    from trainfit.units import fmt_bytes

    assert fmt_bytes(e.memory.peak) in text  # the breakdown's numbers are the engine's
    assert fmt_bytes(e.memory.device_total) in text and "what nvidia-smi shows" in text  # and what the GPU holds
    same = api.compare(api.Request("llama-3.2-1b", batch=4, seq=2048, gpu="H100-80GB"))
    train, infer = (x.memory.peak for x in list(same.values())[:2])
    assert infer / train < 0.1 and f"needs {infer / train:.1%} of the training peak" in text  # (two digits under 10 %)
    assert text.count("<svg") >= 3  # phases, compare, sweep


def test_the_tokens_budget_is_shown_under_mfu_too():
    """--tokens/--price under --mfu: the report printed the budget only in the step-time section, which --mfu leaves
    out, so the budget the CLI prints was silently dropped. The compute table has the CLI's rows."""
    from trainfit.report.terminal import budget_line

    req = api.Request("llama-3.1-8b", gpu="H100-80GB", mfu=0.4, tokens=1.5e13, price=2)
    t = api.analytic(req).time
    text = build_report(req, trace=False)
    assert "train on 15.00 T tokens" in text and budget_line(t) in text


def test_plan_section(tmp_path):
    req = api.Request("llama-3.1-8b", gpu="H100-80GB")
    cands, note = plan_candidates(req, 8)
    if importlib.util.find_spec("trainfit.plan") is None:
        assert not cands and "not available" in note
        return
    text = build_report(req, gpus=8, trace=False)
    assert "Plan for 8 × H100-80GB" in text
    if cands:
        assert all("setup" in c and "memory" in c for c in cands)
    assert plan_candidates(api.Request("llama-3.1-8b"), 8)[1].startswith("the plan needs a GPU")


def test_plan_section_names_the_flags_the_plan_does_not_use():
    """report --gpus with --lora-rank 16 --recompute full planned full fine-tuning without recompute (the planner has
    no base setup) and said nothing: the plan section names the flags given that its plans do not carry."""
    if importlib.util.find_spec("trainfit.plan") is None:
        pytest.skip("the planner is not installed")
    req = api.Request("llama-3.1-8b", gpu="H100-80GB", lora_rank=16, recompute="full")
    cands, _ = plan_candidates(req, 8)
    assert cands and all(c["setup"]["lora_rank"] == 0 for c in cands)  # the planner's own setups: no adapters
    section = build_report(req, gpus=8, trace=False).split("id='plan'")[1]
    note = re.search(r"The plan does not use ([^:]*):", section)
    assert note and set(note.group(1).split(", ")) == {"--lora-rank", "--recompute"}
    assert "The plan does not use" not in build_report(api.Request("llama-3.1-8b", gpu="H100-80GB"), gpus=8,
                                                       trace=False)


def test_plan_section_command_gives_its_plans(cli):
    """report --gpus 8 --seq 4096 --stack megatron planned megatron at seq 4096 but pointed to `trainfit plan
    llama-3.1-8b --gpu H100-80GB --gpus 8` (hf at seq 2048: other plans). The command shown carries the settings the
    plan read: run, it answers the section's plans."""
    import html
    import shlex

    if importlib.util.find_spec("trainfit.plan") is None:
        pytest.skip("the planner is not installed")
    req = api.Request("llama-3.1-8b", gpu="H100-80GB", seq=4096, stack="megatron", reserve=2.5)
    section = build_report(req, gpus=8, trace=False, global_batch_tokens=1e6).split("id='plan'")[1]
    command = html.unescape(re.search(r"<code>(trainfit plan [^<]*)</code>", section).group(1))
    code, out, err = cli(*shlex.split(command)[1:], "--json")
    assert code == 0, err
    keys = ("stack", "dp", "tp", "pp", "zero", "batch", "grad_accum", "recompute", "precision", "seq")
    planned = [tuple(c["setup"][k] for k in keys) for c in json.loads(out)["candidates"]]
    shown, _ = plan_candidates(req, 8, 1e6)
    assert planned == [tuple(c["setup"][k] for k in keys) for c in shown]
    assert {p[0] for p in planned} == {"megatron"} and {p[-1] for p in planned} == {4096}


def test_report_trace_refusal_names_reports_own_flag(cli, tmp_path):
    """report llama-3.1-8b --stack megatron --trace answered estimate's '--engine trace runs the stack's own step ...:
    use --engine analytic', an option report has not: the refusal names --trace, report's own (one line, exit 2)."""
    code, out, err = cli("estimate", "llama-3.1-8b", "--stack", "megatron", "--engine", "trace")
    assert code == 2 and "use --engine analytic" in err
    reason = err.split("which it does not for --stack megatron")[1].split(": use")[0]  # the engine's own words
    code, out, err = cli("report", "--help")
    assert code == 0 and "--engine" not in out and "--trace" in out
    code, out, err = cli("report", "llama-3.1-8b", "--stack", "megatron", "--trace", "-o", str(tmp_path / "r.html"))
    assert code == 2 and len(err.strip().splitlines()) == 1 and reason in err
    assert "--engine" not in err and "drop --trace" in err and not (tmp_path / "r.html").exists()


def _verdict_cards(text: str) -> list[str]:
    cards = text.split("<div class='verdict'>")[1].split("\n")[0]  # (the verdict is one line of the page)
    return [re.sub(r"<[^>]+>", " ", c).split() for c in cards.split("<div class='card'>")[1:]]


def test_report_of_an_encoders_inference():
    """report bert-base --mode infer --gpu H100-80GB raised TypeError (a traceback, exit 1): the verdict formatted
    the decode rate an encoder does not have (None). The card is the prefill, as estimate's table has it."""
    from trainfit.units import fmt_seconds

    req = api.Request("bert-base", mode="infer", gpu="H100-80GB")
    t = api.analytic(req).time
    assert t.decode_tokens_per_second is None  # (estimate's own: nothing decoded)
    cards = _verdict_cards(build_report(req, trace=False))
    assert ["prefill", *fmt_seconds(t.prefill_seconds).split(), "an", "encoder:", "no", "decode"] in cards


def test_report_of_rl_post_training():
    """report llama-3.1-8b --mode rl headed 'will it serve?' and carded 'decode 212 tok/s, prefill 19.30 s': the
    19.30 s is the whole generate phase (estimate's table: generate 19.30 s of a 20.28 s step). The card is the step
    time with the generated tokens/s, as estimate prints them."""
    from trainfit.units import fmt_seconds

    req = api.Request("llama-3.1-8b", mode="rl", gpu="H100-80GB")
    e = api.analytic(req)
    text = build_report(req, trace=False)
    assert "will it train?" in text
    cards = _verdict_cards(text)
    assert not any(c[0] in ("decode", "prefill") for c in cards)
    step = [c for c in cards if c[:2] == ["step", "time"]]
    assert step and fmt_seconds(e.time.step_seconds) in " ".join(step[0])
    assert f"{e.time.decode_tokens_per_second:,.0f} generated tokens/s" in " ".join(step[0])
    assert e.detail.rl.phase_seconds["generate"] == e.time.prefill_seconds  # the figure the card had as 'prefill'


@pytest.mark.skipif(not HAS_TORCH, reason="the trace engine needs torch and transformers")
def test_report_with_the_traced_timeline(tmp_path):
    text = build_report(api.Request("tiny-llama", batch=2, seq=64, device="cpu", gpu="T4"), trace=True,
                        vary=("seq", "64:256"))
    assert_self_contained(text)
    assert "Memory over the step" in text and "trace" in text


@pytest.mark.skipif(not HAS_TORCH, reason="the trace engine needs torch and transformers")
@pytest.mark.parametrize("model,positions", [("tiny-gpt2", 512), ("gpt2", 1024)])
def test_report_at_the_default_sequence_of_a_model_with_learned_positions(cli, tmp_path, model, positions):
    """The report traces what `trainfit estimate --engine trace` traces (api.trace: the model's defaults resolved,
    here a sequence within its learned positions, not 2048), and compares training with inference at the longest
    sequence both allow (a causal model's decode writes position --seq)."""
    code, out, err = cli("report", model, "-o", str(tmp_path / "r.html"))
    assert code == 0, err
    text = (tmp_path / "r.html").read_text()
    assert "Memory over the step" in text and "No traced timeline" not in text
    assert f"prompts of {positions - 1} tokens" in text
    traced = api.trace(api.Request(model))
    assert traced.setup.seq == positions



@pytest.mark.skipif(not HAS_TORCH, reason="the trace engine needs torch and transformers")
def test_report_of_an_image_classifier():
    """A report for a vision model: its breakdown, time and traced timeline (it was refused, naming `compare`); the
    plan section, a transformer's layouts, is refused by name before any work."""
    from trainfit.errors import TrainfitError
    from trainfit.units import fmt_bytes

    req = api.Request("tiny-resnet", gpu="H100-80GB")
    text = build_report(req, trace=True)
    assert_self_contained(text)
    sections = re.findall(r"<h2>([^<]*)", text)
    assert "Memory over the step" in sections and "Training vs inference" not in sections, sections
    assert fmt_bytes(api.analytic(req).memory.peak) in text
    with pytest.raises(TrainfitError, match="leave out --gpus"):
        build_report(req, gpus=8)
