"""A corpus of real architectures: Hugging Face `transformers` models at two scales.

Each entry builds a `transformers` model class from a Config object (no downloads), seeded
(torch.manual_seed), in training mode with dropout active, wraps it so its logits are the
only output (what a user writes to export a model for training), and exports a forward
.onnx exactly as a user would get it: with the TorchScript exporter (`dynamo=False`,
opset 17, TrainingMode.TRAINING, no constant folding) or the default dynamo exporter (its
optimizer blind to parameter values, so it cannot merge, drop or split parameters:
_optimize_keeping_parameters).
Nothing is edited after export: the forward-model path (`onnxplan.loading.artifacts.generate_from_onnx`)
has to cope with the file as it is.

Zoo names: `hf-<arch>` (TorchScript exporter) and `hf-<arch>-dynamo` (dynamo exporter), at the
tiny CI scale (TINY: hidden 32, 2 layers, seq 16, 3x32x32, batch 2); `hf-<arch>@bench` and
`hf-<arch>-dynamo@bench` are the same architectures at the bench scale (BENCH: realistic small
training configs, hidden 256, 4 layers, seq 128, 3x96x96, batch 8), where kernel time, not the
per-call overhead, makes the step. `hf-<arch>@full` (FULL_SIZES: ResNet-50, MobileNetV2, EfficientNet-B0 and
ViT-B/16 at 224x224, BERT-base, GPT-2 small, a ~750M-parameter LLaMA) are the published sizes users
fine-tune. Each builder takes the Scale and picks its sizes from it.
Exports are static (batch and sequence fixed at export time) and cached on disk under
$ONNXPLAN_CACHE/hf, keyed by (arch, exporter, scale, batch, torch and transformers versions, and
this file's text, so a change to a builder re-exports).
`transformers` is optional: it is imported only when a model is built.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from onnxplan.errors import ModelError, UsageError
from onnxplan.files import atomic_path

__all__ = [
    "BENCH",
    "EXPORTERS",
    "FULL",
    "FULL_SIZES",
    "SCALES",
    "TINY",
    "HFSpec",
    "Scale",
    "available",
    "build_torch_model",
    "example_inputs",
    "export_dir",
    "export_forward",
    "hf_specs",
    "is_hf_name",
    "parse_name",
    "require_spec",
    "zoo_name",
]

EXPORTERS = ("torchscript", "dynamo")
PREFIX = "hf-"
DYNAMO_SUFFIX = "-dynamo"
SCALE_SEP = "@"
SEED = 0
NUM_LABELS = 10


@dataclass(frozen=True)
class Scale:
    """The sizes a builder takes: the text models' shared dimensions, the image side, the batch;
    `pick(tiny, bench)` chooses an architecture's own sizes (a vision model's widths)."""

    name: str
    batch: int
    image: int
    seq: int
    vocab: int
    hidden: int
    layers: int
    heads: int
    ffn: int
    positions: int

    def pick(self, tiny, bench, full=None):
        """An architecture's own size at this scale (the full scale falls back to bench's)."""
        if self is TINY:
            return tiny
        return full if self.name == "full" and full is not None else bench

    @property
    def suffix(self) -> str:
        return "" if self is TINY else f"{SCALE_SEP}{self.name}"


# the CI scale: every step ~1 ms, a few us per node
TINY = Scale("tiny", batch=2, image=32, seq=16, vocab=100, hidden=32, layers=2, heads=2, ffn=64, positions=64)
# a realistic small training step (one ORT step ~20-500 ms on one thread): kernel time dominates
BENCH = Scale("bench", batch=8, image=96, seq=128, vocab=4000, hidden=256, layers=4, heads=4, ffn=1024,
              positions=512)
# the published sizes users fine-tune (BERT-base's dimensions; each architecture's own in FULL_SIZES):
# planned and run by benchmarks and opt-in tests, too slow and too large for CI's run
FULL = Scale("full", batch=8, image=224, seq=128, vocab=30522, hidden=768, layers=12, heads=12, ffn=3072,
             positions=512)
SCALES = {s.name: s for s in (TINY, BENCH, FULL)}
# the architectures with a full-size entry, each at its published configuration and a batch that
# trains on a 24 GiB machine (GPT-2 small at seq 256, LLaMA ~750M parameters: over protobuf's 2 GB)
FULL_SIZES: dict[str, tuple[str, dict]] = {
    "resnet": ("ResNet-50 (64-2048, 3-4-6-3 bottleneck blocks, 1000 classes), 3x224x224", {"batch": 16}),
    "mobilenet-v2": ("MobileNetV2 x1.0 (1000 classes), 3x224x224", {"batch": 2}),
    "efficientnet": ("EfficientNet-B0 (1000 classes), 3x224x224", {"batch": 2}),
    "vit": ("ViT-B/16 (d768, 12 layers, 12 heads, FFN 3072, 1000 classes), 3x224x224", {"batch": 8}),
    "bert": ("BERT-base classifier (d768, 12 layers, 12 heads, FFN 3072, vocab 30522), seq 128", {}),
    "gpt2-lm": (("GPT-2 small causal LM (124M: d768, 12 layers, 12 heads, vocab 50257, LM head tied), seq 256; "
                 "[N, S, vocab]"), {"batch": 4, "seq": 256, "vocab": 50257, "positions": 1024}),
    "llama": (("LLaMA-architecture causal LM, ~750M parameters (d2048, 12 layers, 16 heads, FFN 5632, "
               "vocab 32000: over 2 GB of float32 weights), seq 256; [N*S, vocab]"),
              {"batch": 1, "seq": 256, "vocab": 32000, "hidden": 2048, "heads": 16, "ffn": 5632, "positions": 2048}),
}
IMAGENET_LABELS = 1000  # the full-size vision classifiers keep their published heads
VOCAB = TINY.vocab
SEQ = TINY.seq
IMAGE = TINY.image
# transformers' default SDPA attention exports its attention dropout inert (TorchScript: a Dropout
# without training_mode) or not at all (dynamo); eager attention keeps it active, as training runs it
ATTENTION = "eager"


@dataclass(frozen=True)
class HFSpec:
    """One corpus architecture at one scale: `arch` (hf-<arch>), a description, its input kind,
    builder and the bench scale's sizes in words.

    `inputs` is "image" (float pixel_values [N, 3, image, image]) or "tokens" (int64
    input_ids [N, seq] in [0, vocab)); `builder(scale)` returns the wrapped torch module;
    `loss` is the loss it trains with unless --loss says otherwise.
    """

    arch: str
    tiny_description: str
    inputs: str
    builder: Callable[[Scale], object]
    bench_description: str
    scale: Scale = TINY
    loss: str = "ce"

    @property
    def default_batch(self) -> int:
        return self.scale.batch

    @property
    def description(self) -> str:
        if self.scale is TINY:
            return self.tiny_description
        if self.scale.name == FULL.name:
            return f"{FULL_SIZES[self.arch][0]} (full size)"
        return f"{self.bench_description} (bench scale)"


def available() -> bool:
    """Whether `transformers` is installed (the corpus needs it); found without importing it
    (an import costs over a second, and `models list` or a cached export need none)."""
    import importlib.util

    return importlib.util.find_spec("transformers") is not None


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


# -- builders (dropout > 0 wherever the architecture has it); each takes the Scale ---------------
# TINY: the CI configs. BENCH: the text models at hidden 256, 4 layers, 4 heads, FFN 1024, seq 128,
# vocab 4000; the vision models at 3x96x96 with their real (or the family's smallest real) widths.

def _tf():
    import transformers

    return transformers


def _resnet(s: Scale):
    t = _tf()
    cfg = t.ResNetConfig(embedding_size=s.pick(16, 64, 64),
                         hidden_sizes=s.pick([16, 32], [64, 128, 256, 512], [256, 512, 1024, 2048]),
                         depths=s.pick([1, 1], [2, 2, 2, 2], [3, 4, 6, 3]),
                         layer_type=s.pick("basic", "basic", "bottleneck"),
                         num_labels=s.pick(NUM_LABELS, NUM_LABELS, IMAGENET_LABELS))
    return _logits_module(t.ResNetForImageClassification(cfg))


def _mobilenet_v2(s: Scale):
    t = _tf()
    cfg = t.MobileNetV2Config(image_size=s.image, depth_multiplier=s.pick(0.25, 1.0), min_depth=8,
                              classifier_dropout_prob=0.2,
                              num_labels=s.pick(NUM_LABELS, NUM_LABELS, IMAGENET_LABELS))
    return _logits_module(t.MobileNetV2ForImageClassification(cfg))


def _efficientnet(s: Scale):
    t = _tf()
    if s is TINY:
        blocks = dict(width_coefficient=0.25, depth_coefficient=0.5, kernel_sizes=[3, 5],
                      in_channels=[32, 16], out_channels=[16, 24], strides=[1, 2], num_block_repeats=[1, 2],
                      expand_ratios=[1, 6], hidden_dim=320)
    else:  # EfficientNet-B0: transformers' default block lists at width and depth 1.0
        blocks = dict(width_coefficient=1.0, depth_coefficient=1.0, hidden_dim=1280)
    cfg = t.EfficientNetConfig(image_size=s.image, **blocks, dropout_rate=0.2, drop_connect_rate=0.2,
                               num_labels=s.pick(NUM_LABELS, NUM_LABELS, IMAGENET_LABELS))
    return _logits_module(t.EfficientNetForImageClassification(cfg))


def _regnet(s: Scale):
    t = _tf()
    cfg = t.RegNetConfig(embedding_size=s.pick(16, 32), hidden_sizes=s.pick([16, 32], [24, 56, 152, 368]),
                         depths=s.pick([1, 1], [1, 1, 4, 7]), groups_width=8, layer_type="y",
                         num_labels=NUM_LABELS)
    return _logits_module(t.RegNetForImageClassification(cfg))


def _convnext(s: Scale):
    t = _tf()
    cfg = t.ConvNextConfig(image_size=s.image, patch_size=4, num_stages=s.pick(2, 4),
                           hidden_sizes=s.pick([16, 32], [40, 80, 160, 320]),
                           depths=s.pick([1, 1], [2, 2, 6, 2]), drop_path_rate=0.1, num_labels=NUM_LABELS)
    return _logits_module(t.ConvNextForImageClassification(cfg))


def _vit(s: Scale):
    t = _tf()
    cfg = t.ViTConfig(image_size=s.image, patch_size=s.pick(8, 12, 16), hidden_size=s.hidden,
                      num_hidden_layers=s.layers, num_attention_heads=s.heads, intermediate_size=s.ffn,
                      hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, num_labels=NUM_LABELS,
                      attn_implementation=ATTENTION)
    return _logits_module(t.ViTForImageClassification(cfg))


def _swin(s: Scale):
    t = _tf()
    # bench: 3 stages at 24/12/6 tokens a side (a 4th at 3 < window 6 does not export: transformers
    # shrinks the window there but keeps the 6x6 relative position bias)
    cfg = t.SwinConfig(image_size=s.image, patch_size=s.pick(2, 4), embed_dim=s.pick(16, 64),
                       depths=s.pick([1, 1], [2, 2, 6]), num_heads=s.pick([1, 2], [2, 4, 8]),
                       window_size=s.pick(4, 6), mlp_ratio=s.pick(2.0, 4.0), hidden_dropout_prob=0.1,
                       attention_probs_dropout_prob=0.1, drop_path_rate=0.1, num_labels=NUM_LABELS,
                       attn_implementation=ATTENTION)
    return _logits_module(t.SwinForImageClassification(cfg))


def _bert(s: Scale):
    t = _tf()
    cfg = t.BertConfig(vocab_size=s.vocab, hidden_size=s.hidden, num_hidden_layers=s.layers,
                       num_attention_heads=s.heads, intermediate_size=s.ffn,
                       max_position_embeddings=s.positions, hidden_dropout_prob=0.1,
                       attention_probs_dropout_prob=0.1, num_labels=NUM_LABELS, attn_implementation=ATTENTION)
    return _logits_module(t.BertForSequenceClassification(cfg))


def _distilbert(s: Scale):
    t = _tf()
    cfg = t.DistilBertConfig(vocab_size=s.vocab, dim=s.hidden, n_layers=s.layers, n_heads=s.heads,
                             hidden_dim=s.ffn, max_position_embeddings=s.positions, dropout=0.1,
                             attention_dropout=0.1, seq_classif_dropout=0.2, num_labels=NUM_LABELS,
                             attn_implementation=ATTENTION)
    return _logits_module(t.DistilBertForSequenceClassification(cfg))


def _albert(s: Scale):
    t = _tf()
    cfg = t.AlbertConfig(vocab_size=s.vocab, embedding_size=s.pick(16, 128), hidden_size=s.hidden,
                         num_hidden_layers=s.layers, num_attention_heads=s.heads, intermediate_size=s.ffn,
                         max_position_embeddings=s.positions, hidden_dropout_prob=0.1,
                         attention_probs_dropout_prob=0.1, classifier_dropout_prob=0.1, num_labels=NUM_LABELS,
                         attn_implementation=ATTENTION)
    return _logits_module(t.AlbertForSequenceClassification(cfg))


def _roberta(s: Scale):
    t = _tf()
    cfg = t.RobertaConfig(vocab_size=s.vocab, hidden_size=s.hidden, num_hidden_layers=s.layers,
                          num_attention_heads=s.heads, intermediate_size=s.ffn,
                          max_position_embeddings=s.positions, hidden_dropout_prob=0.1,
                          attention_probs_dropout_prob=0.1, pad_token_id=1, num_labels=NUM_LABELS,
                          attn_implementation=ATTENTION)
    return _logits_module(t.RobertaForSequenceClassification(cfg))


def _gpt2(s: Scale):
    t = _tf()
    cfg = t.GPT2Config(vocab_size=s.vocab, n_positions=s.positions, n_embd=s.hidden, n_layer=s.layers,
                       n_head=s.heads, resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1, pad_token_id=0,
                       bos_token_id=0, eos_token_id=0, num_labels=NUM_LABELS, attn_implementation=ATTENTION)
    return _logits_module(t.GPT2ForSequenceClassification(cfg))


def _gpt2_lm(s: Scale):
    t = _tf()
    cfg = t.GPT2Config(vocab_size=s.vocab, n_positions=s.positions, n_embd=s.hidden, n_layer=s.layers,
                       n_head=s.heads, resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1, bos_token_id=0,
                       eos_token_id=0, use_cache=False, attn_implementation=ATTENTION)
    return _logits_module(t.GPT2LMHeadModel(cfg), with_mask=True)


def _llama(s: Scale):
    t = _tf()
    cfg = t.LlamaConfig(vocab_size=s.vocab, hidden_size=s.hidden, intermediate_size=s.ffn,
                        num_hidden_layers=s.layers, num_attention_heads=s.pick(4, 4, s.heads),
                        num_key_value_heads=s.pick(2, 2, s.heads),
                        max_position_embeddings=s.positions, attention_dropout=0.1, use_cache=False,
                        attn_implementation=ATTENTION)
    return _logits_module(t.LlamaForCausalLM(cfg), flatten=True, with_mask=True)


def _t5_encoder(s: Scale):
    t = _tf()
    cfg = t.T5Config(vocab_size=s.vocab, d_model=s.hidden, d_kv=s.pick(16, 64), d_ff=s.ffn,
                     num_layers=s.layers, num_heads=s.heads, dropout_rate=0.1, classifier_dropout=0.1,
                     use_cache=False, is_encoder_decoder=False, attn_implementation=ATTENTION)
    return _t5_encoder_classifier(cfg)


_TEXT = "d256, 4 layers, 4 heads, FFN 1024, seq 128, vocab 4000"
_SPECS: dict[str, HFSpec] = {
    s.arch: s
    for s in (
        HFSpec("resnet", "ResNet (basic blocks, BatchNorm), 2 stages 16/32, 3x32x32", "image", _resnet,
               "ResNet-18 (64-512, 2-2-2-2 basic blocks), 3x96x96"),
        HFSpec("mobilenet-v2", "MobileNetV2 (depthwise convs, ReLU6, BatchNorm) x0.25, 3x32x32", "image",
               _mobilenet_v2, "MobileNetV2 x1.0, 3x96x96"),
        HFSpec("efficientnet", "EfficientNet (depthwise, squeeze-excite, SiLU, drop-connect), 3x32x32",
               "image", _efficientnet, "EfficientNet-B0 (width and depth 1.0), 3x96x96"),
        HFSpec("regnet", "RegNetY (grouped convs, squeeze-excite, BatchNorm), 3x32x32", "image", _regnet,
               "RegNetY-200MF (24-368, 1-1-4-7 blocks, group width 8), 3x96x96"),
        HFSpec("convnext", "ConvNeXt (depthwise 7x7, LayerNorm, GELU, stochastic depth), 3x32x32", "image",
               _convnext, "ConvNeXt-atto (40-320, 2-2-6-2 blocks), 3x96x96"),
        HFSpec("vit", "ViT, patch 8, d32, 2 layers, 2 heads, 3x32x32", "image", _vit,
               "ViT, patch 12 (64 patches), d256, 4 layers, 4 heads, FFN 1024, 3x96x96"),
        HFSpec("swin", "Swin (shifted windows, relative position bias, stochastic depth), 3x32x32",
               "image", _swin, "Swin (embed 64, 2-2-6 blocks, window 6, patch 4), 3x96x96"),
        HFSpec("bert", "BERT encoder classifier, d32, 2 layers, 2 heads, seq 16, vocab 100", "tokens",
               _bert, f"BERT classifier, {_TEXT}"),
        HFSpec("distilbert", "DistilBERT classifier, d32, 2 layers, 2 heads, seq 16", "tokens",
               _distilbert, f"DistilBERT classifier, {_TEXT}"),
        HFSpec("albert", "ALBERT classifier (shared layers, factorized embedding), d32, seq 16",
               "tokens", _albert, f"ALBERT classifier (embedding 128), {_TEXT}"),
        HFSpec("roberta", "RoBERTa classifier (padding-aware positions), d32, 2 layers, seq 16",
               "tokens", _roberta, f"RoBERTa classifier, {_TEXT}"),
        HFSpec("gpt2", "GPT-2 sequence classifier (causal mask, last-token pooling), d32, seq 16",
               "tokens", _gpt2, f"GPT-2 sequence classifier, {_TEXT}"),
        HFSpec("gpt2-lm", "GPT-2 causal LM (LM head tied to the token embedding), d32, seq 16; [N, S, vocab]",
               "tokens", _gpt2_lm, f"GPT-2 causal LM, {_TEXT}; [N, S, vocab]", loss="causal-lm"),
        HFSpec("llama", "LLaMA causal LM (rotary, RMSNorm, SiLU gate, GQA), d32, seq 16; [N*S, vocab]",
               "tokens", _llama, f"LLaMA causal LM (GQA 4/2), {_TEXT}; [N*S, vocab]"),
        HFSpec("t5-encoder", "T5 encoder (relative position buckets, RMSNorm) + mean-pool head, d32",
               "tokens", _t5_encoder, f"T5 encoder + mean-pool head (d_kv 64), {_TEXT}"),
    )
}


def _at(spec: HFSpec, scale: Scale) -> HFSpec:
    """`spec` at `scale`; the full scale takes the architecture's own published sizes."""
    if scale is TINY:
        return spec
    if scale is FULL:
        scale = replace(FULL, **FULL_SIZES[spec.arch][1])
    return replace(spec, scale=scale)


