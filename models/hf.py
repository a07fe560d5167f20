"""A corpus of real architectures: Hugging Face `transformers` models with tiny configs.

Each entry builds a `transformers` model class from a Config object (no downloads), seeded
(torch.manual_seed), in training mode with dropout active, wraps it so its logits are the
only output (what a user writes to export a model for training), and exports a forward
.onnx exactly as a user would get it: with the TorchScript exporter (`dynamo=False`,
opset 17, TrainingMode.TRAINING, no constant folding) or the default dynamo exporter (its
optimizer blind to parameter values, so it cannot merge, drop or split parameters:
_optimize_keeping_parameters).
Nothing is edited after export: the forward-model path (`onnxplan.artifacts.generate_from_onnx`)
has to cope with the file as it is.

Zoo names: `hf-<arch>` (TorchScript exporter) and `hf-<arch>-dynamo` (dynamo exporter).
Exports are static (batch and sequence fixed at export time) and cached on disk under
$ONNXPLAN_CACHE/hf, keyed by (arch, exporter, batch, torch and transformers versions, and
this file's text, so a change to a builder re-exports).
`transformers` is optional: it is imported only when a model is built.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from onnxplan.errors import ModelError, UsageError

__all__ = ["HFSpec", "EXPORTERS", "available", "hf_specs", "parse_name", "require_spec", "is_hf_name",
           "zoo_name", "export_forward", "export_dir", "build_torch_model", "example_inputs"]

EXPORTERS = ("torchscript", "dynamo")
PREFIX = "hf-"
DYNAMO_SUFFIX = "-dynamo"
SEED = 0
NUM_LABELS = 10
VOCAB = 100
SEQ = 16
IMAGE = 32
# transformers' default SDPA attention exports its attention dropout inert (TorchScript: a Dropout
# without training_mode) or not at all (dynamo); eager attention keeps it active, as training runs it
ATTENTION = "eager"


@dataclass(frozen=True)
class HFSpec:
    """One corpus architecture: `arch` (hf-<arch>), a description, its input kind and builder.

    `inputs` is "image" (float pixel_values [N, 3, IMAGE, IMAGE]) or "tokens" (int64
    input_ids [N, SEQ] in [0, VOCAB)); `builder()` returns the wrapped torch module.
    """

    arch: str
    description: str
    inputs: str
    builder: Callable[[], object]
    default_batch: int = 2


def available() -> bool:
    """Whether `transformers` can be imported (the corpus needs it)."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


# -- wrappers: logits as the only output --------------------------------------------------------

def _logits_module(model, flatten: bool = False, with_mask: bool = False):
    """`model` wrapped so forward(x) returns its logits ([N, classes]; an LM's [N*S, vocab])."""
    import torch

    class Logits(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            # a decoder gets an explicit all-ones attention mask, as a user's training loop passes
            # (without one, transformers traces a packed-sequence check through aten::diff)
            logits = (self.inner(x, attention_mask=torch.ones_like(x)) if with_mask else self.inner(x)).logits
            return logits.reshape(-1, logits.shape[-1]) if flatten else logits

    return Logits(model)


def _t5_encoder_classifier(config):
    """T5 encoder + mean pooling + a linear head (T5 has no encoder-only classifier class)."""
    import torch
    import transformers

    class T5EncoderClassifier(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = transformers.T5EncoderModel(config)
            self.dropout = torch.nn.Dropout(config.classifier_dropout)
            self.head = torch.nn.Linear(config.d_model, NUM_LABELS)

        def forward(self, x):
            hidden = self.encoder(input_ids=x).last_hidden_state
            return self.head(self.dropout(hidden.mean(dim=1)))

    return T5EncoderClassifier()


# -- builders (tiny configs; dropout > 0 wherever the architecture has it) ----------------------

def _tf():
    import transformers

    return transformers


def _resnet():
    t = _tf()
    cfg = t.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic",
                         num_labels=NUM_LABELS)
    return _logits_module(t.ResNetForImageClassification(cfg))


def _mobilenet_v2():
    t = _tf()
    cfg = t.MobileNetV2Config(image_size=IMAGE, depth_multiplier=0.25, min_depth=8,
                              classifier_dropout_prob=0.2, num_labels=NUM_LABELS)
    return _logits_module(t.MobileNetV2ForImageClassification(cfg))


def _efficientnet():
    t = _tf()
    cfg = t.EfficientNetConfig(image_size=IMAGE, width_coefficient=0.25, depth_coefficient=0.5,
                               kernel_sizes=[3, 5], in_channels=[32, 16], out_channels=[16, 24],
                               strides=[1, 2], num_block_repeats=[1, 2], expand_ratios=[1, 6],
                               hidden_dim=320, dropout_rate=0.2, drop_connect_rate=0.2,
                               num_labels=NUM_LABELS)
    return _logits_module(t.EfficientNetForImageClassification(cfg))


def _regnet():
    t = _tf()
    cfg = t.RegNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], groups_width=8,
                         layer_type="y", num_labels=NUM_LABELS)
    return _logits_module(t.RegNetForImageClassification(cfg))


