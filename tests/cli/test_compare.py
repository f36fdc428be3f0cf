"""`trainfit compare` (training vs inference side by side): what the inference columns carry over from the training
flags and the note naming the rest, the time rows that show --power-limit's effect, the summary's more/less. Each
number is checked against `trainfit estimate` run on its own (--mode infer for the inference columns) or a hand
count, never against compare's own arithmetic."""
import json
import re
from types import SimpleNamespace

import pytest

from trainfit.compare_setup import NOTE_START, inference_request, unused_note
from trainfit.setup import SETTINGS, Request, parse_value

QLORA = ("llama-3.1-8b", "--gpu", "H100-80GB", "--lora-rank", "16", "--quant", "nf4", "--recompute", "full")
LLAMA_31_8B_PARAMS = 8_030_261_248  # model.num_parameters() of meta-llama/Llama-3.1-8B (its model card: 8.03B)


def _json(cli, *args) -> dict:
    code, out, err = cli(*args, "--json")
    assert code == 0, err
    return json.loads(out)


def _cell(out: str, label: str) -> list[str]:
    """The cells of the table row whose first cell starts with `label` (rich's │-separated rows)."""
    row = next(line for line in out.splitlines() if line.startswith("│") and
               line.split("│")[1].strip().startswith(label))
    return [c.strip() for c in row.split("│")[2:-1]]


def test_qlora_inference_columns_name_what_they_do_not_use(cli):
    """The reproduction of the report: the train column holds the NF4 base, the infer column the bf16 weights; it used
    to say nothing. trainfit's inference engine has no bitsandbytes or peft path (`estimate --mode infer --quant nf4`
    is refused), so the infer column is `estimate --mode infer` of the same batch and context, and one line under the
    table says --quant and --lora-rank are not used there and why, --recompute as training only."""
    code, _, err = cli("estimate", "llama-3.1-8b", "--mode", "infer", "--quant", "nf4")
    assert code == 2 and "--quant applies to train/serve only" in err  # (no inference path to carry it to)
    rows = _json(cli, "compare", *QLORA)
    train, infer = rows["train (batch 1)"], rows["infer (batch 1)"]
    alone = _json(cli, "estimate", "llama-3.1-8b", "--gpu", "H100-80GB", "--mode", "infer", "--seq", "2048")
    assert infer["memory"] == alone["memory"] and infer["time"] == alone["time"]
    assert infer["memory"]["weights"] == 2 * LLAMA_31_8B_PARAMS  # bf16 weights whole, by hand: 14.96 GiB
    trained = _json(cli, "estimate", *QLORA)
    assert train["memory"] == trained["memory"]  # the training column is the training estimate, untouched
    note = ("the infer columns do not use: --lora-rank, --quant (trainfit's inference engine models no bitsandbytes "
            "base or LoRA adapters: these columns hold the whole bf16 weights); --recompute (training only)")
    assert note in infer["notes"] and note not in train["notes"]  # --json carries it too
    code, out, err = cli("compare", *QLORA)
    assert code == 0, err
    assert out.count(NOTE_START) == 1 and out.strip().endswith("· " + note)


def test_inference_columns_carry_every_setting_inference_reads(cli):
    """The settings inference reads (tp, attention, tf32, power cap, batch, context) reach the inference columns, the
    precision as its compute dtype (amp-fp16 -> fp16): each column is `estimate --mode infer` with those flags;
    --dp and --zero shard training only (per GPU, inference is one replica) and --optimizer is training's own."""
    common = ("--gpu", "H100-80GB", "--power-limit", "400", "--tp", "2", "--attention", "eager", "--seq", "512")
    rows = _json(cli, "compare", "llama-3.2-1b", *common, "--batch", "2", "--precision", "amp-fp16", "--dp", "4",
                 "--zero", "3", "--optimizer", "lion")
    assert list(rows) == ["train (batch 2)", "infer (batch 2)", "infer (batch 1)"]
    for batch in (2, 1):
        alone = _json(cli, "estimate", "llama-3.2-1b", "--mode", "infer", *common, "--batch", str(batch),
                      "--precision", "fp16")
        col = rows[f"infer (batch {batch})"]
        assert col["memory"] == alone["memory"] and col["time"] == alone["time"]
        assert (col["setup"]["tp"], col["setup"]["attention"], col["setup"]["precision"]) == (2, "eager", "fp16")
        assert "the infer columns do not use: --dp, --zero (inference is modelled on one replica, sharded by --tp " \
               "and --pp only); --optimizer (training only)" in col["notes"]


def _non_default(s):
    """A valid value of setting `s` away from its default (its example, a choice, or the switch on)."""
    if s.base_type is bool:
        return True
    if s.meta.example:
        return parse_value(s, s.meta.example) if s.meta.parse or s.base_type is str else s.base_type(s.meta.example)
    return next(c for c in s.meta.choices if c != s.request_default)


# the options `trainfit compare` takes (cli/app.py: with_settings' exclude; tests/cli/test_help_groups.py)
COMPARE_FLAGS = [s for s in SETTINGS if "train" in s.meta.modes and
                 s.name not in ("mode", "tokens", "mfu", "price", "alloc_conf")]


@pytest.mark.parametrize("s", COMPARE_FLAGS, ids=lambda s: s.name)
def test_no_training_flag_is_dropped_silently(s):
    """Every setting compare takes either reaches its inference request or is named in the note: none is lost."""
    value = _non_default(s)
    req = Request(model="llama-3.1-8b", **{"gpu": "H100-80GB", s.name: value})
    infer, note = inference_request(req), unused_note(req) or ""
    if s.name == "precision":  # the weights are served in the training compute dtype (precision.py's table)
        assert infer.precision == {"fp32": "fp32", "amp-bf16": "bf16", "amp-fp16": "fp16", "bf16": "bf16",
                                   "bf16-master": "bf16", "fp16-master": "fp16"}[value] and not note
    elif "infer" in s.meta.modes:
        assert getattr(infer, s.name) == value and s.flag not in note
    else:
        assert getattr(infer, s.name) == s.request_default and s.flag in note.split(": ", 1)[1]


