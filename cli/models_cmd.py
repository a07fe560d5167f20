"""`onnxplan models list|build`: the built-in model zoo."""

from __future__ import annotations

import shutil
from pathlib import Path

import typer
from rich.table import Table

from onnxplan.cli.common import console, handle_errors, model_request, print_json
from onnxplan.cli.core import OnnxplanCommand
from onnxplan.errors import UsageError
from onnxplan.loading.resolve import resolve_artifacts
from onnxplan.models import get_model, hf, list_models
from onnxplan.models.hf import PREFIX, require_spec
from onnxplan.progress import Progress

__all__ = ["models_app"]

models_app = typer.Typer(help="The built-in model zoo (built in code, seeded weights).", rich_markup_mode=None,
                         no_args_is_help=True)


@models_app.command("list", cls=OnnxplanCommand)
@handle_errors
def list_command(json_out: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List the zoo models with their default batch, loss and optimizer.

    With `transformers` installed, the list also has the corpus of real architectures:
    hf-ARCH is the model exported with PyTorch's TorchScript exporter (dynamo=False,
    opset 17, training mode), hf-ARCH-dynamo the same model with the default dynamo
    exporter. Their artifacts go through the forward-model path, as a user's .onnx does.
    Those are tiny CI configs; NAME@bench (hf-ARCH@bench, hf-ARCH-dynamo@bench) is the same
    architecture at the bench scale (realistic small training sizes, batch 8), and NAME@full
    (hf-resnet@full, hf-bert@full, hf-gpt2-lm@full, ...) the published size users fine-tune.
    """
    rows = [
        {"name": m.name, "batch": m.default_batch, "loss": m.default_loss,
         "optimizer": m.default_optimizer, "description": m.description}
        for m in list_models()
    ]
    if hf.available():  # the corpus of Hugging Face architectures, each with both exporters and scales
        rows += [
            {"name": hf.zoo_name(s.arch, e, scale), "batch": s.default_batch, "loss": s.loss,
             "optimizer": "adamw", "description": f"{s.description} ({e} export)"}
            for scale in hf.SCALES.values() for s in hf.hf_specs(scale) for e in hf.EXPORTERS
        ]
    if json_out:
        print_json(rows)
        return
    table = Table("model", "batch", "loss", "optimizer", "description")
    for r in rows:
        table.add_row(r["name"], str(r["batch"]), r["loss"], r["optimizer"], r["description"])
    console(120).print(table)


@models_app.command("build", cls=OnnxplanCommand)
@handle_errors
def build_command(
    name: str = typer.Argument(..., help="Zoo model name (see `onnxplan models list`); hf-ARCH uses the "
                               "TorchScript exporter, hf-ARCH-dynamo the dynamo one, NAME@bench the "
                               "bench scale, NAME@full the published size."),
    batch: int = typer.Option(None, "--batch", help="Batch size (default: the model's)."),
    optimizer: str = typer.Option(None, "--optimizer", help="adamw or sgd (default: the model's)."),
    loss: str = typer.Option(None, "--loss", help="ce, mse or causal-lm (default: the model's)."),
    out: Path = typer.Option(None, "-o", "--out", help="Copy the artifacts into this folder."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Write forward.onnx and the onnxruntime-training artifacts of a zoo model.

    hf-ARCH[-dynamo] (needs `transformers`) exports the model to a forward .onnx (cached)
    and builds its artifacts through the forward-model path, as for a user's own file.

    Artifacts are cached by content hash ($ONNXPLAN_CACHE, default ~/.cache/onnxplan/artifacts);
    -o copies them into a folder of your choice.
    """

    if name.startswith(PREFIX):  # unknown name -> one clear line
        require_spec(name)
    else:
        get_model(name)
    req = model_request(name, batch, optimizer, loss, None)
    if out is not None and out.exists() and not out.is_dir():
        raise UsageError(f"{out}: exists and is not a folder")
    with Progress("models build") as progress:  # an export and ORT's generation: seconds to minutes
        progress.update(f"building {name}")
        folder = resolve_artifacts(req)
    if out is not None:
        try:
            out.mkdir(parents=True, exist_ok=True)
            for f in folder.iterdir():
                if f.is_file():
                    shutil.copy2(f, out / f.name)
        except OSError as exc:
            raise UsageError(f"{out}: cannot write the artifacts there ({exc.strerror or exc})") from None
        folder = out
    files = sorted(f.name for f in folder.iterdir() if f.is_file())
    if json_out:
        print_json({"model": name, "folder": str(folder), "files": files})
    else:
        typer.echo(f"{name}: {folder}")
        for f in files:
            typer.echo(f"  {f}")
