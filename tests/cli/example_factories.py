"""Model factories for `trainfit trace` tests (an MLP whose step we can derive by hand)."""
import torch
from torch import nn


def mlp(batch: int = 4):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 10))
    return model, torch.randn(batch, 256)


def mlp_no_batch_arg():
    return mlp(4)


def token_model():
    """A language-model-shaped module on token ids (batch 4, 16 tokens each): the trace speaks of that batch."""
    model = nn.Sequential(nn.Embedding(100, 32), nn.Linear(32, 100))
    return model, torch.zeros(4, 16, dtype=torch.long)


def exits():
    import sys

    sys.exit(3)
