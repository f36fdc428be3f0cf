"""StackModel: what the analytic engine does at each point where stacks differ, as the torch-native stacks (hf,
torchtitan) run their step through trainfit's own strategy (step/strategy.py): torch DDP / ZeroRedundancyOptimizer /
FSDP2 for data parallelism, torch.optim stepping each parameter's gradient, torch.nn.utils.clip_grad_norm_. A stack
module (hf.py, torchtitan.py, megatron.py, deepspeed.py) subclasses it and overrides only what its step does
otherwise, citing the stack's code."""
from __future__ import annotations

from ...setup import Setup
from ...spec import ModelSpec
from .. import grad_clip
from ..compute_time import tensors_per_rank
from ..params import ParamCounts
from ..parallel.pipeline import Stage
from ..precision import StateBytes


class StackModel:
    # data parallelism is torch's (DistributedDataParallel, ZeroRedundancyOptimizer, fully_shard): DDP's bucket,
    # FSDP2's groups and copies (parallel/zero.py, parallel/fsdp2.py)
    torch_data_parallel = True
    # torch.optim steps each parameter's own gradient (the fused kernel's step counts on the GPU, foreach
    # temporaries, fp32 masters cast per tensor by step/standard.py MasterWeightOptimizer)
    torch_optimizer = True
    # the stack's own ZeRO engine allocates the states, partitions and buckets (parallel/deepspeed.py)
    zero_engine = False
    # its memory model has a hybrid model's Mamba-2 blocks (memory.py through hybrid_training.py); where it does not,
    # a hybrid model's training is refused as not modelled (hybrid_training.check_trainable)
    hybrid_blocks = True

    def stage_memory(self, spec: ModelSpec, setup: Setup, pc: ParamCounts, st: StateBytes, stage: Stage):
        """One pipeline stage's TrainMemory (analytic/memory.py)."""
        return _memory.stage_memory(spec, setup, pc, st, stage)

    def states_floor(self, spec: ModelSpec, setup: Setup, pc: ParamCounts, stage: Stage) -> int:
        """A lower bound of stage_memory(...).peak from the states alone, which no micro-batch changes (the planner
        rejects a group whose states cannot fit without timing its activations: memory.states_floor); 0 where the
        stack has none."""
        return 0

    def saved_floors(self, spec: ModelSpec, setup: Setup, pc: ParamCounts, stages: list[Stage]) -> tuple:
        """(saved, working) of each stage: bytes per sequence of the micro-batch such that stage_memory(...).peak
        >= states_floor + b × (in_flight × saved + working) for every micro-batch b and accumulation
        (memory.stage_saved_floors); (0, 0) where the stack has none."""
        return tuple((0.0, 0.0) for _ in stages)

    def reduce_behind_backward(self, setup: Setup) -> bool:
        """Whether the data-parallel gradient reduction runs beside the backward (parallel/zero.py dp_comm): torch
        DDP's bucket hooks and FSDP's reduce-scatter stream do; Megatron's with --overlap-grad-reduce, as trainfit
        runs it."""
        return True

    def reduced_grad_bytes(self, setup: Setup, st: StateBytes) -> float:
        """Bytes per element of the gradients the data-parallel group reduces: FSDP2's reduce_dtype where its
        MixedPrecisionPolicy runs (precision.py: st.reduce), else the gradients' own dtype (.grad has the
        parameter's)."""
        return st.reduce or st.grad

    def stepped_grad_bytes(self, setup: Setup, st: StateBytes) -> tuple[float, float]:
        """(bytes per element of the gradients the optimizer's update reads, bytes per element a copy that makes them
        from the reduced gradients reads and writes, 0 without one): torch.optim reads each parameter's own .grad
        (fp32 masters: compute_time.master_cast_seconds casts them apart)."""
        return st.grad, 0.0

    def tensors_per_rank(self, spec: ModelSpec, layers: int, embedding: bool, head: bool) -> int:
        """The parameter tensors of a stage, each an optimizer operand (compute_time.tensors_per_rank)."""
        return tensors_per_rank(spec, layers, embedding, head)

    def clipped_params(self, setup: Setup, trained: float) -> float:
        """Elements of the gradients the rank's clip reads, of the `trained` parameters it holds unsharded:
        FSDP's sharded gradients (dp x cp) from --zero 2, else every gradient."""
        return trained / (setup.dp * setup.cp if setup.zero >= 2 else 1)

    def clip_work(self, setup: Setup, st: StateBytes, clipped: float, tensors: int, largest: float,
                  sizes: tuple[int, ...] | None) -> grad_clip.ClipWork:
        """What the stack runs to clip the gradients: torch's clip_grad_norm_ (grad_clip.torch_clip)."""
        return grad_clip.torch_clip(setup, st, clipped, tensors, largest, sizes)

    def communicators(self, setup: Setup) -> dict[str, int]:
        """The training process groups one rank joins, name -> ranks: DDP, FSDP and ZeRO reduce over one
        data-parallel group, and torchtitan adds one group per DeviceMesh dimension (tp, pp)."""
        return {"dp": setup.dp, "tp": setup.tp, "pp": setup.pp}

    def cp_comm_seconds(self, spec: ModelSpec, setup: Setup, links, tokens: float, act_bytes: float, layers: int,
                        attention_forward: float, rerun: float) -> float:
        """One micro-batch's exposed context-parallel communication: Megatron's ring (parallel/context.py), the
        only ring a stack runs unless it says otherwise."""
        return _context.cp_comm_seconds(spec, setup, links, tokens, act_bytes, layers, attention_forward, rerun)

    def cp_backward_bytes(self, spec: ModelSpec, setup: Setup, tokens: float, act_bytes: float) -> float:
        """Bytes a layer's context-parallel attention backward holds beyond a plain SDPA backward's (none without
        a ring of the stack's own: Megatron's are in megatron_memory.py)."""
        return 0.0

    def loss_block_bytes(self, setup: Setup, logits: float) -> float:
        """Bytes of the largest block the loss makes over `logits` elements (the rank's tokens x vocab / tp) and
        frees before the backward's peak (engine.transient_blocks): the logits' fp32 copy every torch-native loss
        makes (stacks/*.toml [loss])."""
        return 4.0 * logits

    def host_copy_seconds(self, spec: ModelSpec, setup: Setup, gpu, forward: float, backward: float,
                          layers: int) -> float:
        """Seconds per micro-batch the stack's own activation offloading leaves exposed (`forward`/`backward`: the
        micro-batch's passes over `layers` layers): none unless the stack has one (--offload activations is
        step_time.offload_exposed's)."""
        return 0.0

    def check_model(self, spec: ModelSpec, setup: Setup) -> None:
        """Raise SetupError when the stack does not build this model (every model here)."""

    def warnings(self, spec: ModelSpec, setup: Setup, gpu=None) -> list[str]:
        """What the stack's own code warns of when it starts this step on `gpu` (None: any GPU), in the estimate's
        notes and beside each plan that draws one (plan/search.py Candidate.warnings): none here."""
        return []

    def notes(self, spec: ModelSpec, setup: Setup) -> list[str]:
        """What the estimate's notes say of the stack's step (its warnings apart: warnings)."""
        if self.torch_data_parallel and setup.dp > 1 and setup.zero == 0:
            return ["DDP keeps a gradient-sized bucket buffer (counted in temporaries)"]
        return []


# (imported last, as the module, not its names: memory.py and parallel/context.py import the stack models; a function-level import costs its
# resolution on every call, and this one sits on the engine's hot path)
from .. import memory as _memory  # noqa: E402
from ..parallel import context as _context  # noqa: E402