def _convnext():
    t = _tf()
    cfg = t.ConvNextConfig(image_size=IMAGE, patch_size=4, num_stages=2, hidden_sizes=[16, 32],
                           depths=[1, 1], drop_path_rate=0.1, num_labels=NUM_LABELS)
    return _logits_module(t.ConvNextForImageClassification(cfg))


def _vit():
    t = _tf()
    cfg = t.ViTConfig(image_size=IMAGE, patch_size=8, hidden_size=32, num_hidden_layers=2,
                      num_attention_heads=2, intermediate_size=64, hidden_dropout_prob=0.1,
                      attention_probs_dropout_prob=0.1, num_labels=NUM_LABELS, attn_implementation=ATTENTION)
    return _logits_module(t.ViTForImageClassification(cfg))


def _swin():
    t = _tf()
    cfg = t.SwinConfig(image_size=IMAGE, patch_size=2, embed_dim=16, depths=[1, 1], num_heads=[1, 2],
                       window_size=4, mlp_ratio=2.0, hidden_dropout_prob=0.1,
                       attention_probs_dropout_prob=0.1, drop_path_rate=0.1, num_labels=NUM_LABELS,
                       attn_implementation=ATTENTION)
    return _logits_module(t.SwinForImageClassification(cfg))


def _bert():
    t = _tf()
    cfg = t.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                       intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.1,
                       attention_probs_dropout_prob=0.1, num_labels=NUM_LABELS, attn_implementation=ATTENTION)
    return _logits_module(t.BertForSequenceClassification(cfg))


def _distilbert():
    t = _tf()
    cfg = t.DistilBertConfig(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=2, hidden_dim=64,
                             max_position_embeddings=64, dropout=0.1, attention_dropout=0.1,
                             seq_classif_dropout=0.2, num_labels=NUM_LABELS, attn_implementation=ATTENTION)
    return _logits_module(t.DistilBertForSequenceClassification(cfg))


def _albert():
    t = _tf()
    cfg = t.AlbertConfig(vocab_size=VOCAB, embedding_size=16, hidden_size=32, num_hidden_layers=2,
                         num_attention_heads=2, intermediate_size=64, max_position_embeddings=64,
                         hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                         classifier_dropout_prob=0.1, num_labels=NUM_LABELS, attn_implementation=ATTENTION)
    return _logits_module(t.AlbertForSequenceClassification(cfg))


def _roberta():
    t = _tf()
    cfg = t.RobertaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                          intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.1,
                          attention_probs_dropout_prob=0.1, pad_token_id=1, num_labels=NUM_LABELS,
                          attn_implementation=ATTENTION)
    return _logits_module(t.RobertaForSequenceClassification(cfg))


def _gpt2():
    t = _tf()
    cfg = t.GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.1,
                       embd_pdrop=0.1, attn_pdrop=0.1, pad_token_id=0, bos_token_id=0, eos_token_id=0,
                       num_labels=NUM_LABELS, attn_implementation=ATTENTION)
    return _logits_module(t.GPT2ForSequenceClassification(cfg))


def _llama():
    t = _tf()
    cfg = t.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                        attention_dropout=0.1, use_cache=False, attn_implementation=ATTENTION)
    return _logits_module(t.LlamaForCausalLM(cfg), flatten=True, with_mask=True)


def _t5_encoder():
    t = _tf()
    cfg = t.T5Config(vocab_size=VOCAB, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2,
                     dropout_rate=0.1, classifier_dropout=0.1, use_cache=False, is_encoder_decoder=False,
                     attn_implementation=ATTENTION)
    return _t5_encoder_classifier(cfg)


