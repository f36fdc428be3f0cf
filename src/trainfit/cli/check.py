"""`trainfit check FILE…`: the user's own launch config, read by its stack's parser (trainfit.readers), answered as
`estimate` answers: what each key became, what is not modelled, then the estimate and, with --gpu, the verdict."""
from __future__ import annotations

from typing import List, Optional

import typer

from ..setup import BY_NAME
from .options import JsonOpt

FilesArg = typer.Argument(..., metavar="FILE...", help="Your config: a torchtitan job .toml or torchtitan.train command line, a "
                          "Megatron-LM pretrain_gpt.py command line or script, a DeepSpeed ds_config.json, HF "
                          "TrainingArguments or a TRL SFTConfig/GRPOConfig/DPOConfig (.json/.yaml), an axolotl or "
                          "LLaMA-Factory .yaml, an accelerate config .yaml, a `vllm serve` (with its --config YAML), "
                          "`sglang serve` or `sglang.launch_server` command line, or a vLLM or SGLang --config YAML "
                          "by itself. Several files describe one run together.")
ModelOpt = typer.Option(None, "--model", help="The model, when the files do not name one (DeepSpeed, accelerate, "
                        "TrainingArguments, Megatron without --tokenizer-model): " + "a catalog name, config.json "
                        "or hub id.")
GpuOpt = typer.Option(None, "--gpu", help=BY_NAME["gpu"].meta.help)
DpOpt = typer.Option(None, "--dp", help="Data-parallel ranks, when the files do not say (a torchtitan shard degree "
                     "of -1 without the torchrun line, TrainingArguments, Megatron without torchrun's sizes).")
SeqOpt = typer.Option(None, "--seq", help="Sequence length, when the files do not say (TrainingArguments, accelerate "
                      "and DeepSpeed configs hold none: the training script's or dataset's).")
ServerOpt = typer.Option(None, "--server", help="The engine release a serving command is for, when not the current "
                         "one (e.g. vllm==0.10.1): its start-up modelled, and the command's flags read as that "
                         "release's own parser takes them (one it stops at is said and left out). "
                         + BY_NAME["server"].meta.help)
PromptLenOpt = typer.Option(None, "--prompt-len", help="Prompt tokens per sequence, which no file holds (a TRL "
                           "GRPOConfig's dataset, a serving command's requests): "
                           + BY_NAME["prompt_len"].meta.help)


def check(files: List[str] = FilesArg, model: Optional[str] = ModelOpt, gpu: Optional[str] = GpuOpt,
          dp: Optional[int] = DpOpt, seq: Optional[int] = SeqOpt, prompt_len: Optional[int] = PromptLenOpt,
          server: Optional[str] = ServerOpt, json: bool = JsonOpt) -> None:
    """Check your own config before launch: read it with its stack's own parser, map every key to trainfit's
    settings (or name it as not modelled, with the direction of its effect), then answer as `estimate` does.

    Examples:\n
      trainfit check my_job.toml --gpu H100-80GB\n
      trainfit check ds_config.json train_args.yaml --model llama-3.1-8b --dp 8 --gpu A100-80GB\n
      trainfit check serve.sh --gpu H100-80GB      # a `vllm serve ...` line\n
      trainfit check serve.sh --server vllm==0.10.1 --gpu H100-80GB   # for an older vLLM\n
      trainfit check grpo.yaml --model qwen2.5-1.5b --dp 8 --gpu H100-80GB   # a TRL GRPOConfig
    """
    from .. import api, serving_versions
    from ..errors import SetupError
    from ..readers import read
    from .app import show_estimates
    from .spinner import spinner

    # (a stack's own parser imports the stack: seconds for torchtitan's or Megatron's)
    with spinner(f"reading {', '.join(files)} with the stacks' own parsers", quiet=json):
        release = serving_versions.parse(server) if server is not None else None
        readings = [read(f, dp, release) for f in files]
        req, notes = request_of(readings, model, gpu, dp, prompt_len, seq, server)
        spec = api.load_spec(req.model)
        if req.mode == "serve":  # (the engine refuses to start: as --emit refuses to write it)
            from dataclasses import replace

            from ..plan.emit_vllm import unloadable

            method = spec.checkpoint_quant if req.quant is None else None
            if method:  # the engine takes the checkpoint's own, as the estimate does (setup/request.py): said, and
                # set on the request so that the 'as trainfit' line and the load check read it
                req = replace(req, quant=method)
                notes.append(f"quantization_config.quant_method {method!r} of {req.model}'s config.json: the engine "
                             f"loads its weights so (as --quant {method})")
            why = unloadable(req.model, req.quant)
            if why:
                raise SetupError(f"--quantization {req.quant}: {why}; the engine would not start: pass the "
                                 f"{req.quant.upper()} checkpoint as the model, or drop --quantization")
        for r in readings:
            for c in r.checks:
                c(spec)
        results = api.run_engines(req, "analytic")
    if req.mode == "train":  # what no file holds (TrainingArguments and accelerate have no sequence length, an
        # accelerate config no micro-batch): the estimate's default, said
        given = {k for r in readings for k in r.values} | ({"seq"} if seq is not None else set())
        run = results[0].setup
        for name, what in (("batch", "micro-batch"), ("seq", "sequence length")):
            if name not in given:
                notes.append(f"{what}: none of the files holds it (the training script's or dataset's): estimated "
                             f"at {flag(name)} {getattr(run, name)}, trainfit's default"
                             + (": give --seq" if name == "seq" else ""))
    serving = results[0].detail.serving  # (--mode serve's; None for training)
    for r in readings:  # the engine's flags the estimate sized itself: as it assumed, or not modelled
        r.against(serving.knobs if serving is not None else {})
    settings = settings_of(readings, req, tuple(k for k, v in (("seq", seq), ("prompt_len", prompt_len),
                                                               ("server", server)) if v))
    if req.quant is not None and "quant" not in settings and req.mode == "serve":  # (the checkpoint's own, above)
        settings["quant"] = req.quant
    said = {"files": [r.source for r in readings], "settings": settings,
            "not_modelled": [x for r in readings for x in r.not_modelled] + notes,
            "unknown": [x for r in readings for x in r.unknown],
            "no_effect": [x for r in readings for x in r.no_effect],
            "warned": [x for r in readings for x in r.warned],
            "of_model": [x for r in readings for x in r.of_model],
            "as_modelled": [x for r in readings for x in r.as_modelled]}
    if json:
        show_estimates(req, results, True, {"check": said})
        return
    for r in readings:
        typer.echo(f"read {r.source}")
    typer.echo("as trainfit: " + " ".join(x for k, v in said["settings"].items() for x in as_flag(k, v)))
    for x in said["not_modelled"] + said["warned"]:
        typer.echo(f"  · {x}")
    if said["as_modelled"]:
        typer.echo(f"  · as the estimate sizes the engine: {', '.join(said['as_modelled'])}")
    if said["of_model"]:
        typer.echo(f"  · the model's architecture (the estimate builds {req.model}'s own): {', '.join(said['of_model'])}")
    if said["no_effect"]:
        typer.echo(f"  · no effect on a step's memory or time: {', '.join(said['no_effect'])}")
    if said["unknown"]:
        typer.echo(f"  · unknown to trainfit (effect not known): {', '.join(said['unknown'])}")
    show_estimates(req, results, False)


