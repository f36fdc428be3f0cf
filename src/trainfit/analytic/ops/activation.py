"""Cost functions of the MLP activation: one kernel, or HF's composite gelu_new / gelu_fast."""
from __future__ import annotations

from ...spec import ModelSpec
from ..activations import FP32
from .op import Op, Shape, add_backward, bwd_kernel, grad_cast, memory

def activation(spec: ModelSpec, name: str, x: float, sh: Shape, group: str) -> list[Op]:
    """The MLP activation over x elements: the cost function of the model's activation (ACTIVATIONS); one kernel
    where the stack fuses it (Megatron-core's bias-GeLU, megatron/core/fusions/fused_bias_gelu.py) or for SiLU,
    GeLU, ReLU."""
    cost = one_kernel if sh.fused_elementwise else ACTIVATIONS.get(spec.activation, one_kernel)
    return cost(spec.activation, name, x, sh, group)


def one_kernel(act: str, name: str, x: float, sh: Shape, group: str) -> list[Op]:
    a = sh.act
    return [memory(f"{name}.{act}0", x * a, x * a, "transformers activations.py", group, (x * a, x * a))]


def gelu_fast(act: str, name: str, x: float, sh: Shape, group: str) -> list[Op]:
    """HF's FastGELUActivation (activations.py). NB: counted as 8 kernels with one backward kernel each, not
    profiled."""
    a, passes = sh.act, 8
    return [memory(f"{name}.{act}{j}", x * a * (2 if j in (2, 5, 6, 7) else 1), x * a, "transformers activations.py",
                   group, (x * a if j == 0 else 0, x * a if j == passes - 1 else 0))
            for j in range(passes)]


def activation_out_bytes(spec: ModelSpec, sh: Shape) -> int:
    """Bytes per element of the MLP activation's output: fp32 for HF's gelu_new under autocast (gelu_new_out), so
    the next linear casts it back; else the activations'."""
    return gelu_new_out(sh) if spec.activation == "gelu_new" and not sh.fused_elementwise else sh.act


def gelu_new_out(sh: Shape) -> int:
    """gelu_new's pow runs in fp32 under autocast (torch's autocast fp32 op list, aten/src/ATen/autocast_mode.cpp
    `KERNEL_CUDA(pow, Tensor_Scalar, fp32)`) and type promotion carries fp32 through its sum and product."""
    return FP32 if sh.autocast else sh.act


