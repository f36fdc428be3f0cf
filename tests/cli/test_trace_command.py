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


def test_trace_reports_the_batch_it_ran(cli):
    """The estimate's setup is the example batch's (not --batch 1 × --seq 2048), and FLOPs are per sample where the
    inputs hold no token ids: hand derivation, 2·(256·1024 + 1024·10) forward FLOPs per sample, and the backward's
    2× of the second layer's and the first's weight gradient only (its input needs none)."""
    code, out, err = cli("trace", "example_factories:mlp_no_batch_arg", "--precision", "fp32", "--optimizer", "sgd",
                         "--device", "cpu", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["setup"]["batch"] == 4 and d["detail"]["example_batch"] == {"input": [[4, 256], "float32"]}
    fwd = 2 * (256 * 1024 + 1024 * 10)
    bwd = 2 * 256 * 1024 + 2 * 2 * 1024 * 10
    assert d["flops"]["per_token"] == fwd + bwd
    code, out, err = cli("trace", "example_factories:mlp_no_batch_arg", "--device", "cpu")
    words = " ".join(out.split())  # (the caption wraps at the terminal's width)
    assert code == 0 and "micro-batch 4 (input (4, 256) float32)" in words and "seq 2048" not in words, out
    assert "model FLOPs per sample" in words


def test_trace_of_token_ids_takes_their_length_as_seq(cli):
    code, out, err = cli("trace", "example_factories:token_model", "--precision", "fp32", "--device", "cpu", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert (d["setup"]["batch"], d["setup"]["seq"]) == (4, 16) and "example_batch" not in d["detail"]


def test_factory_calling_sys_exit_is_one_line(cli):
    code, out, err = cli("trace", "example_factories:exits", "--device", "cpu")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "called sys.exit(3)" in err, (code, out, err)
