"""The load stage (DESIGN.md "load"): a model argument (zoo name, forward .onnx, artifact
folder) to one training step's StepGraph.

- request.py: LoadRequest (what to load), checked; the model reference a plan file records.
- resolve.py: the request to an artifact folder (a name through a model source, zoo.py; a
  forward .onnx made trainable by onnxplan.forward, whose ForwardModel artifacts.py builds).
- artifacts.py: onnxruntime-training artifacts built and cached.
- step.py: load_step / open_step, the one way in.
"""

from onnxplan.loading.request import LoadRequest, make_request
from onnxplan.loading.step import LoadedStep, load_step, open_step

__all__ = ["LoadRequest", "LoadedStep", "load_step", "make_request", "open_step"]