def hf_specs(scale: Scale = TINY) -> list[HFSpec]:
    """Every corpus architecture at `scale` (at the full scale, those of FULL_SIZES), in a stable
    order (whether or not transformers is installed)."""
    return [_at(spec, scale) for spec in _SPECS.values() if scale is not FULL or spec.arch in FULL_SIZES]


def parse_name(name: str) -> tuple[HFSpec, str] | None:
    """(spec at its scale, exporter) for a zoo name `hf-<arch>[-dynamo][@bench]`; None if not one."""
    if not name.startswith(PREFIX):
        return None
    arch, sep, scale_name = name[len(PREFIX):].partition(SCALE_SEP)
    scale = SCALES.get(scale_name) if sep else TINY
    if scale is None or scale is TINY and sep:  # "@tiny" is spelled without a suffix
        return None
    exporter = "torchscript"
    if arch.endswith(DYNAMO_SUFFIX):
        arch, exporter = arch[: -len(DYNAMO_SUFFIX)], "dynamo"
    spec = _SPECS.get(arch)
    if spec is None or scale is FULL and arch not in FULL_SIZES:
        return None
    return _at(spec, scale), exporter


def require_spec(name: str) -> tuple[HFSpec, str]:
    """parse_name, or a UsageError listing the corpus names."""
    parsed = parse_name(name)
    if parsed is None:
        raise UsageError(f"unknown corpus model {name!r}; known: "
                         f"{', '.join(zoo_name(s.arch, e) for s in hf_specs() for e in EXPORTERS)}, "
                         f"each also at the bench scale (NAME{BENCH.suffix}); at full size (NAME{FULL.suffix}): "
                         f"{', '.join(zoo_name(s.arch, 'torchscript', FULL) for s in hf_specs(FULL))}")
    return parsed