def test_compare_shows_each_columns_time_so_the_power_cap_shows(cli):
    """--power-limit (and every flag that only moves time) shows in the time rows: the training step's time and
    tokens/s, the inference prefill's time and decode tokens/s, each as `trainfit estimate` prints it; a cap of 350 W
    on a 700 W H100 slows the step and the prefill."""
    def times(*extra):
        code, out, err = cli("compare", "llama-3.2-1b", "--gpu", "H100-80GB", *extra)
        assert code == 0, err
        return _cell(out, "time"), _cell(out, "tokens/s")

    def printed(*extra):
        code, out, err = cli("estimate", "llama-3.2-1b", "--gpu", "H100-80GB", *extra)
        assert code == 0, err
        return out

    for cap in ((), ("--power-limit", "350")):
        (step, prefill), (trained, decoded) = times(*cap)
        train, infer = printed(*cap), printed("--mode", "infer", *cap)
        assert step == "step " + _cell(train, "step time")[0] and trained == _cell(train, "tokens/s")[0] + " (all GPUs)"
        assert prefill == "prefill " + _cell(infer, "prefill time")[0]
        assert decoded == _cell(infer, "decode tokens/s")[0] + " decode (batch)"
    full = _json(cli, "compare", "llama-3.2-1b", "--gpu", "H100-80GB")
    capped = _json(cli, "compare", "llama-3.2-1b", "--gpu", "H100-80GB", "--power-limit", "350")
    assert capped["train (batch 1)"]["time"]["step_seconds"] > full["train (batch 1)"]["time"]["step_seconds"]
    assert capped["infer (batch 1)"]["time"]["prefill_seconds"] > full["infer (batch 1)"]["time"]["prefill_seconds"]
    code, out, _ = cli("compare", "llama-3.2-1b")
    assert code == 0 and not any(line.startswith("│ time") for line in out.splitlines())  # no GPU: not timed


def test_power_limit_without_a_gpu_is_one_line(cli):
    code, out, err = cli("compare", "llama-3.2-1b", "--power-limit", "350")
    assert code == 2 and "--power-limit caps a GPU's board power, which needs --gpu" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def _peak(cli, *args) -> int:
    return _json(cli, "estimate", *args)["memory"]["peak"]


def test_summary_says_more_when_inference_needs_more(cli):
    """The QLoRA case: inference (bf16 weights whole) needs more than the NF4 training step: "22% more", not
    "-22% less"; the share is estimate's inference peak over estimate's training peak."""
    code, out, err = cli("compare", *QLORA)
    assert code == 0, err
    r = _peak(cli, "llama-3.1-8b", "--gpu", "H100-80GB", "--mode", "infer", "--seq", "2048") / _peak(cli, *QLORA)
    assert 1.2 < r < 1.25  # 15.44 / 12.68 GiB
    assert (f"inference at batch 1 (the training micro-batch) needs {r:.0%} of the training peak "
            f"({r - 1:.0%} more).") in out
    assert "(-" not in out and "less" not in out


def test_summary_at_a_larger_batch_names_both_batches(cli):
    """--batch 4 gives three columns: inference at the training micro-batch (4) and at batch 1, each a share of the
    training peak with how much less; the labels and the peaks are estimate's at those batches (ZeRO-3 over 8 ranks
    and accumulation shard and repeat the training step only)."""
    training = ("llama-3.1-8b", "--batch", "4", "--grad-accum", "8", "--recompute", "full", "--dp", "8", "--zero", "3")
    code, out, err = cli("compare", *training)
    assert code == 0, err
    assert re.search(r"┃\s+┃\s+train \(batch 4\) ┃\s+infer \(batch 4\) ┃\s+infer \(batch 1\) ┃", out)
    train = _peak(cli, *training, "--seq", "2048")
    four, one = (_peak(cli, "llama-3.1-8b", "--mode", "infer", "--batch", b, "--seq", "2048") / train
                 for b in ("4", "1"))
    assert 0.1 < one < four < 1  # 54% and 49%
    assert (f"inference at batch 4 (the training micro-batch) needs {four:.0%} of the training peak "
            f"({1 - four:.0%} less); at batch 1 it needs {one:.0%} ({1 - one:.0%} less).") in out


@pytest.mark.parametrize("peaks, words", [((100, 100), "needs 100% of the training peak (about the same)."),
                                          ((100, 5), "needs 5.0% of the training peak (95% less)."),
                                          ((100, 250, 40), "needs 250% of the training peak (150% more); at batch 1 "
                                                           "it needs 40% (60% less).")])
def test_summary_wording(peaks, words):
    from trainfit.report.terminal import compare_summary

    ests = [SimpleNamespace(memory=SimpleNamespace(peak=p), setup=SimpleNamespace(batch=b))
            for p, b in zip(peaks, (8, 8, 1))]
    assert compare_summary(ests) == f"inference at batch 8 (the training micro-batch) {words}"


def test_html_report_compare_section_has_the_summary_times_and_note():
    from trainfit import api
    from trainfit.report.html import _compare

    html = _compare(api.Request("llama-3.1-8b", gpu="H100-80GB", lora_rank=16, quant="nf4", recompute="full"), None)
    assert "needs 122% of the training peak (22% more)." in html and "less)" not in html
    assert "<td>time</td><td>step " in html and "The infer columns do not use: --lora-rank, --quant" in html
