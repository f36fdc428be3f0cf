"""A torchrun command line launching torchtitan with the plan's job-config keys as --section.key overrides
(emit_torchtitan.py writes the same keys as a TOML file)."""
from __future__ import annotations

from ..setup import Setup
from ..spec import ModelSpec
# torchtitan's rules (supports): the command line runs torchtitan's step, as the job config does
from .emit_torchtitan import PRECISIONS, STACK, supports, torchtitan_sections  # noqa: F401


def write(s: Setup, spec: ModelSpec, gpus_per_node: int, tokens: float | None = None) -> str:
    """torchrun + torchtitan (FSDP2, TP, PP) command line: the torchtitan job config's keys as --section.key
    overrides (torchtitan's ConfigManager: CLI > TOML > defaults)."""
    world = s.world_size
    nproc = min(world, gpus_per_node)
    nodes = max(1, -(-world // gpus_per_node))
    args = [
        f"torchrun --nnodes={nodes} --nproc_per_node={nproc}"
        + (" --rdzv_backend=c10d --rdzv_endpoint=$MASTER_ADDR:29500" if nodes > 1 else "")
        + " -m torchtitan.train",
    ]
    sections = torchtitan_sections(s, spec, tokens, need_model=False)
    if "name" not in sections.get("model", {}):
        args.append("--job.config_file <your model's train_config.toml>")
    for section, keys in sections.items():
        if section == "job":
            continue
        for k, v in keys.items():
            if isinstance(v, bool):  # tyro flags: --compile.enable / --compile.no-enable
                args.append(f"--{section}.{k}" if v else f"--{section}.no-{k.replace('_', '-')}")
            elif isinstance(v, list):  # list[str]: one comma-separated value (config/manager.py:227-233)
                args.append(f"--{section}.{k} {','.join(v)}")
            else:
                args.append(f"--{section}.{k} {v}")
    return " \\\n  ".join(args) + "\n"
