"""Training stacks as data: what each stack's step really does, fact by fact, with its source (no torch).

A stack is one TOML file beside this module (hf.toml, torchtitan.toml). Each fact names the implementation trainfit
models (optimizer kernel, mixed-precision mechanism, loss and norm kernels, FSDP wrapping, checkpointing policies)
and the file:line of the stack's code it comes from. The analytic engine reads the facts; the trace and measure
engines run the stack's own code and must agree with them (tests/stacks).
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from ..errors import SetupError

NAMES = ("hf", "torchtitan", "megatron", "deepspeed")
# optimizers torch.optim implements fused (torch/optim/{adam,adamw,sgd}.py accept fused=True)
FUSABLE = ("adam", "adamw", "sgd", "momentum")


@dataclass(frozen=True)
class Stack:
    name: str
    version: str
    summary: str
    facts: dict  # the TOML tables, each with "value"/fields and "source"

    def fact(self, key: str, field: str = "value"):
        try:
            return self.facts[key][field]
        except KeyError:  # a fact the code reads must be in every stack's file: a data bug, said by name
            raise LookupError(f"stacks/{self.name}.toml has no [{key}] {field}: add it with its source, or refuse "
                              f"the setting for --stack {self.name}") from None

    @property
    def policies(self) -> tuple[str, ...]:
        return tuple(self.facts["recompute"]["policies"])

    @property
    def axes(self) -> tuple[str, ...]:
        """Settings beyond dp/tp/pp/zero the stack runs (cp, ep, etp, vpp, pp_split, offload); [parallel] axes."""
        return tuple(self.facts.get("parallel", {}).get("axes", ()))

    @property
    def zero_stages(self) -> tuple[int, ...]:
        return tuple(self.facts["zero"]["stages"])

    @property
    def precisions(self) -> tuple[str, ...]:
        """The precision policies the stack runs (trainfit.precision names)."""
        return tuple(self.facts["precision"]["policies"])

    @property
    def optimizers(self) -> tuple[str, ...]:
        return tuple(self.facts["optimizers"]["names"])

    @property
    def max_grad_norm(self) -> float:
        """The norm the stack clips the gradients to before each optimizer step ([grad_clip] max_norm); 0.0 where
        trainfit models no clipping."""
        return float(self.facts.get("grad_clip", {}).get("max_norm", 0.0))

    def splits_model(self, tp: int, pp: int) -> str | None:
        """None when the stack runs this tensor/pipeline split ([model_parallel]; absent: it runs both), else why
        not."""
        mp = self.facts.get("model_parallel", {})
        if (tp > 1 and not mp.get("tensor", True)) or (pp > 1 and not mp.get("pipeline", True)):
            others = [n for n in NAMES if n != self.name and get_stack(n).splits_model(tp, pp) is None]
            return (f"--stack {self.name} runs no tensor/pipeline split: {mp['why']}; use --tp 1 --pp 1, or --stack "
                    f"{' or '.join(others)}")
        return None

    def compiles(self) -> str | None:
        """None when trainfit models --compile on this stack ([compile] supported), else why not."""
        if self.fact("compile", "supported"):
            return None
        others = [n for n in NAMES if get_stack(n).fact("compile", "supported")]
        return (f"--compile is not modelled for --stack {self.name}: {self.fact('compile', 'why')}; drop --compile, "
                f"or use --stack {' or '.join(others)}")

    def runs_layout(self, dp: int, tp: int, pp: int, zero: int, precision: str | None = None) -> str | None:
        """None when the stack runs this data/tensor/pipeline layout, ZeRO stage (and precision), else why not."""
        split = self.splits_model(tp, pp)
        if split:
            return split
        if zero not in self.zero_stages:
            return f"{self.name} runs ZeRO stages {', '.join(map(str, self.zero_stages))}, not {zero}"
        if self.facts["zero"].get("ddp_alone") and zero == 0 and dp > 1 and (tp > 1 or pp > 1):
            return f"{self.name}'s DDP (--zero 0) runs only without tensor/pipeline parallelism; use --zero 2 or 3"
        if (precision is not None and precision.startswith("amp") and zero < 2 and (tp > 1 or pp > 1)
                and self.facts["mixed_precision"].get("tp_pp_need_fsdp")):
            return (f"{self.name} has no mixed precision with tensor/pipeline parallelism unless FSDP shards (it "
                    f"would run fp32): use --zero 2 or 3 (with --dp > 1), or --precision fp32/bf16")
        return None

    def models(self) -> dict:
        """{model name: {flavor: shape}} of the models the stack builds from a registry (empty: any model)."""
        return {k: v for k, v in self.facts.get("models", {}).items() if isinstance(v, dict)}

    def optimizer_impl(self, optimizer: str) -> str:
        """The optimizer kernel this stack runs for `optimizer` by default: its fact when torch has a fused
        kernel for the optimizer, else torch's own default (the caller's device decides foreach/for-loop)."""
        impl = self.fact("optimizer_impl")
        return impl if impl != "fused" or optimizer in FUSABLE else "default"


@lru_cache(maxsize=None)
def get_stack(name: str) -> Stack:
    if name not in NAMES:
        raise SetupError(f"--stack {name!r} is not supported; choose one of: {', '.join(NAMES)}")
    data = tomllib.loads(resources.files(__name__).joinpath(f"{name}.toml").read_text())
    facts = {k: v for k, v in data.items() if isinstance(v, dict)}
    return Stack(data["name"], data["version"], data["summary"], facts)
