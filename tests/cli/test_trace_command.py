"""`trainfit trace FACTORY`: any nn.Module, checked against a hand derivation."""
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")


sys.path.insert(0, str(Path(__file__).parent))  # example_factories




@pytest.mark.parametrize("factory", ["example_factories:mlp", "example_factories:mlp_no_batch_arg"])
def test_trace_of_an_mlp_matches_a_hand_derivation(cli, factory):
    b = 64
    code, out, err = cli("trace", factory, "--batch", str(b), "--precision", "fp32", "--optimizer", "sgd",
                         "--device", "cpu", "--json")
    assert code == 0, err
    d = json.loads(out)
    params = 256 * 1024 + 1024 + 1024 * 10 + 10
    assert d["params"] == params
    m = d["memory"]
    assert m["weights"] == 4 * params and m["gradients"] == 4 * params and m["optimizer_states"] == 0
    # saved for backward (hand derivation, fp32): ReLU's output (b×1024), kept by ReLU and the second Linear; the
    # first Linear's output dies inside ReLU's forward; x is the batch (category "input"); + the 4-byte loss
    assert m["activations"] == 4 * b * 1024 + 4
    assert m["at_peak"].get("inputs") == 4 * b * 256
    # the peak can be no lower than weights + all gradients
    assert m["peak"] >= 8 * params


def test_trace_bad_factory_is_one_line(cli):
    code, _, err = cli("trace", "no_such_module:build")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "factory" in err
