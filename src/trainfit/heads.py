"""Task heads: which one a run trains, how many labels it scores, and what each family's transformers class puts on
top of the base model. Plain data and arithmetic (no torch): the one place a head is resolved.

A head is chosen by `--head`, else by the config's `architectures` (BertForSequenceClassification -> seq-cls), else
it is the family's language-model head (causal-lm for decoders, masked-lm for BERT/RoBERTa): `resolve`.
`spec_from_config` records the config's head in the ModelSpec; `models.hf_config.for_setup` gives the spec of the
model a setup trains (the engines call it at their entry; `Request.setup(spec)` fills `Setup.head` with the same
`resolve`).

The layers of each head, read from transformers 5.x:
  masked-lm  BertForMaskedLM (modeling_bert.py: cls.predictions = BertPredictionHeadTransform dense+act+LayerNorm,
             decoder tied to the word embeddings + bias) / RobertaForMaskedLM (RobertaLMHead: the same shapes);
  causal-lm  *ForCausalLM / GPT2LMHeadModel: lm_head (vocab x hidden, tied or not) on every token;
  seq-cls    BertForSequenceClassification: BertModel's pooler (dense h x h + bias, tanh, on token 0), dropout
             (classifier_dropout, else hidden_dropout_prob), classifier h x labels + bias;
             RobertaForSequenceClassification: no pooler; RobertaClassificationHead on token 0: dropout, dense h x h
             + bias, tanh, dropout, out_proj h x labels + bias;
             decoders (modeling_layers.py GenericForSequenceClassification, GPT2/GPTNeoX/OPTForSequenceClassification):
             score (hidden x labels, no bias; OPT: word_embed_proj_dim x labels) on EVERY token, then the logits of
             each sequence's last non-padding token are gathered (pad_token_id is required for batch > 1);
  token-cls  Bert/RobertaForTokenClassification: dropout (classifier_dropout, else hidden_dropout_prob), classifier
             h x labels + bias on every token; GenericForTokenClassification: dropout (classifier_dropout, else
             hidden_dropout, else 0.1), score h x labels with bias `token_classification_bias` (default True);
             GPT2ForTokenClassification (same dropout rule, classifier with bias); GPTNeoXForTokenClassification
             (dropout = classifier_dropout, GPTNeoXConfig default 0.1). OPT has no token-classification class.
Losses (transformers/loss/loss_utils.py and the classes above): seq-cls with num_labels > 1 and integer labels is
cross-entropy on the (batch, labels) logits; num_labels == 1 is regression (MSELoss on float labels); token-cls is
cross-entropy on (batch x seq, labels), upcast to fp32 first by the generic ForTokenClassification loss.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .errors import ConfigError, SetupError

if TYPE_CHECKING:  # pragma: no cover
    from .spec import ModelSpec

HEADS = ("causal-lm", "masked-lm", "seq-cls", "token-cls", "seq2seq-lm")
LM_HEADS = ("causal-lm", "masked-lm", "seq2seq-lm")
# encoder-decoder families: their LM head is the decoder's over the target sequence (AutoModelForSeq2SeqLM)
SEQ2SEQ_FAMILIES = ("t5", "mt5", "bart", "whisper")
CLASSIFIERS = ("seq-cls", "token-cls")
DEFAULT_LABELS = 2  # transformers PretrainedConfig: num_labels defaults to 2 (id2label LABEL_0, LABEL_1)

# transformers' class per model_type and head: models/auto/modeling_auto.py MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
# MODEL_FOR_MASKED_LM_MAPPING_NAMES, MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES and
# MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES (tests/analytic/test_heads.py checks this table against them).
# BertLMHeadModel / RobertaForCausalLM are left out: they need is_decoder=True, which hf_config refuses.
_DECODER_PREFIX = {
    "llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3", "gemma": "Gemma", "gemma2": "Gemma2",
    "phi3": "Phi3", "mixtral": "Mixtral", "qwen2_moe": "Qwen2Moe", "qwen3_moe": "Qwen3Moe", "gpt_neox": "GPTNeoX",
    "nemotron": "Nemotron",
    "qwen3_next": "Qwen3Next",  # modeling_qwen3_next.py: Qwen3NextFor{CausalLM,SequenceClassification,TokenClassification}
    "gpt_oss": "GptOss",  # modeling_gpt_oss.py: GptOssFor{CausalLM,SequenceClassification,TokenClassification}
}
CLASSES: dict[str, dict[str, str]] = {
    **{mt: {"causal-lm": f"{p}ForCausalLM", "seq-cls": f"{p}ForSequenceClassification",
            "token-cls": f"{p}ForTokenClassification"} for mt, p in _DECODER_PREFIX.items()},
    "gpt2": {"causal-lm": "GPT2LMHeadModel", "seq-cls": "GPT2ForSequenceClassification",
             "token-cls": "GPT2ForTokenClassification"},
    "opt": {"causal-lm": "OPTForCausalLM", "seq-cls": "OPTForSequenceClassification"},
    # Gemma 3's language model: modeling_gemma3.py Gemma3ForCausalLM, Gemma3TextForSequenceClassification (no token-cls)
    "gemma3_text": {"causal-lm": "Gemma3ForCausalLM", "seq-cls": "Gemma3TextForSequenceClassification"},
    "deepseek_v2": {"causal-lm": "DeepseekV2ForCausalLM", "seq-cls": "DeepseekV2ForSequenceClassification"},
    "deepseek_v3": {"causal-lm": "DeepseekV3ForCausalLM", "seq-cls": "DeepseekV3ForSequenceClassification",
                    "token-cls": "DeepseekV3ForTokenClassification"},
    "llama4_text": {"causal-lm": "Llama4ForCausalLM"},  # modeling_llama4.py: no classifier heads
    "nemotron_h": {"causal-lm": "NemotronHForCausalLM"},  # modeling_nemotron_h.py: no classifier heads
    # vision-language models: the generative head only (modeling_qwen2_5_vl.py Qwen2_5_VLForConditionalGeneration)
    "qwen2_5_vl": {"causal-lm": "Qwen2_5_VLForConditionalGeneration"},
    "qwen3_vl": {"causal-lm": "Qwen3VLForConditionalGeneration"},  # modeling_qwen3_vl.py
    "gemma3": {"causal-lm": "Gemma3ForConditionalGeneration"},  # modeling_gemma3.py
    "mllama": {"causal-lm": "MllamaForConditionalGeneration"},  # modeling_mllama.py
    "bert": {"masked-lm": "BertForMaskedLM", "seq-cls": "BertForSequenceClassification",
             "token-cls": "BertForTokenClassification"},
    "roberta": {"masked-lm": "RobertaForMaskedLM", "seq-cls": "RobertaForSequenceClassification",
                "token-cls": "RobertaForTokenClassification"},
    # modeling_t5.py T5ForConditionalGeneration (MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES). NB: transformers'
    # T5ForSequenceClassification / T5ForTokenClassification are not modelled (refused by check_available)
    "t5": {"seq2seq-lm": "T5ForConditionalGeneration"},
    "mt5": {"seq2seq-lm": "MT5ForConditionalGeneration"},  # modeling_mt5.py (its classifiers: not modelled)
    # modeling_bart.py BartForConditionalGeneration. NB: BartForCausalLM (the decoder alone) and
    # BartForSequenceClassification are not modelled
    "bart": {"seq2seq-lm": "BartForConditionalGeneration"},
    # modeling_whisper.py WhisperForConditionalGeneration (MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES). NB: its decoder
    # alone (WhisperForCausalLM) and WhisperForAudioClassification are not modelled
    "whisper": {"seq2seq-lm": "WhisperForConditionalGeneration"},
}

# `architectures` class-name endings -> head. BertForPreTraining is masked-LM pre-training (NB: its next-sentence
# head, pooler + 2-way classifier, is left out: an under-count of h*(h+2)+h+2 parameters and O(batch*h) bytes).
_ARCH_ENDINGS = (("ForSequenceClassification", "seq-cls"), ("ForTokenClassification", "token-cls"),
                 ("ForMaskedLM", "masked-lm"), ("ForPreTraining", "masked-lm"), ("ForCausalLM", "causal-lm"),
                 ("LMHeadModel", "causal-lm"), ("ForConditionalGeneration", "seq2seq-lm"))


def family_default(model_type: str, causal: bool) -> str:
    """What trainfit trained before heads existed: the family's language-model head."""
    if model_type in SEQ2SEQ_FAMILIES:
        return "seq2seq-lm"
    return "causal-lm" if causal else "masked-lm"


