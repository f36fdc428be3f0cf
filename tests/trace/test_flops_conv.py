"""FLOPs of a grouped convolution's backward (trace/flops.py CONV_BACKWARD_FLOPS): torch 2.13's flop_counter.py
conv_backward_flop counts the weight gradient of a grouped convolution as if all input channels met all output
channels, `groups` times its products (ConvNeXt-tiny's depthwise 7x7 convolutions made its traced backward 68.6
GFLOP per image against 17.8 by the analytic engine).

Independent sources: the same products as one ungrouped convolution per group, counted by torch's own formula
(which is right at groups = 1); and the analytic engine's count of ConvNeXt-tiny (analytic/vision.py, op by op)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from trainfit.trace.flops import CONV_BACKWARD_FLOPS


@pytest.mark.parametrize("groups, c_in, c_out, transposed", [(8, 8, 8, False), (4, 8, 16, False), (1, 6, 10, False),
                                                             (2, 8, 4, True)])
def test_grouped_conv_backward_counts_as_one_conv_per_group(groups, c_in, c_out, transposed):
    torch.manual_seed(0)
    x = torch.randn(2, c_in, 12, 12, requires_grad=True)
    conv = F.conv_transpose2d if transposed else F.conv2d
    shape = (c_in, c_out // groups, 3, 3) if transposed else (c_out, c_in // groups, 3, 3)
    w = torch.randn(*shape, requires_grad=True)

    with FlopCounterMode(display=False, custom_mapping=CONV_BACKWARD_FLOPS) as ours:
        conv(x, w, padding=1, groups=groups).sum().backward()
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None

    per_in, per_w = c_in // groups, shape[0] // groups
    with FlopCounterMode(display=False) as torchs:  # groups = 1 each: torch's own formula holds
        outs = [conv(x[:, g * per_in:(g + 1) * per_in], w[g * per_w:(g + 1) * per_w], padding=1)
                for g in range(groups)]
        torch.cat(outs, 1).sum().backward()
    torch.testing.assert_close(x.grad, gx)  # the same products
    torch.testing.assert_close(w.grad, gw, rtol=1e-4, atol=1e-4)
    assert ours.get_total_flops() == torchs.get_total_flops() > 0


def test_convnext_backward_is_twice_its_forward_less_the_image_gradient():
    """ConvNeXt-tiny traced: the forward as the analytic engine counts it; the backward its d(input) and d(weight),
    each the forward's products, less the stem's d(input) (the image needs no gradient), which the analytic engine
    counts (its NB)."""
    from trainfit import engines
    from trainfit.api import load_spec
    from trainfit.setup import Setup

    spec = load_spec("convnext-tiny")
    setup = Setup(mode="train", batch=1, device="cpu", precision="fp32", optimizer="sgd")
    tr, an = engines.trace(spec, setup), engines.analytic(spec, setup)
    stem = 2 * 56 * 56 * 96 * 3 * 4 * 4  # its 4x4 stride-4 convolution, 3 -> 96 channels, at 224 / 4
    assert tr.flops.forward == an.flops.forward
    assert tr.flops.backward == an.flops.backward - stem
