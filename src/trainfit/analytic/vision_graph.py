"""An image classifier's training forward as a list of ops with their tensor bytes (no torch): what each op makes,
what it keeps for backward and what its backward makes, for the analytic vision engine (vision.py), and the
parameter count of every vision family.

Op semantics (PyTorch 2.13 tools/autograd/derivatives.yaml; the HF modules of transformers 5.24):
- conv2d (convolution_backward: `input, weight` saved): keeps its input; FLOPs 2·K·K·(Cin/groups)·Cout·Hout·Wout
  per image (a multiply-add per weight per output pixel; He et al. 2016 count multiply-adds, half this).
- linear (addmm/mm: mat1, mat2 saved): keeps its input and weight; FLOPs 2·in·out per row.
- batch_norm in training (native_batch_norm/cudnn_batch_norm: input, weight, result1, result2 saved): keeps its
  input and save_mean + save_invstd (C fp32 each); layer_norm (native_layer_norm: input, mean, rstd): keeps its
  input and mean + rstd (one fp32 per normalised row each).
- relu (threshold_backward(grad, result)): keeps its output; gelu (gelu_backward(grad, self)): keeps its input;
  mul by a parameter (ConvNeXt's layer scale: mul_tensor_backward of both): keeps the other factor.
- max_pool2d_with_indices: keeps its input and the int64 indices (output-sized); adaptive_avg_pool2d keeps its
  input; mean over H, W keeps nothing (its backward needs the shape only).
- residual adds keep nothing and hand their gradient to both branches without a copy; ResNet's is in place
  (`hidden_state += residual`, modeling_resnet.py:134,176); permutes and views allocate nothing.
- cross_entropy = log_softmax (keeps its fp32 output) + nll_loss.
Autocast (CUDA lists, aten/src/ATen/autocast_mode.h): conv2d and linear run in 16 bits: an fp32 input is cast and
the cast is what they keep; the weight's 16-bit cast is cached for the forward and kept by the op (the bias's
cast is not kept: addmm and convolution do not save it). layer_norm runs in fp32 (its 16-bit input is cast up and
kept); batch_norm is on neither list (16-bit input, fp32 weight and statistics); gelu and relu keep their input's
dtype; a 16-bit tensor times an fp32 parameter promotes to fp32.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import SetupError
from ..spec import VisionSpec

INT64 = 8
FP32 = 4
HALF = 2


@dataclass(frozen=True)
class Op:
    name: str
    kind: str
    ins: tuple[str, ...]  # input tensors by name
    out: str  # the output tensor's name
    out_bytes: int
    saves: tuple[str, ...] = ()  # tensors (made by other ops) the op keeps for backward
    own_saved: tuple[int, ...] = ()  # tensors (bytes) the op makes and keeps: statistics, indices, autocast casts
    tensors: tuple[int, ...] = ()  # the op's parameter tensors (elements), each with its gradient
    cast_params: bool = False  # under autocast its parameters' gradients come 16-bit first, then cast to fp32
    grads_in: tuple[int, ...] = ()  # bytes of the gradient it makes for each input (0: none)
    bwd_temp: tuple[int, ...] = ()  # other tensors (bytes) its backward holds at its high point
    fwd_temp: tuple[int, ...] = ()  # tensors (bytes) it makes and frees within its forward
    flops: int = 0  # forward FLOPs, whole batch
    alias: bool = False  # the output shares the first input's storage (in-place add, permute, view)
    passes_grad: bool = False  # the backward hands the output's gradient to every input as is (adds, views)
    # conv / linear: the implicit GEMM of one group, (m, n, k) = (batch·Hout·Wout or rows, Cout/groups,
    # Cin/groups·K·K or in), and the groups (conv only; > 1: ConvNeXt's depthwise conv, groups = channels)
    gemm: tuple[int, int, int] = ()
    groups: int = 1
    cast_in: int = 0  # bytes of the autocast cast of its input that it computes from (0: none)
    attn: tuple[int, int, int] = ()  # sdpa: (batch·heads, rows, head_dim)
    holds: tuple[str, ...] = ()  # tensors a caller's Python local keeps alive until this op has run
    block: str = ""  # the checkpointable block (a transformers GradientCheckpointingLayer) the op runs in

    @property
    def params(self) -> int:
        return sum(self.tensors)


def _out(size: int, k: int, s: int, p: int) -> int:
    return (size + 2 * p - k) // s + 1


class Net:
    """Builds the op list for one precision: `act` bytes of the compute dtype, `weight` bytes of the parameters,
    `autocast` whether the forward runs under torch.autocast. Each tensor has its elements per image, its dtype,
    its last dimension (what a linear or a LayerNorm reads) and, for NCHW maps, (channels, side)."""

    def __init__(self, batch: int, act: int, weight: int, autocast: bool):
        self.b, self.act, self.weight, self.autocast = batch, act, weight, autocast
        self.ops: list[Op] = []
        self.per: dict[str, int] = {}
        self.dt: dict[str, int] = {}
        self.last: dict[str, int] = {}
        self.geom: dict[str, tuple[int, int]] = {}
        self.n = 0

    def elems(self, t: str) -> int:
        return self.b * self.per[t]

    def new(self, what: str, per: int, dt: int, last: int, geom: tuple[int, int] | None = None) -> str:
        self.n += 1
        t = f"{what}#{self.n}"
        self.per[t], self.dt[t], self.last[t] = per, dt, last
        if geom:
            self.geom[t] = geom
        return t

    def like(self, x: str, what: str, dt: int | None = None) -> str:
        return self.new(what, self.per[x], self.dt[x] if dt is None else dt, self.last[x], self.geom.get(x))

    def input(self, channels: int, side: int) -> str:
        t = "pixel_values"
        self.per[t], self.dt[t], self.last[t], self.geom[t] = channels * side * side, self.weight, side, (channels, side)
        return t

    def _lowp(self, x: str) -> tuple[int, tuple[int, ...], tuple[str, ...]]:
        """(dtype bytes a conv/linear computes in, the autocast cast of x it keeps, x if kept as is)."""
        if self.autocast and self.dt[x] != HALF:
            return HALF, (self.elems(x) * HALF,), ()
        return (HALF if self.autocast else self.dt[x]), (), (x,)

    def _weighted(self, name, kind, x, y, dt, casts, saves, w, bias_len, flops, gemm, groups=1) -> None:
        """A conv or linear: keeps its input (or its cast) and its weight's 16-bit cast under autocast; makes the
        input's gradient (a kept cast's gradient first in its dtype: ToCopyBackward0 then makes x's; the images
        need none)."""
        grads = (0,) if x == "pixel_values" else (self.elems(x) * self.dt[x],)
        tmp = () if x == "pixel_values" else casts
        self.ops.append(Op(name, kind, (x,), y, self.elems(y) * dt, saves=saves,
                           own_saved=casts + ((w * HALF,) if self.autocast else ()),
                           tensors=(w, bias_len) if bias_len else (w,), cast_params=self.autocast, grads_in=grads,
                           bwd_temp=tmp, flops=flops, gemm=gemm, groups=groups, cast_in=sum(casts)))

    def conv(self, x: str, cout: int, k: int, s: int, name: str, p: int | None = None, groups: int = 1,
             bias: bool = False) -> str:
        cin, side = self.geom[x]
        side_o = _out(side, k, s, k // 2 if p is None else p)
        w = k * k * cin // groups * cout
        dt, casts, saves = self._lowp(x)
        y = self.new(name, cout * side_o * side_o, dt, side_o, (cout, side_o))
        # cuDNN's implicit GEMM (NVIDIA "Convolutional Layers User's Guide", docs.nvidia.com/deeplearning/performance/
        # dl-performance-convolutional, §"Convolution Algorithms", implicit GEMM dimensions; CUTLASS docs
        # implicit_gemm_convolution "Mapping Convolution to GEMM"): M = N·P·Q output pixels, N = K output channels,
        # K = C·R·S input channels × filter taps, per group. NB: the guide pads C to a multiple of 4 (TF32) / 8
        # (fp16) for tensor cores, e.g. the 3-channel stem: not modelled (under by up to 8/3 on the stem's GEMM)
        gemm = (self.b * side_o * side_o, cout // groups, cin // groups * k * k)
        self._weighted(name, "conv", x, y, dt, casts, saves, w, cout if bias else 0, 2 * w * side_o * side_o * self.b,
                       gemm, groups)
        return y

    def linear(self, x: str, out: int, name: str, bias: bool = True) -> str:
        width = self.last[x]
        rows = self.per[x] // width
        dt, casts, saves = self._lowp(x)
        geom = (out, self.geom[x][1]) if x in self.geom else None  # a channels-last map stays a map
        y = self.new(name, rows * out, dt, out, geom)
        self._weighted(name, "linear", x, y, dt, casts, saves, width * out, out if bias else 0,
                       2 * width * out * rows * self.b, (rows * self.b, out, width))
        return y

    def bn(self, x: str, name: str) -> str:
        c, _ = self.geom[x]
        y = self.like(x, name)
        self.ops.append(Op(name, "bn", (x,), y, self.elems(x) * self.dt[x], saves=(x,), own_saved=(c * FP32, c * FP32),
                           tensors=(c, c), grads_in=(self.elems(x) * self.dt[x],)))
        return y

    def layernorm(self, x: str, name: str) -> str:
        """LayerNorm over the last dimension: in fp32 under autocast (its input cast up and kept)."""
        n, width = self.elems(x), self.last[x]
        dt = FP32 if self.autocast else self.dt[x]
        cast = (n * FP32,) if dt != self.dt[x] else ()
        y = self.like(x, name, dt)
        self.ops.append(Op(name, "ln", (x,), y, n * dt, saves=() if cast else (x,),
                           own_saved=cast + (n // width * FP32,) * 2, tensors=(width, width),
                           grads_in=(n * self.dt[x],), bwd_temp=cast))
        return y

    def relu(self, x: str, name: str) -> str:
        y = self.like(x, name)
        self.ops.append(Op(name, "relu", (x,), y, self.elems(x) * self.dt[x], saves=(y,),
                           grads_in=(self.elems(x) * self.dt[x],)))
        return y

    def gelu(self, x: str, name: str) -> str:
        y = self.like(x, name)
        self.ops.append(Op(name, "gelu", (x,), y, self.elems(x) * self.dt[x], saves=(x,),
                           grads_in=(self.elems(x) * self.dt[x],)))
        return y

    def scale(self, x: str, name: str) -> str:
        """x times a per-channel parameter (ConvNeXt's layer scale), promoted to the parameter's dtype. Its
        backward makes grad·x (reduced to the parameter's gradient) and grad·gamma in the promoted dtype, then
        cast to x's dtype where they differ."""
        dt = max(self.dt[x], self.weight)
        n = self.elems(x)
        y = self.like(x, name, dt)
        self.ops.append(Op(name, "mul", (x,), y, n * dt, saves=(x,), tensors=(self.last[x],),
                           grads_in=(n * self.dt[x],), bwd_temp=(n * dt,) + ((n * dt,) if dt != self.dt[x] else ())))
        return y

    def maxpool(self, x: str, name: str) -> str:
        c, side = self.geom[x]
        side_o = _out(side, 3, 2, 1)
        y = self.new(name, c * side_o * side_o, self.dt[x], side_o, (c, side_o))
        self.ops.append(Op(name, "maxpool", (x,), y, self.elems(y) * self.dt[x], saves=(x,),
                           own_saved=(self.elems(y) * INT64,), grads_in=(self.elems(x) * self.dt[x],)))
        return y

    def add(self, x: str, r: str, name: str, in_place: bool = False) -> str:
        """x + r: keeps nothing; an input narrower than the promoted output gets its gradient cast (a new tensor)."""
        y = self.like(x, name, max(self.dt[x], self.dt[r]))
        casts = tuple(self.elems(t) * self.dt[t] if self.dt[t] < self.dt[y] else 0 for t in (x, r))
        self.ops.append(Op(name, "add", (x, r), y, 0 if in_place else self.elems(y) * self.dt[y], alias=in_place,
                           passes_grad=True, grads_in=casts if any(casts) else ()))
        return y

    def permute(self, x: str, name: str, channels_last: bool) -> str:
        """NCHW <-> NHWC view: no bytes; the last dimension becomes the channels (or the width)."""
        c, side = self.geom[x]
        y = self.new(name, self.per[x], self.dt[x], c if channels_last else side, (c, side))
        self.ops.append(Op(name, "view", (x,), y, 0, alias=True, passes_grad=True))
        return y

    def pool(self, x: str, name: str, keeps_input: bool) -> str:
        """Global average pool to (batch, C): adaptive_avg_pool2d keeps its input, mean([-2, -1]) does not."""
        c, _ = self.geom[x]
        y = self.new(name, c, self.dt[x], c)
        self.ops.append(Op(name, "pool", (x,), y, self.elems(y) * self.dt[x], saves=(x,) if keeps_input else (),
                           grads_in=(self.elems(x) * self.dt[x],)))
        return y

    def tokens(self, x: str, name: str) -> str:
        """ViT's patches: (B, H, g, g) -> flatten(2).transpose(1, 2) = (B, g·g, H), a view."""
        c, _ = self.geom[x]
        y = self.new(name, self.per[x], self.dt[x], c)
        self.ops.append(Op(name, "view", (x,), y, 0, alias=True, passes_grad=True))
        return y

    def prepend(self, x: str, name: str) -> str:
        """torch.cat((cls_token.expand(B, -1, -1), x), dim=1): one more row; cat keeps nothing and autocast's
        promote list casts a 16-bit x up to the fp32 token's dtype (a copy made and freed in the forward). Its
        backward's slice of the gradient, cast back to x's dtype (or made contiguous for the patch conv's backward:
        NB the same bytes), is x's gradient; the token's is the batch sum."""
        width = self.last[x]
        dt = max(self.dt[x], self.weight)
        y = self.new(name, self.per[x] + width, dt, width)
        self.ops.append(Op(name, "cat", (x,), y, self.elems(y) * dt, tensors=(width,),
                           grads_in=(self.elems(x) * self.dt[x],),
                           fwd_temp=(self.elems(x) * dt,) if dt != self.dt[x] else ()))
        return y

    def add_param(self, x: str, name: str) -> str:
        """x + a parameter of x's per-image shape (ViT's position embeddings): a new tensor, nothing kept; the
        gradient passes to x as is, the parameter's is the batch sum."""
        y = self.like(x, name, max(self.dt[x], self.weight))
        self.ops.append(Op(name, "add", (x,), y, self.elems(y) * self.dt[y], tensors=(self.per[x],),
                           passes_grad=True))
        return y

    def attention(self, q: str, k: str, v: str, heads: int, name: str) -> str:
        """F.scaled_dot_product_attention as HF's sdpa calls it on CUDA: the flash kernel (16-bit) or the
        memory-efficient one (fp32). Both keep q, k, v, their output and an fp32 logsumexp per head and row — the
        memory-efficient kernel's padded to a multiple of 32 rows (aten _scaled_dot_product_efficient_attention's
        meta: ceil(M / 32) * 32) — and two int64 philox scalars (seed, offset); the output is written in the
        (B, N, heads, d) layout, so HF's transpose + reshape + contiguous copies nothing. The backward makes the
        three input gradients (flash: plus softmax_d, fp32 per head and row). NB: kernel workspaces are not
        counted."""
        rows = self.per[q] // self.last[q]
        dt = self.dt[q]
        lse_rows = rows if dt == HALF else -(-rows // 32) * 32
        y = self.like(q, name)
        g = self.elems(q) * dt
        softmax_d = (self.b * heads * rows * FP32,) if dt == HALF else ()
        self.ops.append(Op(name, "sdpa", (q, k, v), y, g, saves=(q, k, v, y),
                           own_saved=(self.b * heads * lse_rows * FP32, INT64, INT64), grads_in=(g, g, g),
                           bwd_temp=softmax_d, flops=4 * self.b * rows * rows * self.last[q],
                           attn=(self.b * heads, rows, self.last[q] // heads)))
        return y

    def first_row(self, x: str, name: str) -> str:
        """hidden_states[:, 0, :]: a view of the first row (a linear keeping it keeps the whole tensor's storage);
        its backward (select_backward) makes a zero-filled gradient of the whole tensor."""
        y = self.new(name, self.last[x], self.dt[x], self.last[x])
        self.ops.append(Op(name, "select", (x,), y, 0, alias=True, grads_in=(self.elems(x) * self.dt[x],)))
        return y

    def loss(self, logits: str) -> None:
        """cross_entropy in fp32 (autocast's fp32 list): log_softmax keeps its fp32 output, nll_loss its
        total_weight (an fp32 scalar: derivatives.yaml nll_loss_forward); the backward holds
        nll_loss_backward's and log_softmax_backward's fp32 gradients, then the logits' own."""
        n = self.elems(logits)
        self.ops.append(Op("loss", "loss", (logits,), "loss", FP32, own_saved=(n * FP32, FP32),
                           grads_in=(n * self.dt[logits],), bwd_temp=(n * FP32, n * FP32),
                           fwd_temp=(n * FP32,) if self.dt[logits] != FP32 else ()))


def resnet_ops(spec: VisionSpec, net: Net, image: int) -> list[Op]:
    """The forward of transformers' ResNetForImageClassification (modeling_resnet.py:39-347)."""
    x = net.conv(net.input(spec.channels, image), spec.stem, 7, 2, "embedder.convolution")
    x = net.relu(net.bn(x, "embedder.normalization"), "embedder.activation")
    x = net.maxpool(x, "embedder.pooler")
    cin = spec.stem
    for i, (width, depth) in enumerate(zip(spec.widths, spec.depths)):
        for j in range(depth):
            stride = (2 if (i > 0 or spec.downsample_in_first_stage) else 1) if j == 0 else 1
            x = _resnet_block(net, x, cin, width, stride, spec, f"stages.{i}.layers.{j}")
            cin = width
    x = net.pool(x, "pooler", keeps_input=True)  # AdaptiveAvgPool2d((1, 1)), then Flatten (a view)
    net.loss(net.linear(x, spec.num_labels, "classifier"))
    return net.ops


def _resnet_block(net: Net, x: str, cin: int, cout: int, stride: int, spec: VisionSpec, name: str) -> str:
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
    return net.relu(net.add(h, r, f"{name}.add", in_place=True), f"{name}.activation")



def convnext_ops(spec: VisionSpec, net: Net, image: int) -> list[Op]:
    """The forward of transformers' ConvNextForImageClassification (modeling_convnext.py:39-330): the patchify
    stem (conv, channels-first LayerNorm), per stage a downsampling LayerNorm + 2x2 conv (stages > 0) and the
    blocks, then mean over H, W, LayerNorm, classifier. drop_path_rate 0 (the catalog's): DropPath is the identity."""
    x = net.conv(net.input(spec.channels, image), spec.widths[0], spec.patch, spec.patch, "embeddings.patch", p=0,
                 bias=True)
    x = _channels_first_norm(net, x, "embeddings.layernorm")
    for i, (width, depth) in enumerate(zip(spec.widths, spec.depths)):
        if i > 0:
            x = _channels_first_norm(net, x, f"stages.{i}.downsampling.0")
            x = net.conv(x, width, 2, 2, f"stages.{i}.downsampling.1", p=0, bias=True)
        for j in range(depth):
            x = _convnext_block(net, x, spec, f"stages.{i}.layers.{j}")
    x = net.pool(x, "mean", keeps_input=False)
    x = net.layernorm(x, "layernorm")
    net.loss(net.linear(x, spec.num_labels, "classifier"))
    return net.ops


def _channels_first_norm(net: Net, x: str, name: str) -> str:
    """ConvNextLayerNorm(data_format="channels_first"): permute, LayerNorm over C, permute back (views)."""
    return net.permute(net.layernorm(net.permute(x, f"{name}.permute", True), name), f"{name}.back", False)


def _convnext_block(net: Net, x: str, spec: VisionSpec, name: str) -> str:
    """ConvNextLayer (modeling_convnext.py:114-154): depthwise 7x7 conv, permute, LayerNorm, pwconv1 (C -> 4C),
    GELU, pwconv2 (4C -> C), layer scale, permute back, + the residual (out of place)."""
    c, _ = net.geom[x]
    h = net.conv(x, c, 7, 1, f"{name}.dwconv", groups=c, bias=True)
    h = net.layernorm(net.permute(h, f"{name}.permute", True), f"{name}.layernorm")
    h = net.linear(net.gelu(net.linear(h, 4 * c, f"{name}.pwconv1"), f"{name}.act"), c, f"{name}.pwconv2")
    if spec.layer_scale:
        h = net.scale(h, f"{name}.layer_scale")
    return net.add(x, net.permute(h, f"{name}.back", False), f"{name}.add")


def vit_ops(spec: VisionSpec, net: Net, image: int) -> list[Op]:
    """The forward of transformers' ViTForImageClassification (modeling_vit.py: ViTPatchEmbeddings, ViTEmbeddings,
    pre-norm ViTLayer, the final LayerNorm, the classifier on the [CLS] row; dropout 0: the identity; sdpa)."""
    h = spec.widths[0]
    x = net.conv(net.input(spec.channels, image), h, spec.patch, spec.patch, "embeddings.patch", p=0, bias=True)
    x = net.add_param(net.prepend(net.tokens(x, "embeddings.tokens"), "embeddings.cls"), "embeddings.positions")
    for i in range(spec.depths[0]):
        name, first = f"layer.{i}", len(net.ops)
        y = net.layernorm(x, f"{name}.layernorm_before")
        q, k, v = (net.linear(y, h, f"{name}.{p}", bias=spec.qkv_bias) for p in ("q", "k", "v"))
        a = net.linear(net.attention(q, k, v, spec.heads, f"{name}.sdpa"), h, f"{name}.o")
        # ViTLayer.forward's local hidden_states keeps each norm's output until self.attention / self.mlp returns
        # (modeling_vit.py:273-283): after the o projection and fc2 (it matters when nothing saves it: autocast's
        # casts, checkpointing)
        net.ops[-1] = replace(net.ops[-1], holds=(y,))
        x = net.add(a, x, f"{name}.residual_1")
        y = net.layernorm(x, f"{name}.layernorm_after")
        y2 = net.linear(net.gelu(net.linear(y, spec.intermediate, f"{name}.fc1"), f"{name}.act"), h, f"{name}.fc2")
        net.ops[-1], y = replace(net.ops[-1], holds=(y,)), y2
        x = net.add(y, x, f"{name}.residual_2")
        net.ops[first:] = [replace(op, block=name) for op in net.ops[first:]]  # ViTLayer.forward, checkpointable
    x = net.layernorm(x, "layernorm")
    net.loss(net.linear(net.first_row(x, "cls_row"), spec.num_labels, "classifier"))
    return net.ops


def checkpointed(ops: list[Op], recompute: str) -> dict[str, tuple[int, int]]:
    """--recompute full: {block: (its first op, its last op that keeps a tensor)} for every block transformers
    checkpoints (vision_setup.CHECKPOINTS). Non-reentrant torch.utils.checkpoint (transformers' default,
    modeling_utils.py:3157-3158 use_reentrant False) keeps the block's input and, under its pack hook, no tensor
    of the block; the backward's first unpack reruns the block's forward, which stops once its last saved tensor
    is packed (early_stop, torch/utils/checkpoint.py _recomputation_hook): the ops after it do not rerun."""
    if recompute != "full":
        return {}
    blocks: dict[str, tuple[int, int]] = {}
    for i, op in enumerate(ops):
        if op.block:
            first, last = blocks.get(op.block, (i, i))
            blocks[op.block] = (first, i if (op.saves or op.own_saved) else last)
    return blocks


BUILDERS = {"resnet": resnet_ops, "convnext": convnext_ops, "vit": vit_ops}


def vision_ops(spec: VisionSpec, batch: int, image: int, act: int = FP32, weight: int = FP32,
               autocast: bool = False) -> list[Op]:
    """The op list of one training forward (a ResNet or a ConvNeXt) at this batch, image size and precision."""
    if spec.family in BUILDERS:
        return BUILDERS[spec.family](spec, Net(batch, act, weight, autocast), image)
    raise SetupError(f"the analytic engine models resnet, convnext and vit; {spec.name} is {spec.family}: use "
                     "--engine trace or --engine measure (transformers builds it)")


def vision_params(spec: VisionSpec) -> int:
    """Parameters of the transformers model: the sum of the op list's parameter tensors (checked against numel()
    on the meta device in tests/models/test_vision.py)."""
    return sum(op.params for op in vision_ops(spec, 1, spec.image_size))
