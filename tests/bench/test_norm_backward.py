"""HF's eager RMSNorm backward, kernel by kernel, against the H200 profile of a real llama-3.1-8b bf16 step
(bench/results/gpu/H200-2026-11-27-unrecorded-10-truth.json, torch.profiler's device time per aten op and shape). Ground truth of
rule 1. LlamaRMSNorm's forward is six eager ops; autograd's formulas (derivatives.yaml) make ten backward kernels per
norm (ops.norm_ops bwd_ops), which the generic one-pass rule had counted at about half their bytes."""
import ast
from bench import data

RUN = data.gpu_run("H200-2026-11-27-unrecorded-10-truth")
CASE = next(c for c in RUN["cases"] if c["id"] == "llama-3.1-8b-bf16")
ROW = [2, 1024, 4096]  # the norm's input: batch x seq x hidden


def _aten(op: str, shapes: list) -> tuple[int, float]:
    """(calls, seconds) of an aten op with these input shapes in the profile."""
    rows = [a for a in CASE["measured"]["profile"]["aten_kernels"]
            if a["op"] == op and [s for s in ast.literal_eval(a["shapes"]) if s] == shapes]
    return sum(a["count"] for a in rows), sum(a["seconds"] for a in rows)


def _case():
    """(model, GPU, ops.Shape) of the profiled step."""
    from trainfit.analytic.ops import shape_of
    from trainfit.analytic.precision import state_bytes
    from trainfit.analytic.timing import compute_dtype
    from trainfit.hardware import get_gpu
    from trainfit.models.resolve import load_model
    from trainfit.setup import Setup

    spec, setup = load_model(CASE["model"]), Setup(device="cuda", **CASE["settings"])
    return spec, get_gpu("H200"), shape_of(spec, setup, state_bytes(setup), compute_dtype(setup))


def test_rmsnorm_backward_kernels_match_the_profile():
    """Per norm (65: two per layer and the final one): the weight's (grad·w, grad·y, Σ over tokens), r's (grad·r,
    grad·x, Σ over the row), the mean's (grad / h, expanded) and pow's (2·x, grad·2·x). Their count is the profile's
    aten calls exactly, plus the weight's column sum's memset of its semaphores (ops.column_sum_launches: a runtime
    call beside the kernel, no aten op of its own); their time within 25 % (was -45 % with one pass of bytes per
    backward op; now -20 %: the weight's sum over the tokens, a column reduction, runs at 0.16 of the streaming
    bandwidth where the model takes the row reduction's 0.70, NB)."""
    from trainfit.analytic import roofline
    from trainfit.analytic.ops import backward, norm_ops
    spec, gpu, sh = _case()
    names = (".weight.backward", ".weight.backward_w", ".weight.grad", ".mul.backward", ".mul.backward_r",
             ".mul.backward_sum", ".mean.backward", ".pow.backward", ".pow.backward_mul")
    ops = [o for o in backward(norm_ops(spec, "n", sh.tokens, sh, "g")) if o.name.endswith(names)]
    norms = 2 * spec.layers + 1
    kernels = norms * sum(o.kernels for o in ops)
    predicted = norms * sum(roofline.memory_seconds(gpu, o.nbytes, 0, o.access) for o in ops)
    same = _aten("aten::mul", [ROW, ROW])  # grad·y, grad·x, grad·2x
    bcast = _aten("aten::mul", [ROW, [2, 1024, 1]])  # forward x·r and backward grad·r: the same bytes
    parts = [same, (bcast[0] // 2, bcast[1] / 2), _aten("aten::sum", [ROW]), _aten("aten::div", [ROW]),
             _aten("aten::mul", [ROW]), _aten("aten::mul", [ROW, [4096]])]
    assert kernels - norms == sum(c for c, _ in parts) == 9 * norms, (kernels, parts)
    measured = sum(t for _, t in parts)
    assert abs(predicted / measured - 1) <= 0.25, (predicted, measured)


def test_swiglu_product_backward_reads_the_gradient_twice():
    """act(gate)·up's backward is two muls, grad·up and grad·act(gate), each reading the gradient (the generic rule
    read it once: -17 %). Forward and backward, 3 per layer, each 3 x 58.7 MB: within 10 % of the profile's."""
    from trainfit.analytic import roofline
    from trainfit.analytic.ops import backward, layer_forward
    spec, gpu, sh = _case()
    fwd = [o for o in layer_forward(spec, sh) if o.name == "act_mul"]
    ops = fwd + [o for o in backward(fwd)]
    calls, seconds = _aten("aten::mul", [[2, 1024, 14336], [2, 1024, 14336]])
    assert calls == spec.layers * sum(o.kernels for o in ops) == 3 * spec.layers
    predicted = spec.layers * sum(roofline.memory_seconds(gpu, o.nbytes, 0, o.access) for o in ops)
    assert abs(predicted / seconds - 1) <= 0.10, (predicted, seconds)
