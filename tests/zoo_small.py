"""Small versions of each zoo model: same graph structure, CI-sized tensors."""

from __future__ import annotations

from pathlib import Path

import pytest

from onnxplan.forward.spec import ForwardModel
from onnxplan.models import get_model

__all__ = ["LARGE", "SMALL", "least_rotor_code", "slow_if_large", "small", "small_artifacts"]

SMALL = {
    "mlp": dict(batch=4),
    "mlp-frozen": dict(batch=4),
    "nnt-linear": dict(batch=2, in_features=1024),
    "nnt-conv2d": dict(batch=2, size=32),
    "nnt-fc3": dict(batch=4, hidden=(64, 32)),
    "nnt-fc3-frozen": dict(batch=4, hidden=(64, 32)),
    "nnt-conv-ac-fl": dict(batch=2, size=32),
    "vgg16": dict(batch=2),
    "resnet18": dict(batch=2),
    "transformer": dict(batch=2, seq=16),
    "gpt": dict(batch=2, seq=16),
}


def small(name: str) -> ForwardModel:
    return get_model(name).builder(**SMALL[name])


def small_artifacts(name: str, optimizer: str | None = None) -> Path:
    """The artifact folder (in the session's cache) of the small version of `name`."""
    from onnxplan.loading.artifacts import build_artifacts

    return build_artifacts(small(name), None, optimizer=optimizer or get_model(name).default_optimizer)


def least_rotor_code(folder) -> str:
    """rotor's schedule for the least memory of its chain model (deeply nested re-runs), even
    where the planned peak would not choose it."""
    from onnxplan.checkpoint.chain import build_chain
    from onnxplan.checkpoint.rotor import rotor_schedule, rotor_table_for_chain
    from onnxplan.checkpoint.schedule import encode
    from onnxplan.ir.load import read_step
    from onnxplan.pipeline import run_pipeline

    pre = run_pipeline(read_step(folder), ["realize", "interleave"])[0]
    chain = build_chain(pre)
    tab = rotor_table_for_chain(chain.costs(), 300)
    return encode(rotor_schedule(tab, tab.min_feasible()).ops, chain.length)


LARGE = ("vgg16", "resnet18")  # the conv nets: seconds per case, so their cases sit in the slow tier


def slow_if_large(names) -> list:
    """Parametrize values for zoo model names: the LARGE ones marked slow (full suite only)."""
    return [pytest.param(n, marks=pytest.mark.slow) if n in LARGE else n for n in names]