def gelu_new(act: str, name: str, x: float, sh: Shape, group: str) -> list[Op]:
    """HF's NewGELUActivation (transformers 5.24 activations.py:65-66) `0.5 * input * (1.0 + torch.tanh(
    math.sqrt(2.0 / math.pi) * (input + 0.044715 * torch.pow(input, 3.0))))`, eager: A = 0.5·x, then x³, 0.044715·,
    x + ·, √(2/π)·, tanh, 1 + ·, A·B: 8 kernels; under autocast x is first cast up for pow (activation_out_bytes)
    and everything after pow, the output too, is fp32 (u bytes).
    Backward (tools/autograd/derivatives.yaml): A·B's two muls (grad·B, grad·A), tanh_backward, the three
    constant muls' one each, pow_backward's three (x.pow(2), 3·, grad·: FunctionsManual.cpp pow_backward), the two
    adds none; then x's three gradients (through A, the sum and pow) summed: 2 adds; 11. Under autocast also the
    casts of the fp32 gradients to the 16-bit operands (A's from A·B, x's from x + ·: engine.cpp validate_outputs)
    and pow's input cast back: 3 (14). The H200 gpt2 amp profile: per layer 4 mul(TT), 7 mul(·scalar), 2 pow, tanh,
    tanh_backward, 2 add_ and 4 [2, 1024, 3072] copies beside the forward's add(TT) and add(1 + ·)."""
    a, u = sh.act, gelu_new_out(sh)
    src = "transformers activations.py:65-66 NewGELUActivation"
    xa, xu = x * a, x * u

    def k(n, r, w, kernels=1):
        return bwd_kernel(f"{name}.gelu_new.{n}", r, w, kernels=kernels)
    # (name, reads, writes, backward kernels); x's three gradients are summed after A's, the last backward
    fwd = [("half", xa, xa, (k("half.backward", xa, xa), k("grad_sum", 4 * xa, 2 * xa, kernels=2)))]
    if u != a:  # autocast: x cast up for pow; its backward casts pow's gradient back
        fwd.append(("pow_cast", xa, xu, (k("pow_cast.backward", xu, xa),)))
    fwd += [("pow", xu, xu, (k("pow.backward_pow", xu, xu), k("pow.backward_scale", xu, xu),
                             k("pow.backward", 2 * xu, xu))),
            ("cube_scale", xu, xu, (k("cube_scale.backward", xu, xu),)),
            ("inner_add", xa + xu, xu, add_backward(f"{name}.gelu_new.inner_add", x, u, a)),
            ("inner_scale", xu, xu, (k("inner_scale.backward", xu, xu),)),
            ("tanh", xu, xu, (k("tanh.backward", 2 * xu, xu),)),
            ("one_plus", xu, xu, add_backward(f"{name}.gelu_new.one_plus", x, u, u)),
            ("product", xa + xu, xu, (k("product.backward_a", 2 * xu, xu), k("product.backward_b", xa + xu, xu),
                                      *grad_cast(f"{name}.gelu_new.product.grad_cast", x, u, a)))]
    last = len(fwd) - 1
    # compiled: one kernel reads x and writes the output (the first op's read, the last op's write)
    return [memory(f"{name}.gelu_new.{n}", r, w, src, group, (xa if j == 0 else 0, xa if j == last else 0), bwd_ops=b)
            for j, (n, r, w, b) in enumerate(fwd)]


def relu2(act: str, name: str, x: float, sh: Shape, group: str) -> list[Op]:
    """HF's ReLUSquaredActivation (transformers 5.24 activations.py:206-214): `torch.square(F.relu(input))`, eager:
    relu, then square (aten.pow with exponent 2): 2 kernels, in the input's dtype (neither is on an autocast list).
    Backward (tools/autograd/derivatives.yaml): pow_backward (FunctionsManual.cpp: `grad * (exp * self.pow(exp -
    1))`: relu's output to the power 1 (a copy), times 2, times the gradient: 3 kernels), then relu's
    threshold_backward on its output (1)."""
    a = sh.act
    xa = x * a
    src = "transformers activations.py:206-214 ReLUSquaredActivation"

    def k(n, r, w):
        return bwd_kernel(f"{name}.relu2.{n}", r, w)
    relu = memory(f"{name}.relu2.relu", xa, xa, src, group, (xa, 0),
                  bwd_ops=(k("relu.threshold_backward", 2 * xa, xa),))
    square = memory(f"{name}.relu2.square", xa, xa, src, group, (0, xa),
                    bwd_ops=(k("square.pow_one", xa, xa), k("square.scale", xa, xa), k("square.grad", 2 * xa, xa)))
    return [relu, square]


def liger_swiglu(name: str, x: float, sh: Shape) -> list[Op]:
    """Liger's LigerSiLUMulFunction over x elements (ops/swiglu.py at liger-kernel 0.8.5; analytic/liger.py): one
    Triton kernel reads the gate and up outputs and writes silu(gate)·up (:165); its backward one kernel reads the
    product's gradient and the saved gate and up and writes their gradients over them (:104-105). NB: the row-wise
    kernels are taken at the vector rate, as the eager chain's."""
    a = x * sh.act
    src = "liger ops/swiglu.py:240-272 LigerSiLUMulFunction"
    return [memory(f"{name}.liger_swiglu", 2 * a, a, src, "act", (2 * a, a), bwd_ops=(
        bwd_kernel(f"{name}.liger_swiglu.backward", 3 * a, 2 * a),))]


# the activations with their own cost function (the rest: one_kernel), by ModelSpec.activation
ACTIVATIONS = {"gelu_new": gelu_new, "gelu_fast": gelu_fast, "relu2": relu2}
