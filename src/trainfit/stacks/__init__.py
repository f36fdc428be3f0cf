"""Training stacks as data: what each stack's step really does, fact by fact, with its source (no torch).

A stack is a TOML file of facts, found by its name: the four trainfit ships beside this module (hf.toml,
torchtitan.toml, megatron.toml, deepspeed.toml), then any `<name>.toml` in the folders of $TRAINFIT_STACK_PATH. Each
fact names the implementation trainfit models (optimizer kernel, mixed-precision mechanism, loss and norm kernels,
FSDP wrapping, checkpointing policies, which settings and engines run it, what the planner searches) and the file:line
of the stack's code it comes from. A stack whose rules are code, not data, has a rules module of the same name beside
its facts (stacks/megatron.py): `refuse(setup) -> str | None`. The analytic engine reads the facts; the trace and
measure engines run the stack's own code and must agree with them (tests/stacks).
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import tomllib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import ModuleType

from ..errors import SetupError

BUILT_IN = ("hf", "torchtitan", "megatron", "deepspeed")  # in the order messages list them
PATH_VARIABLE = "TRAINFIT_STACK_PATH"  # more stacks: folders of <name>.toml (and <name>.py rules), os.pathsep-separated
_BUILT_IN_FILES = {n: Path(__file__).parent / f"{n}.toml" for n in BUILT_IN}
# optimizers torch.optim implements fused (torch/optim/{adam,adamw,sgd}.py accept fused=True)
FUSABLE = ("adam", "adamw", "sgd", "momentum")


def _folders() -> list[Path]:
    return [Path(p) for p in os.environ.get(PATH_VARIABLE, "").split(os.pathsep) if p]


def names() -> tuple[str, ...]:
    """Every stack: trainfit's own, then those in $TRAINFIT_STACK_PATH's folders (each folder's in name order)."""
    extra = [p.stem for d in _folders() for p in sorted(d.glob("*.toml"))]
    return BUILT_IN + tuple(dict.fromkeys(n for n in extra if n not in BUILT_IN))


def _facts_file(name: str) -> Path | None:
    if name in _BUILT_IN_FILES:
        return _BUILT_IN_FILES[name]
    return next((d / f"{name}.toml" for d in _folders() if (d / f"{name}.toml").is_file()), None)


@dataclass(frozen=True)
class Stack:
    name: str
    version: str
    summary: str
    facts: dict  # the TOML tables, each with "value"/fields and "source"
    rules: ModuleType | None = None  # the stack's rules module (refuse(setup)), where its rules are code

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
    def zero_shard_axes(self) -> tuple[str, ...]:
        """The parallel axes whose ranks --zero shards the dense states over: dp, or the stack's own group
        ([distributed_optimizer] shards: Megatron's dp × cp; [fsdp] shards: torchtitan's dp_shard × cp)."""
        return tuple(self.facts.get("distributed_optimizer", {}).get("shards")
                     or self.facts.get("fsdp", {}).get("shards", ("dp",)))

    @property
    def zero_single_rank_with(self) -> tuple[str, ...]:
        """The --offload values under which the stack runs --zero on one data-parallel rank ([zero]
        single_rank_with: DeepSpeed's ZeRO-Offload/Infinity on one GPU); none elsewhere."""
        return tuple(self.facts["zero"].get("single_rank_with", ()))

    def axis_why_not(self, axis: str) -> str | None:
        """Why trainfit does not run `axis` on this stack though the stack has a form of it ([parallel.why_not]),
        None when the file says nothing."""
        return self.facts.get("parallel", {}).get("why_not", {}).get(axis)

    @property
    def casts_parameters(self) -> bool:
        """The stack's engine casts every floating parameter to the model dtype when it wraps the model, after
        peft has built it ([peft] adapter_dtype = "model": DeepSpeed's deepspeed.initialize), so no parameter peft
        left in fp32 (its adapters, prepare_model_for_kbit_training's upcasts) stays fp32 under a 16-bit policy."""
        return self.facts.get("peft", {}).get("adapter_dtype") == "model"

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
        off = self._unsplit(tp, pp)
        if off:
            others = [n for n in names() if n != self.name and not get_stack(n)._unsplit(tp, pp)]
            mp = self.facts["model_parallel"]
            runs = "/".join(axis for axis, _ in off)
            return (f"--stack {self.name} runs no {runs} split: {mp['why']}; use {' '.join(f + ' 1' for _, f in off)}"
                    f", or --stack {' or '.join(others)}")
        return None

    def _unsplit(self, tp: int, pp: int) -> list[tuple[str, str]]:
        """(axis, flag) of the tensor/pipeline splits asked for (> 1) that this stack does not run."""
        mp = self.facts.get("model_parallel", {})
        return [(axis, flag) for axis, flag, n in (("tensor", "--tp", tp), ("pipeline", "--pp", pp))
                if n > 1 and not mp.get(axis, True)]

    def compiles(self) -> str | None:
        """None when trainfit models --compile on this stack ([compile] supported), else why not."""
        if self.fact("compile", "supported"):
            return None
        others = running(lambda st: st.fact("compile", "supported"))
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

    def moe_model(self, family: str) -> str | None:
        """The stack's own MoE model that builds a family (by HF model_type: [moe_models] model, e.g. torchtitan's
        deepseek_v3 for deepseek_v2), or None where it has none."""
        return self.facts.get("moe_models", {}).get("model", {}).get(family)

    def optimizer_impl(self, optimizer: str) -> str:
        """The optimizer kernel this stack runs for `optimizer` by default: its fact when torch has a fused
        kernel for the optimizer, else torch's own default (the caller's device decides foreach/for-loop)."""
        impl = self.fact("optimizer_impl")
        return impl if impl != "fused" or optimizer in FUSABLE else "default"


    def runs(self, feature: str) -> bool:
        """Whether trainfit models `feature` (a [features] runs name, e.g. liger-loss) on this stack."""
        return feature in self.fact("features", "runs")

    @property
    def trains(self) -> str:
        """What the stack trains ([model]): "any" transformers model (heads, vision, a user's module) or only the
        "causal-lm" models it builds."""
        return self.fact("model")

    def engine_runs(self, engine: str) -> bool:
        """Whether the trace or measure `engine` runs this stack's own training step ([engines] runs)."""
        return engine in self.fact("engines", "runs")

    @property
    def measured_on_ranks(self) -> bool:
        """The measure engine runs the step on --dp torch.distributed ranks, one process a rank ([engines] ranks)."""
        return self.fact("engines", "ranks")

    @property
    def etp_default(self) -> int | None:
        """The expert tensor-parallel degree the stack runs without --etp ([expert_parallel] etp_default: torchtitan's
        expert_tensor_parallel_degree = 1); None: --tp's (Megatron's expert_tensor_parallel_size default)."""
        return self.facts.get("expert_parallel", {}).get("etp_default")

    @property
    def etp_needs_ep(self) -> bool:
        """--etp has no effect without --ep ([expert_parallel] etp_needs_ep: torchtitan's); False: the stack's expert
        tensor parallelism applies at ep 1 too (Megatron's expert_tensor_parallel_size)."""
        return bool(self.facts.get("expert_parallel", {}).get("etp_needs_ep", False))

    @property
    def plan_precisions(self) -> tuple[str, ...]:
        """The precisions the planner searches when none are given ([plan] precisions)."""
        return tuple(self.fact("plan", "precisions"))

    @property
    def plan_recomputes(self) -> tuple[str, ...]:
        """The recompute policies the planner searches when none are given ([plan] recomputes)."""
        return tuple(self.fact("plan", "recomputes"))

    @property
    def plan_recompute_modules(self) -> tuple[str, ...]:
        """Under its selective policy, the recompute-module sets the planner searches ([plan] recompute_modules);
        () where the stack has no --recompute-modules."""
        return tuple(self.fact("plan", "recompute_modules")) if self.runs("recompute-modules") else ()

    def refuse(self, setup) -> str | None:
        """Why the stack's rules module refuses `setup` (read by attribute), None when it runs it or has none."""
        return self.rules.refuse(setup) if self.rules is not None else None


def running(test) -> list[str]:
    """The names of the stacks for which `test(stack)` is true, in names() order (for "use --stack ..." hints)."""
    return [n for n in names() if test(get_stack(n))]


def _rules_module(name: str, facts_file: Path) -> ModuleType | None:
    """The stack's rules module: trainfit.stacks.<name> for trainfit's own, else <name>.py beside its facts file."""
    if name in BUILT_IN:
        found = importlib.util.find_spec(f"{__name__}.{name}")
        return importlib.import_module(f"{__name__}.{name}") if found else None
    path = facts_file.with_suffix(".py")
    if not path.is_file():
        return None
    spec = importlib.util.spec_from_file_location(f"trainfit_stack_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@lru_cache(maxsize=None)
def _load(name: str, facts_file: Path) -> Stack:
    data = tomllib.loads(facts_file.read_text())
    facts = {k: v for k, v in data.items() if isinstance(v, dict)}
    return Stack(data["name"], data["version"], data["summary"], facts, _rules_module(name, facts_file))


@lru_cache(maxsize=None)
def _built_in(name: str) -> Stack:
    return _load(name, _BUILT_IN_FILES[name])


def get_stack(name: str, release: str | None = None) -> Stack:
    """The stack called `name`; with `release`, its facts as an earlier release of the stack had them (release.py)."""
    if release is None and name in _BUILT_IN_FILES:  # (the engines ask per call: no path to hash)
        return _built_in(name)
    path = _facts_file(name)
    if path is None:
        raise SetupError(f"--stack {name!r} is not supported; choose one of: {', '.join(names())}")
    if release is None:
        return _load(name, path)
    from .release import at_release

    return at_release(_load(name, path), path, release)