def from_architectures(config: dict, model_type: str) -> str | None:
    """The head the config's `architectures` names, when trainfit models it for the family (None otherwise: a bare
    model, question answering, multiple choice... fall back to the family's LM head)."""
    archs = config.get("architectures")
    if not isinstance(archs, list):
        return None
    for arch in archs:
        if not isinstance(arch, str):
            continue
        for ending, head in _ARCH_ENDINGS:
            if arch.endswith(ending) and head in CLASSES.get(model_type, {}):
                return head
    return None


def config_labels(config: dict, name: str) -> int:
    """num_labels as transformers reads it (PretrainedConfig.__init__): `num_labels`, else len(id2label), else 2."""
    n = config.get("num_labels")
    if n is None and isinstance(config.get("id2label"), dict) and config["id2label"]:
        n = len(config["id2label"])
    if n is None:
        return DEFAULT_LABELS
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"{name}: 'num_labels' must be a positive integer, got {n!r}")
    return n


def check_available(model_type: str, head: str, name: str) -> None:
    """A head transformers has no class for on this family -> one-line SetupError naming the heads it has."""
    have = CLASSES.get(model_type, {})
    if head not in have:
        options = ", ".join(have) or "none"
        why = (" (transformers' causal BERT/RoBERTa needs is_decoder=True, a decoder setup trainfit does not model)"
               if head == "causal-lm" and model_type in ("bert", "roberta") else "")
        if model_type in SEQ2SEQ_FAMILIES and head in HEADS:
            raise SetupError(f"--head {head}: trainfit models the {model_type} encoder-decoder with its LM head only "
                             f"(transformers' other {model_type} heads are not modelled); {name} can train: {options} "
                             "(--head)")
        raise SetupError(f"--head {head}: transformers has no {model_type} model with that head{why}; "
                         f"{name} can train: {options} (--head)")


