"""The zoo as a model source of the load stage (onnxplan.loading.zoo): zoo names build their
artifacts from a recipe; names of the exported HF corpus become a forward .onnx file.

Registered by `import onnxplan.models` and by the CLI, and named by the settings' default
(ONNXPLAN_MODEL_SOURCES), so the library finds the zoo without importing it.
"""

from __future__ import annotations

from pathlib import Path

from onnxplan.loading.request import LoadRequest
from onnxplan.loading.zoo import ForwardExport

__all__ = ["SOURCE", "ZooSource"]


class ZooSource:
    """The zoo (onnxplan.models) and the HF corpus (onnxplan.models.hf)."""

    def names(self) -> list[str]:
        from onnxplan.models import list_models

        return [m.name for m in list_models()]

    def knows(self, name: str) -> bool:
        from onnxplan.models.hf import is_hf_name

        return name in self.names() or is_hf_name(name)

    def forward_file(self, request: LoadRequest) -> ForwardExport | None:
        from onnxplan.models.hf import export_forward, is_hf_name, require_spec

        if not is_hf_name(request.model):
            return None
        return ForwardExport(export_forward(request.model, batch=request.batch),
                             require_spec(request.model)[0].loss)

    def artifacts(self, request: LoadRequest) -> Path | None:
        from onnxplan.loading.artifacts import recipe_artifacts
        from onnxplan.models import build_forward, build_recipe, list_models

        spec = next((m for m in list_models() if m.name == request.model), None)
        if spec is None:
            return None
        name, batch, loss = request.model, request.batch, request.loss
        return recipe_artifacts(build_recipe(name, batch=batch, loss=loss),
                                lambda: build_forward(name, batch=batch, loss=loss),
                                optimizer=request.optimizer or spec.default_optimizer)


SOURCE = ZooSource()
