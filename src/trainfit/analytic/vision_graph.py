"""An image classifier's training forward as a list of ops with their tensor sizes (no torch): what each op makes,
what it saves for backward and what its backward makes, for the analytic vision engine (vision.py), and the
parameter count of every vision family.

Op semantics (PyTorch 2.13 tools/autograd/derivatives.yaml; the HF modules of transformers 5.24):
- conv2d (convolution_backward: `input, weight` saved): keeps its input; FLOPs 2·K·K·(Cin/groups)·Cout·Hout·Wout
  per image (a multiply-add per weight per output pixel: He et al. 2016 count FLOPs as multiply-adds, half this).
  Under autocast (CUDA lower-precision list: conv2d) the input, if fp32, and the weight are cast to 16 bits; the
  weight's cast is cached while autocast runs and saved by the op (its backward frees it).
- batch_norm in training (native_batch_norm / cudnn_batch_norm: `input, weight, running_mean, running_var,
  result1, result2` saved): keeps its input (the conv's output) and save_mean + save_invstd, Cout fp32 each; it
  runs on 16-bit input with the fp32 weight under autocast (batch_norm is on neither autocast list).
- relu (threshold_backward(grad, result)): keeps its output (ResNet's ACT2FN["relu"] is nn.ReLU(), not in place).
- max_pool2d_with_indices: keeps its input and the int64 indices (output-sized).
- the residual `hidden_state += residual` (modeling_resnet.py:134,176) is in place: keeps nothing; its backward
  passes the gradient to both branches without a copy.
- adaptive_avg_pool2d: keeps its input (the last block's ReLU output, already kept); linear keeps its input and
  weight; cross_entropy = log_softmax (keeps its fp32 output; autocast's fp32 list) + nll_loss.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import SetupError
from ..spec import VisionSpec

INT64 = 8
FP32 = 4


@dataclass(frozen=True)
class Op:
    name: str
    kind: str  # conv, bn, relu, maxpool, add, avgpool, linear, loss
    ins: tuple[str, ...]  # input tensors by name
    out: str  # the output tensor's name
    out_elems: int
    saves: tuple[str, ...] = ()  # tensors the op keeps for backward
    own_saved: tuple[int, ...] = ()  # tensors (bytes) the op keeps itself: BN's save_mean/invstd, max_pool's indices (fp32/int64)
    weights: int = 0  # weight elements cast (autocast) and saved: conv / linear
    tensors: tuple[int, ...] = ()  # the op's parameter tensors (elements), each with its gradient
    stats: int = 0  # BN channels (running mean/var buffers)
    flops: int = 0  # forward FLOPs, whole batch
    in_place: bool = False  # the output is the first input's storage (the residual add)

    @property
    def params(self) -> int:
        return sum(self.tensors)


def _out(size: int, k: int, s: int, p: int) -> int:
    return (size + 2 * p - k) // s + 1


class _Net:
    """Builds the op list: tensor sizes are element counts for the whole batch."""

    def __init__(self, batch: int):
        self.b = batch
        self.ops: list[Op] = []
        self.size: dict[str, tuple[int, int]] = {}  # tensor -> (channels, side)
        self.n = 0

    def _name(self, what: str) -> str:
        self.n += 1
        return f"{what}#{self.n}"

    def conv(self, x: str, cout: int, k: int, s: int, name: str, p: int | None = None, groups: int = 1,
             bias: bool = False) -> str:
        cin, side = self.size[x]
        side_o = _out(side, k, s, k // 2 if p is None else p)
        w = k * k * cin // groups * cout
        y = self._name(name)
        self.size[y] = (cout, side_o)
        self.ops.append(Op(name, "conv", (x,), y, self.b * cout * side_o * side_o, saves=(x,), weights=w,
                           tensors=(w, cout) if bias else (w,), flops=2 * w * side_o * side_o * self.b))
        return y

    def bn(self, x: str, name: str) -> str:
        c, side = self.size[x]
        y = self._name(name)
        self.size[y] = (c, side)
        self.ops.append(Op(name, "bn", (x,), y, self.b * c * side * side, saves=(x,), own_saved=(c * FP32, c * FP32),
                           tensors=(c, c), stats=c, flops=4 * self.b * c * side * side))
        return y

    def relu(self, x: str, name: str) -> str:
        c, side = self.size[x]
        y = self._name(name)
        self.size[y] = (c, side)
        self.ops.append(Op(name, "relu", (x,), y, self.b * c * side * side, saves=(y,)))
        return y

    def maxpool(self, x: str, name: str) -> str:
        c, side = self.size[x]
        side_o = _out(side, 3, 2, 1)
        y = self._name(name)
        self.size[y] = (c, side_o)
        elems = self.b * c * side_o * side_o
        self.ops.append(Op(name, "maxpool", (x,), y, elems, saves=(x,), own_saved=(elems * INT64,)))
        return y

    def add_(self, x: str, r: str, name: str) -> str:
        y = self._name(name)
        self.size[y] = self.size[x]
        c, side = self.size[x]
        self.ops.append(Op(name, "add", (x, r), y, self.b * c * side * side, in_place=True))
        return y

    def head(self, x: str, labels: int) -> None:
        """AdaptiveAvgPool2d(1) -> Flatten -> Linear -> cross_entropy (modeling_resnet.py:296,344-347)."""
        c, side = self.size[x]
        pooled = self._name("pooler")
        self.size[pooled] = (c, 1)
        self.ops.append(Op("pooler", "avgpool", (x,), pooled, self.b * c, saves=(x,)))
        logits = self._name("classifier")
        self.size[logits] = (labels, 1)
        w = c * labels
        self.ops.append(Op("classifier", "linear", (pooled,), logits, self.b * labels, saves=(pooled,), weights=w + labels,
                           tensors=(w, labels), flops=2 * w * self.b))
        self.ops.append(Op("loss", "loss", (logits,), "loss", 1, own_saved=(self.b * labels * FP32,)))


def resnet_ops(spec: VisionSpec, batch: int, image: int) -> list[Op]:
    """The forward of transformers' ResNetForImageClassification (modeling_resnet.py:39-347)."""
    net = _Net(batch)
    net.size["pixel_values"] = (spec.channels, image)
    x = net.conv("pixel_values", spec.stem, 7, 2, "embedder.convolution")
    x = net.relu(net.bn(x, "embedder.normalization"), "embedder.activation")
    x = net.maxpool(x, "embedder.pooler")
    cin = spec.stem
    for i, (width, depth) in enumerate(zip(spec.widths, spec.depths)):
        for j in range(depth):
            stride = (2 if (i > 0 or spec.downsample_in_first_stage) else 1) if j == 0 else 1
            x = _block(net, x, cin, width, stride, spec, f"stages.{i}.layers.{j}")
            cin = width
    net.head(x, spec.num_labels)
    return net.ops


