"""Model factories for `trainfit trace` tests (an MLP whose step we can derive by hand)."""
import torch
from torch import nn


def mlp(batch: int = 4):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 10))
    return model, torch.randn(batch, 256)


def mlp_no_batch_arg():
    return mlp(4)