def as_flag(name: str, v) -> list[str]:
    """Setting `name` = `v` as `trainfit estimate` takes it: a switch alone when on and left out when off (every
    switch is off by default), a value quoted as a shell reads it."""
    import shlex

    if isinstance(v, bool):
        return [flag(name)] if v else []
    return [flag(name), shlex.quote(shown(v))]


def shown(v) -> str:
    return str(int(v)) if isinstance(v, float) and v.is_integer() and v >= 1e3 else str(v)


def flag(name: str) -> str:
    return BY_NAME[name].flag


def settings_of(readings, req, flags: tuple = ()) -> dict:
    """The settings the files set and check's `flags` (--seq, --prompt-len given), as the request holds them; those
    that do not apply to its mode (a GRPOConfig's stack: the request refuses them away from their defaults) left out,
    as `trainfit estimate` refuses them written."""
    names = [k for r in readings for k in r.values if req.mode in BY_NAME[k].meta.modes] + list(flags)
    return {k: getattr(req, k) for k in dict.fromkeys(names + (["grad_accum"] if any(r.global_batch for r in readings)
                                                               else []) + (["dp"] if req.dp != 1 else []))}


def request_of(readings, model: str | None, gpu: str | None, dp: int | None, prompt_len: int | None = None,
               seq: int | None = None, server: str | None = None):
    """(Request, notes) of the files read together, with --model, --gpu, --dp, --prompt-len, --seq and --server."""
    from .. import serving_versions
    from ..errors import SetupError
    from ..readers import combine
    from ..setup import Request

    model, values = combine(readings, model)
    notes = []
    if server is not None:  # the release the serving command is for (its flags read by its reader), its start-up
        release = serving_versions.parse(server)
        if values.get("server") is None:
            raise SetupError(f"--server {server}: the files hold no serving command (--server names the release a "
                             "`vllm serve` or SGLang command is for); drop --server")
        if serving_versions.engine_of(values["server"]) != release.engine:
            raise SetupError(f"--server {server}: the files are a {values['server']} command; drop --server or give "
                             f"a {values['server']} release")
        values["server"] = f"{release.engine}=={release.version}"  # (as resolved: vllm==0.10 is 0.10.1)
    if dp is not None:
        if values.get("dp", dp) != dp:
            raise SetupError(f"--dp {dp}: the files say {values['dp']} data-parallel ranks: drop --dp or fix them")
        values["dp"] = dp
    batches = {r.global_batch for r in readings if r.global_batch}
    if batches and "grad_accum" not in values:  # global = micro × accumulation × dp
        total, micro, ranks = batches.pop(), values.get("batch", 1), values.get("dp", 1)
        if total % (micro * ranks):
            raise SetupError(f"global batch {total} is not micro-batch {micro} × dp {ranks} × a whole accumulation: "
                             "give --dp (the data-parallel ranks) or fix the file")
        values["grad_accum"] = total // (micro * ranks)
    if seq is not None:
        if values.get("seq", seq) != seq:
            raise SetupError(f"--seq {seq}: the files say sequences of {values['seq']} tokens: drop --seq or fix them")
        values["seq"] = seq
    if prompt_len is not None:  # (the files hold none: the TRL reader's note asks for it)
        values["prompt_len"] = prompt_len
        for r in readings:
            r.not_modelled = [x for x in r.not_modelled if not x.startswith("prompt length:")]
    if gpu is None and "tokens" in values:
        values.pop("tokens")
        notes.append("the run's length (steps): its time and cost need --gpu")
    return Request(model=model, **values, **({"gpu": gpu} if gpu is not None else {})), notes