_SPECS: dict[str, HFSpec] = {
    s.arch: s
    for s in (
        HFSpec("resnet", "ResNet (basic blocks, BatchNorm), 2 stages 16/32, 3x32x32", "image", _resnet),
        HFSpec("mobilenet-v2", "MobileNetV2 (depthwise convs, ReLU6, BatchNorm) x0.25, 3x32x32", "image",
               _mobilenet_v2),
        HFSpec("efficientnet", "EfficientNet (depthwise, squeeze-excite, SiLU, drop-connect), 3x32x32",
               "image", _efficientnet),
        HFSpec("regnet", "RegNetY (grouped convs, squeeze-excite, BatchNorm), 3x32x32", "image", _regnet),
        HFSpec("convnext", "ConvNeXt (depthwise 7x7, LayerNorm, GELU, stochastic depth), 3x32x32", "image",
               _convnext),
        HFSpec("vit", "ViT, patch 8, d32, 2 layers, 2 heads, 3x32x32", "image", _vit),
        HFSpec("swin", "Swin (shifted windows, relative position bias, stochastic depth), 3x32x32",
               "image", _swin),
        HFSpec("bert", "BERT encoder classifier, d32, 2 layers, 2 heads, seq 16, vocab 100", "tokens",
               _bert),
        HFSpec("distilbert", "DistilBERT classifier, d32, 2 layers, 2 heads, seq 16", "tokens",
               _distilbert),
        HFSpec("albert", "ALBERT classifier (shared layers, factorized embedding), d32, seq 16",
               "tokens", _albert),
        HFSpec("roberta", "RoBERTa classifier (padding-aware positions), d32, 2 layers, seq 16",
               "tokens", _roberta),
        HFSpec("gpt2", "GPT-2 sequence classifier (causal mask, last-token pooling), d32, seq 16",
               "tokens", _gpt2),
        HFSpec("llama", "LLaMA causal LM (rotary, RMSNorm, SiLU gate, GQA), d32, seq 16; [N*S, vocab]",
               "tokens", _llama),
        HFSpec("t5-encoder", "T5 encoder (relative position buckets, RMSNorm) + mean-pool head, d32",
               "tokens", _t5_encoder),
    )
}


def hf_specs() -> list[HFSpec]:
    """Every corpus architecture, in a stable order (whether or not transformers is installed)."""
    return list(_SPECS.values())


def parse_name(name: str) -> tuple[HFSpec, str] | None:
    """(spec, exporter) for a zoo name `hf-<arch>` or `hf-<arch>-dynamo`; None if not one."""
    if not name.startswith(PREFIX):
        return None
    arch, exporter = name[len(PREFIX):], "torchscript"
    if arch.endswith(DYNAMO_SUFFIX):
        arch, exporter = arch[: -len(DYNAMO_SUFFIX)], "dynamo"
    spec = _SPECS.get(arch)
    return (spec, exporter) if spec is not None else None


def require_spec(name: str) -> tuple[HFSpec, str]:
    """parse_name, or a UsageError listing the corpus names."""
    parsed = parse_name(name)
    if parsed is None:
        raise UsageError(f"unknown corpus model {name!r}; known: "
                         f"{', '.join(zoo_name(s.arch, e) for s in hf_specs() for e in EXPORTERS)}")
    return parsed


def is_hf_name(name: str) -> bool:
    return parse_name(name) is not None


def zoo_name(arch: str, exporter: str) -> str:
    return f"{PREFIX}{arch}{DYNAMO_SUFFIX if exporter == 'dynamo' else ''}"


def build_torch_model(spec: HFSpec):
    """The seeded, wrapped torch module of `spec`, in training mode (dropout active)."""
    import torch

    torch.manual_seed(SEED)
    model = spec.builder()
    model.train()
    return model


def example_inputs(spec: HFSpec, batch: int):
    """A seeded example input for `spec` at `batch` (shapes are what the export fixes)."""
    import torch

    gen = torch.Generator().manual_seed(SEED)
    if spec.inputs == "image":
        return torch.rand(batch, 3, IMAGE, IMAGE, generator=gen)
    return torch.randint(2, VOCAB, (batch, SEQ), generator=gen)


def _input_name(spec: HFSpec) -> str:
    return "pixel_values" if spec.inputs == "image" else "input_ids"


