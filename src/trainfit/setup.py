"""Setup: how the model is run (batch, sequence, precision, optimizer, parallelism...). Plain data, no torch."""
from __future__ import annotations

from dataclasses import dataclass, replace

from .errors import SetupError

# Precision policies (DESIGN.md §4; issue 2):
#   fp32         everything fp32
#   amp-bf16/16  torch.autocast: fp32 weights, grads, optimizer states; low-precision activations
#   bf16         pure bf16 weights, grads and optimizer states
#   bf16-master  bf16 weights and grads + an fp32 master copy (Megatron / DeepSpeed style)
#   fp16 / int8 / int4 / fp8  inference weight formats (fp16 also fine for pure-fp16 inference)
TRAIN_PRECISIONS = ("fp32", "amp-bf16", "amp-fp16", "bf16", "bf16-master")
INFER_PRECISIONS = ("fp32", "bf16", "fp16", "fp8", "int8", "int4", "amp-bf16", "amp-fp16")
OPTIMIZERS = ("sgd", "momentum", "adam", "adamw", "adafactor", "adamw-8bit", "lion")
RECOMPUTE = ("none", "selective", "full")
ATTENTION = ("auto", "eager", "sdpa", "flash")
DEVICES = ("cuda", "cpu")
MODES = ("train", "infer")


@dataclass(frozen=True)
class Setup:
    batch: int = 1  # micro-batch per data-parallel rank
    seq: int = 2048
    grad_accum: int = 1
    precision: str = "amp-bf16"
    optimizer: str = "adamw"
    recompute: str = "none"
    attention: str = "auto"  # auto: the device default (flash SDPA on cuda, HF's sdpa on cpu)
    dp: int = 1
    tp: int = 1
    pp: int = 1
    zero: int = 0  # 0 = plain DDP, 1/2/3 = ZeRO stages (3 == FSDP full shard)
    sequence_parallel: bool = False  # Megatron SP: shard the LayerNorm/dropout activations over tp
    device: str = "cuda"
    mode: str = "train"
    kv_dtype: str | None = None  # inference: KV cache dtype (default: the activation dtype)

    def __post_init__(self) -> None:
        for name in ("batch", "seq", "grad_accum", "dp", "tp", "pp"):
            v = getattr(self, name)
            if not isinstance(v, int) or v <= 0:
                raise SetupError(f"--{name.replace('_', '-')} must be a positive integer, got {v!r}")
        checks = (
            ("precision", TRAIN_PRECISIONS if self.mode == "train" else INFER_PRECISIONS),
            ("optimizer", OPTIMIZERS),
            ("recompute", RECOMPUTE),
            ("attention", ATTENTION),
            ("device", DEVICES),
            ("mode", MODES),
        )
        for name, allowed in checks:
            v = getattr(self, name)
            if v not in allowed:
                hint = f" ({self.mode} mode)" if name == "precision" else ""
                raise SetupError(f"--{name} {v!r} is not supported{hint}; choose one of: {', '.join(allowed)}")
        if self.zero not in (0, 1, 2, 3):
            raise SetupError(f"--zero must be 0, 1, 2 or 3, got {self.zero!r}")
        if self.zero and self.dp == 1:
            raise SetupError("--zero shards states over data-parallel ranks: it needs --dp > 1")
        if self.sequence_parallel and self.tp == 1:
            raise SetupError("--sequence-parallel splits activations over tensor-parallel ranks: it needs --tp > 1")
        if self.kv_dtype is not None and self.kv_dtype not in ("fp32", "bf16", "fp16", "fp8", "int8"):
            raise SetupError(f"--kv-dtype {self.kv_dtype!r} is not supported; choose fp32, bf16, fp16, fp8 or int8")

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def tokens_per_step(self) -> int:
        """Tokens in one optimizer step across all data-parallel ranks."""
        return self.batch * self.seq * self.grad_accum * self.dp

    @property
    def attention_kernel(self) -> str:
        """The kernel actually assumed: 'auto' resolves to flash on CUDA and sdpa (HF default) on CPU."""
        if self.attention != "auto":
            return self.attention
        return "flash" if self.device == "cuda" else "sdpa"

    def with_(self, **changes) -> "Setup":
        return replace(self, **changes)
