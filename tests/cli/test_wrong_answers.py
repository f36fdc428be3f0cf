"""Answers that were silently wrong, and the inputs that raised a traceback, each checked against an independent
source: the other run of the same model, the stack's own facts, the engine's documented rule."""
import json

import pytest


def _json(cli, *args) -> dict:
    code, out, err = cli(*args, "--json")
    assert code == 0, err
    return json.loads(out)


def _refused(cli, *args) -> str:
    code, out, err = cli(*args)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, (code, err)
    assert err.startswith("error:") and "Traceback" not in err, err
    return err


def test_compile_on_a_model_it_does_not_model_says_what_the_time_is():
    """BERT's block is not the Llama block compile_effects derives: its kernels stay eager's, and only the host's
    issue wait goes (any compiled step launches from generated code). The note said "time as eager" while the step
    dropped from 37.6 to 8.5 ms; the compiled step is the eager step less its host-issue term."""
    from trainfit import estimate

    eager = estimate("bert-base", gpu="H100-80GB")
    compiled = estimate("bert-base", gpu="H100-80GB", compile=True)
    e, c = eager.detail.step_time, compiled.detail.step_time
    assert e.host_issue > 0 and c.compute == e.compute  # unfused: the same kernels
    assert c.step_seconds == pytest.approx(e.step_seconds - e.host_issue, rel=1e-9)
    note = next(n for n in compiled.notes if n.startswith("compile:"))
    assert "unfused" in note and "host's kernel issue" in note and "time as eager" not in note