def _export_key(spec: HFSpec, exporter: str, batch: int) -> str:
    import torch
    import transformers

    text = f"{spec.arch}|{exporter}|{batch}|{torch.__version__}|{transformers.__version__}"
    h = hashlib.sha256(text.encode())
    h.update(Path(__file__).read_bytes())  # any change to the builders or export settings
    return h.hexdigest()[:16]


def export_dir(cache_dir: Path | None = None) -> Path:
    from onnxplan.artifacts import default_cache_dir

    return (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / "hf"


def _export(model, x, path: Path, exporter: str, input_name: str) -> None:
    """Export `model` on input `x` to `path` as a user would, with all exporter chatter silenced."""
    import torch

    from onnxplan.artifacts import quiet_fds

    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(io.StringIO()), quiet_fds():
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            torch.onnx.export(model, (x,), str(path), dynamo=False, opset_version=17,
                              training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                              input_names=[input_name], output_names=["logits"])
        else:
            program = torch.onnx.export(model, (x,), dynamo=True, optimize=False,
                                        input_names=[input_name], output_names=["logits"])
            _optimize_keeping_parameters(program.model)
            program.save(str(path), external_data=False)


def _optimize_keeping_parameters(model) -> None:
    """What torch.onnx.export(dynamo=True) does by default (onnxscript's optimizer: constant
    folding, rewrite rules, constants lifted to initializers), in place, but blind to the values
    of parameters and buffers: the optimizer takes every initializer for a constant, and three of
    its rewrites then make the file a different model than the user's (all seen on this corpus):
    - DeduplicateInitializersPass merges initializers of equal content: every zero bias and every
      LayerNorm weight of ones of a freshly initialised model becomes ONE trained parameter
      (hf-bert: 15 biases in one);
    - rewrites drop a zero bias (pooler and classifier Gemms): never trained;
    - folding Transpose(weight) makes a new, renamed initializer: a tied weight (embedding and
      LM head) is then trained as two.
    Unoptimized (optimize=False) the export keeps all of it right but leaves axes and shapes as
    Constant nodes onnx's version converter cannot lower to opset 17. So parameters and buffers
    are graph inputs (no value) while the optimizer runs, initializers again after."""
    from onnxscript.optimizer import optimize_ir

    kind = "pkg.torch.export.graph_signature.InputSpec.kind"
    graph = model.graph
    hidden = [(v, v.const_value) for v in list(graph.initializers.values())
              if v.metadata_props.get(kind) in ("PARAMETER", "BUFFER")]
    for v, _ in hidden:
        graph.initializers.pop(v.name)
        v.const_value = None
        graph.inputs.append(v)
    optimize_ir(model)
    for v, tensor in hidden:
        graph.inputs.remove(v)
        v.const_value = tensor
        graph.register_initializer(v)


def export_forward(name: str, batch: int | None = None, cache_dir: Path | None = None) -> Path:
    """The forward .onnx of corpus model `name` (hf-<arch>[-dynamo]) at `batch`, exported once.

    Cached at <cache>/hf/<key>/<name>-b<batch>.onnx; written to a temp name and renamed.
    UsageError if `name` is unknown or transformers is missing; ModelError if export fails.
    """
    spec, exporter = require_spec(name)
    if not available():
        raise UsageError(f"{name} needs the 'transformers' package: pip install transformers")
    batch = int(batch or spec.default_batch)
    if batch < 1:
        raise UsageError(f"batch must be a positive integer, got {batch}")
    folder = export_dir(cache_dir) / _export_key(spec, exporter, batch)
    path = folder / f"{name}-b{batch}.onnx"  # the file's stem names the model in onnxplan's output
    if path.is_file():
        return path
    try:
        export_to(path, build_torch_model(spec), example_inputs(spec, batch), exporter, _input_name(spec))
    except Exception as exc:  # noqa: BLE001 - the exporters raise many types; one line for the user
        detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise ModelError(f"exporting {name} with the {exporter} exporter failed: {detail}") from None
    return path


def export_to(path: Path, model, inputs, exporter: str, input_name: str) -> None:
    """Export `model` into `path` through a temporary file beside it (renamed into place), so
    an interrupted or failed export leaves no half-written model in the cache."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".onnx", dir=path.parent)
    os.close(fd)
    try:
        _export(model, inputs, Path(tmp), exporter, input_name)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
