"""The estimate's note names the attention kernel it prices (activations.resolved_kernel), not only the one asked for:
gpt-oss on the HF stack was noted 'attention kernel: flash' while its memory and time were its own eager attention
with sinks (388 GiB of s x s temporaries at 32k tokens). Independent source: transformers' own flags, the model
class's _supports_sdpa (False for gpt-oss: its sinks have no SDPA path; True for Llama)."""
from __future__ import annotations

import pytest

from trainfit.api import load_spec
from trainfit.engines import analytic
from trainfit.setup import Setup


@pytest.mark.parametrize("model, cls", [("gpt-oss-20b", "gpt_oss.modeling_gpt_oss.GptOssPreTrainedModel"),
                                        ("llama-3.2-1b", "llama.modeling_llama.LlamaPreTrainedModel")])
@pytest.mark.parametrize("attention", ["auto", "flash"])
def test_the_note_names_the_kernel_the_family_runs(model, cls, attention):
    import importlib

    module, name = cls.rsplit(".", 1)
    sdpa = getattr(importlib.import_module(f"transformers.models.{module}"), name)._supports_sdpa
    e = analytic(load_spec(model), Setup(seq=1024, attention=attention))
    note = next(n for n in e.notes if n.startswith("attention kernel: "))
    if sdpa:
        assert note.startswith("attention kernel: flash;")
    else:
        assert note.startswith("attention kernel: eager (the model's own eager attention")
        assert ("--attention flash is not what runs" in note) == (attention == "flash")