def is_hf_name(name: str) -> bool:
    return parse_name(name) is not None


def zoo_name(arch: str, exporter: str, scale: Scale = TINY) -> str:
    return f"{PREFIX}{arch}{DYNAMO_SUFFIX if exporter == 'dynamo' else ''}{scale.suffix}"


def build_torch_model(spec: HFSpec):
    """The seeded, wrapped torch module of `spec` at its scale, in training mode (dropout active)."""
    import torch

    torch.manual_seed(SEED)
    model = spec.builder(spec.scale)
    model.train()
    return model


def example_inputs(spec: HFSpec, batch: int):
    """A seeded example input for `spec` at `batch` (shapes are what the export fixes)."""
    import torch

    gen = torch.Generator().manual_seed(SEED)
    s = spec.scale
    if spec.inputs == "image":
        return torch.rand(batch, 3, s.image, s.image, generator=gen)
    return torch.randint(2, s.vocab, (batch, s.seq), generator=gen)


def _input_name(spec: HFSpec) -> str:
    return "pixel_values" if spec.inputs == "image" else "input_ids"


def _export_key(spec: HFSpec, exporter: str, batch: int) -> str:
    from importlib.metadata import version  # the installed versions, without importing torch (seconds)

    text = f"{spec.arch}|{exporter}|{spec.scale.name}|{batch}|{version('torch')}|{version('transformers')}"
    h = hashlib.sha256(text.encode())
    h.update(Path(__file__).read_bytes())  # any change to the builders or export settings
    return h.hexdigest()[:16]


def export_dir(cache_dir: Path | None = None) -> Path:
    from onnxplan.loading.artifacts import default_cache_dir

    return (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / "hf"


def _export(model, x, path: Path, exporter: str, input_name: str) -> None:
    """Export `model` on input `x` to `path` as a user would, with all exporter chatter silenced."""
    import torch

    from onnxplan.loading.artifacts import quiet_fds

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
    """The forward .onnx of corpus model `name` (hf-<arch>[-dynamo][@bench]) at `batch` (default:
    its scale's), exported once.

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
    with atomic_path(path, suffix=".onnx") as tmp:
        _export(model, inputs, tmp, exporter, input_name)