def resolve(spec: "ModelSpec", requested: str | None, mode: str = "train") -> str:
    """The head a run trains: `requested` (--head), else the spec's (from its config's architectures). Inference
    always runs the family's generative/MLM head (NB: classifier inference is not modelled)."""
    if mode != "train":
        return family_default(spec.family, spec.causal)
    head = requested or spec.head or family_default(spec.family, spec.causal)
    if head not in HEADS:
        raise SetupError(f"--head {head!r} is not supported; choose one of: {', '.join(HEADS)}")
    if spec.config:  # hand-built specs (tests) have no family table to check against
        check_available(spec.family, head, spec.name)
    return head


@dataclass(frozen=True)
class Layout:
    """The layers a head puts on the base model's output (see the module docstring for their sources)."""

    kind: str
    width: int  # output features: the vocabulary for LM heads, num_labels for classifiers
    in_dim: int  # the output layer's input width (hidden; OPT's score: word_embed_proj_dim)
    rows: str  # which positions reach the output layer: "all", "first" (token 0), or "all-last" (every position
    # scored, then each sequence's last one gathered: decoders' seq-cls)
    pooler: bool  # a dense h x h + bias with tanh before the output layer (BERT pooler, RoBERTa classification head)
    dense_first: bool  # that dense reads token 0 directly (BERT's pooler), not through a dropout (RoBERTa)
    dropouts: int  # dropouts applied to the output layer's (or pooler's) input, 0..2
    dropout_p: float
    out_bias: bool
    loss: str  # "ce" (cross-entropy), "ce-upcast" (cross-entropy on an fp32 copy), "mse" (regression)


def classifier_dropout(c: dict, model_type: str) -> float:
    """The classifier heads' dropout p as transformers reads it from the config `c`."""
    if model_type in ("bert", "roberta"):
        v = c.get("classifier_dropout")
        v = c.get("hidden_dropout_prob") if v is None else v
        return float(0.1 if v is None else v)  # BertConfig.hidden_dropout_prob = 0.1
    if model_type == "gpt_neox":
        v = c.get("classifier_dropout")
        return float(0.1 if v is None else v)  # GPTNeoXConfig.classifier_dropout = 0.1
    for key in ("classifier_dropout", "hidden_dropout"):  # GenericForTokenClassification, GPT2ForTokenClassification
        if c.get(key) is not None:
            return float(c[key])
    return 0.1


def layout(spec: "ModelSpec") -> Layout:
    """The spec's classifier head (LM heads keep their own fields: tied_embeddings, mlm_transform, lm_head_bias)."""
    kind = spec.head or family_default(spec.family, spec.causal)
    h = spec.hidden
    encoder = spec.family in ("bert", "roberta")
    if kind in LM_HEADS:
        return Layout(kind, spec.vocab, spec.embed_proj_dim or h, "all", False, False, 0, 0.0, spec.lm_head_bias,
                      "ce-upcast")
    n = spec.num_labels
    if kind == "seq-cls":
        loss = "mse" if n == 1 else "ce"
        if encoder:  # BERT: pooler then one dropout; RoBERTa: dropout, dense, tanh, dropout
            roberta = spec.family == "roberta"
            return Layout(kind, n, h, "first", True, not roberta, 2 if roberta else 1, spec.classifier_dropout, True,
                          loss)
        return Layout(kind, n, spec.embed_proj_dim or h, "all-last", False, False, 0, 0.0, False, loss)
    bias = spec.token_cls_bias if not encoder else True
    upcast = "ce" if spec.family in ("bert", "roberta", "gpt2") else "ce-upcast"  # own CrossEntropyLoss vs loss_utils
    return Layout(kind, n, h, "all", False, False, 1, spec.classifier_dropout, bias, upcast)
