"""The largest sizes trainfit computes, each derived from what the engines can run, with the reason (one place).

A size past one of these describes no run the trace or measure engines could make, so the analytic numbers for it
would answer nothing: it is refused with one line naming the limit and why.

  * PyTorch counts a tensor's sizes, its numel and its storage's bytes in int64 (c10/core/TensorImpl.h numel_,
    c10/core/StorageImpl.h nbytes_ as SymInt over int64_t): no tensor holds more than 2**63 - 1 bytes, so a step
    whose input ids (batch x seq int64 elements) or logits (batch x seq x vocab fp32) are larger cannot be traced
    or measured.
  * torch.distributed's ranks and world sizes are C ints (torch/csrc/distributed/c10d/ProcessGroup.hpp `int rank_,
    size_`; NCCL's ncclCommInitRank takes `int nranks`): at most 2**31 - 1 GPUs in a job, and so in any of its
    parallel degrees.

Every loop left in the engines is bounded by these (or is counted in closed form): see tests/cli/test_bounded_work.py.
"""
from __future__ import annotations

from .errors import SetupError

INT64_MAX = 2**63 - 1  # c10's sizes, numels and byte counts
C_INT_MAX = 2**31 - 1  # c10d's ranks and world sizes


class Bound(int):
    """An upper bound that carries its reason (setup.Meta.maximum takes one; check_value names it)."""

    why: str

    def __new__(cls, value: int, why: str) -> "Bound":
        b = super().__new__(cls, value)
        b.why = why
        return b


INT64_BYTES = "c10 counts a tensor's bytes in int64 (at most 2**63 - 1)"
# torch.distributed: a degree is a count of ranks
RANKS = Bound(C_INT_MAX, "torch.distributed's ranks and world size are C ints (c10d ProcessGroup, NCCL's nranks)")
# the step's input ids are a (batch, seq) int64 tensor (8 bytes an element): each factor is at most its bytes' limit
TOKENS = Bound(INT64_MAX // 8, f"the step's input ids are int64 tensors (8 bytes a token) and {INT64_BYTES}")
# a LoRA adapter's lora_A is (r, in_features): r rows of at least one 2-byte element
RANK_ROWS = Bound(INT64_MAX // 2, f"lora_A holds r rows of 16-bit elements and {INT64_BYTES}")


def check_world(world_size: int, what: str = "the job's GPUs (dp x tp x pp x cp)") -> None:
    """The job's GPUs, each degree within RANKS, are one world: a C int too."""
    if world_size > RANKS:
        raise SetupError(f"{what} {world_size:,} are more than {RANKS:,}: {RANKS.why}")


def check_logits(tokens: int, vocab: int) -> None:
    """The step's logits, `tokens` (batch x seq) rows of `vocab` fp32 values (the loss upcasts them: transformers
    loss_utils.py ForCausalLMLoss `logits.float()`), are one tensor: within int64 bytes."""
    if tokens * vocab * 4 > INT64_MAX:
        raise SetupError(f"the step's logits ({tokens:,} tokens x {vocab:,} vocab x 4 bytes) would hold more than "
                         f"2**63 - 1 bytes, which no PyTorch tensor can ({INT64_BYTES}); lower --batch or --seq")


# a count of a model's transformer layers: each holds at least one 16-bit weight
LAYERS = Bound(INT64_MAX // 2, f"every layer holds at least one 16-bit weight and {INT64_BYTES}")


def check_device_bytes(nbytes: float) -> None:
    """What one GPU (or process) holds is counted by PyTorch's caching allocator in int64 (c10/core/Allocator.h,
    CUDACachingAllocator's DeviceStats: int64_t counters): a step holding more describes no run the engines could
    measure (a config of 10**12 layers)."""
    if nbytes > INT64_MAX:
        raise SetupError(f"the step would hold {nbytes:.3g} bytes on one GPU, more than 2**63 - 1, which PyTorch's "
                         "allocator counts in int64: no device holds it; check the model's size (its layers, widths)")