def _block(net: _Net, x: str, cin: int, cout: int, stride: int, spec: VisionSpec, name: str) -> str:
    """ResNetBasicLayer / ResNetBottleNeckLayer (modeling_resnet.py:113-178): the shortcut's conv + BN when the
    shape changes, else the identity."""
    h = x
    if spec.layer_type == "bottleneck":
        mid = cout // 4  # reduction = 4
        s1, s2 = (stride, 1) if spec.downsample_in_bottleneck else (1, stride)
        h = net.relu(net.bn(net.conv(h, mid, 1, s1, f"{name}.layer.0"), f"{name}.layer.0.bn"), f"{name}.layer.0.act")
        h = net.relu(net.bn(net.conv(h, mid, 3, s2, f"{name}.layer.1"), f"{name}.layer.1.bn"), f"{name}.layer.1.act")
        h = net.bn(net.conv(h, cout, 1, 1, f"{name}.layer.2"), f"{name}.layer.2.bn")
    else:
        h = net.relu(net.bn(net.conv(h, cout, 3, stride, f"{name}.layer.0"), f"{name}.layer.0.bn"), f"{name}.layer.0.act")
        h = net.bn(net.conv(h, cout, 3, 1, f"{name}.layer.1"), f"{name}.layer.1.bn")
    r = x
    if cin != cout or stride != 1:
        r = net.bn(net.conv(x, cout, 1, stride, f"{name}.shortcut", p=0), f"{name}.shortcut.bn")
    return net.relu(net.add_(h, r, f"{name}.add"), f"{name}.activation")


def vision_ops(spec: VisionSpec, batch: int, image: int) -> list[Op]:
    if spec.family == "resnet":
        return resnet_ops(spec, batch, image)
    raise SetupError(f"the analytic engine models ResNet-family CNNs; {spec.name} is {spec.family}: use "
                     "--engine trace or --engine measure (transformers builds it)")


def vision_params(spec: VisionSpec) -> int:
    """Parameters of the transformers model (checked against numel() on the meta device in tests/models)."""
    if spec.family == "resnet":
        return sum(op.params for op in resnet_ops(spec, 1, spec.image_size))
    if spec.family == "convnext":
        return _convnext_params(spec)
    return _vit_params(spec)


def _convnext_params(spec: VisionSpec) -> int:
    """modeling_convnext.py: the patchify stem (Conv2d(3, C0, patch, patch) + LayerNorm); per stage > 0 a
    downsampling LayerNorm + Conv2d(C, C', 2, 2); per block a depthwise 7x7 conv, a LayerNorm, pwconv1 (C -> 4C),
    pwconv2 (4C -> C) and the layer-scale gamma (C); the final LayerNorm and the classifier (all with biases)."""
    c0 = spec.widths[0]
    n = spec.channels * spec.patch * spec.patch * c0 + c0 + 2 * c0
    prev = c0
    for i, (c, d) in enumerate(zip(spec.widths, spec.depths)):
        if i > 0:
            n += 2 * prev + prev * c * 4 + c
        block = (49 * c + c) + 2 * c + (c * 4 * c + 4 * c) + (4 * c * c + c) + (c if spec.layer_scale else 0)
        n += d * block
        prev = c
    return n + 2 * prev + prev * spec.num_labels + spec.num_labels


def _vit_params(spec: VisionSpec) -> int:
    """modeling_vit.py: patch embedding Conv2d(3, H, P, P) with bias, [CLS] token, (N+1)·H positions; per layer q,
    k, v, output (H x H, biases as qkv_bias / always), intermediate (H -> I) and output (I -> H) with biases, two
    LayerNorms; the final LayerNorm; ViTForImageClassification's classifier (no pooler: add_pooling_layer=False)."""
    h, i = spec.widths[0], spec.intermediate
    tokens = spec.tokens(spec.image_size)
    emb = spec.channels * spec.patch * spec.patch * h + h + h + tokens * h
    layer = 3 * (h * h + (h if spec.qkv_bias else 0)) + h * h + h + h * i + i + i * h + h + 4 * h
    return emb + spec.depths[0] * layer + 2 * h + h * spec.num_labels + spec.num_labels
