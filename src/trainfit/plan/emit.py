"""Launch configs for the distributed engines users actually run, one writer module each: DeepSpeed JSON
(emit_deepspeed.py), an accelerate FSDP config YAML (emit_accelerate.py), a torchtitan job-config TOML and a
torchrun + torchtitan command line (emit_torchtitan.py), a Megatron-LM command line (emit_megatron.py). Each engine
supports only part of the search space; `supports` says which, and the command picks the best plan that the engine
can run.

Keys follow the engines' documentation: DeepSpeed config JSON (deepspeed.ai/docs/config-json), accelerate's
FSDP guide and its FSDP1 → FSDP2 migration table (fsdp_version, fsdp_reshard_after_forward replacing
fsdp_sharding_strategy), torchtitan 0.2.2's JobConfig (torchtitan/config/job_config.py; every key below cites its
line, and tests/plan/test_emit_torchtitan.py parses the file with torchtitan's own ConfigManager).
"""
from __future__ import annotations

from importlib import import_module

from ..errors import SetupError
from ..setup import Setup
from ..spec import ModelSpec

ENGINES = ("deepspeed", "accelerate", "torchtitan", "torchrun", "megatron")


def _writer(engine: str):
    """The engine's writer module, emit_<engine>.py: STACK (the stack whose step its config runs), its supports(s),
    PRECISIONS and write(...)."""
    if engine not in ENGINES:
        raise SetupError(f"--emit {engine!r} is not one of: {', '.join(ENGINES)}")
    return import_module(f"{__package__}.emit_{engine}")


def supports(engine: str, s: Setup) -> str | None:
    """None when `engine` can run setup `s`, else why not (one line). The config runs its stack's step (the
    writer's STACK): a plan of another stack's step (its memory and time) is not what it runs, whatever the settings
    they share."""
    w = _writer(engine)
    if s.stack != w.STACK:
        return f"the plan models the {s.stack} stack's step (its memory and time); plan with --stack {w.STACK}"
    return w.supports(s)


def precisions_for(engine: str) -> tuple[str, ...]:
    return _writer(engine).PRECISIONS


def check_model(engine: str, spec: ModelSpec) -> None:
    """Refuse, before any search, a model `engine` cannot build (torchtitan: its registry's models only; Megatron-LM:
    emit_megatron.check_model)."""
    if engine == "torchtitan":
        from .emit_torchtitan import torchtitan_flavor_or_error

        torchtitan_flavor_or_error(spec)
    if engine == "megatron":
        from .emit_megatron import check_model as megatron_builds

        megatron_builds(spec)


def runnable_query(engine: str, q) -> dict:
    """The PlanQuery fields (search.PlanQuery `q` replaced) of a search among the plans `engine` can run, when none
    of `q`'s best can: its precisions, data parallelism only for DeepSpeed's and accelerate's configs, the
    recomputes and ZeRO stages they run, torchtitan's own step for its job config and command line, Megatron's for
    Megatron-LM's."""
    allowed = tuple(p for p in (q.precisions or ()) if p in precisions_for(engine)) or precisions_for(engine)[:1]
    flat = engine in ("deepspeed", "accelerate")  # data-parallel only
    # the stack whose own step the engine runs (its options, recomputes and ZeRO stages) is searched: torchtitan's
    # job config and command line, Megatron-LM's command line; DeepSpeed's JSON and accelerate's YAML keep to the
    # recomputes and ZeRO stages they hold
    own = not flat
    recs = None if own and q.recomputes is None else tuple(r for r in (q.recomputes or ("none", "full"))
                                                           if not flat or r in ("none", "full")) or ("none",)
    zeros = None if own else tuple(z for z in (q.zeros or (0, 1, 2, 3))
                                   if not (engine != "deepspeed" and z == 1)) or (0,)
    # the memory knobs the config holds: DeepSpeed's sequence_parallel_size and offload_optimizer/offload_param
    # (stacks/deepspeed_config.py), accelerate's and torchtitan's FSDP2 CPU offload of the parameters
    held = {"deepspeed": ("ulysses", "offload-states")}.get(engine, ("offload-states",))
    return dict(precisions=allowed, tp=1 if flat else q.tp, pp=1 if flat else q.pp, recomputes=recs, zeros=zeros,
                stacks=(_writer(engine).STACK,), knobs=held)



def caveats(engine: str, s: Setup) -> list[str]:
    """What the user must know to run `engine`'s config of `s` as planned (a writer's `caveats`, where it has one)."""
    return getattr(_writer(engine), "caveats", lambda _: [])(s)


def emit(engine: str, s: Setup, spec: ModelSpec, gpus_per_node: int, tokens: float | None = None) -> str:
    why = supports(engine, s)
    if why:
        raise SetupError(f"--emit {engine}: this plan cannot run there ({why})")
    return _writer(engine).write(s, spec, gpus_per_node, tokens)
