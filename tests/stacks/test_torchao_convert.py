"""step/torchao_convert.py: torchao's Float8Linear swapped into torchtitan's model as torchtitan's converter does it.
Counted by hand from torchtitan's module_filter_fn (components/quantization/utils.py:10-27): tiny-llama's projections
(hidden 256, q 256, kv 64, MLP 688 = 43 x 16) all have dims divisible by 16, so each of its 4 blocks converts its 7;
the LM head ("output") is filtered; --bf16-first/last-layers add their blocks to the filter."""
import pytest

from trainfit.errors import EngineUnavailableError
from trainfit.models.resolve import load_model
from trainfit.setup import Setup


def _converted(**kw) -> dict[str, int]:
    from trainfit.step.torchtitan import build

    setup = Setup(batch=1, seq=128, device="cpu", precision="bf16", stack="torchtitan", **kw)
    model = build(load_model("tiny-llama"), setup, device="cpu", fake=True)  # fake: no init (values unused)
    out: dict[str, int] = {}
    for name, m in model.named_modules():
        if type(m).__name__ == "Float8Linear":
            out[name.split(".")[1]] = out.get(name.split(".")[1], 0) + 1
    assert type(model.output).__name__ == "Linear"
    return out


def test_float8_converts_every_projection_but_the_head_and_the_bf16_layers():
    pytest.importorskip("torchtitan")
    pytest.importorskip("torchao.float8")
    assert _converted(low_precision="tensorwise") == {"0": 7, "1": 7, "2": 7, "3": 7}
    assert _converted(low_precision="rowwise", bf16_first_layers=1, bf16_last_layers=1) == {"1": 7, "2": 7}
    assert _converted() == {}


def test_recipes_torchao_float8_does_not_run_are_refused_in_one_line():
    from trainfit.step.torchao_convert import check

    with pytest.raises(EngineUnavailableError, match="--low-precision mxfp8") as e:
        check(Setup(device="cpu", stack="torchtitan", low_precision="mxfp8"))
    assert "\n" not in str(e.value)
