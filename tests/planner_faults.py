"""Planners degraded on purpose, for the tests of the CI gate (`onnxplan check`)."""

from __future__ import annotations

import dataclasses

__all__ = ["PAD", "padded_planner"]

PAD = 64 * 1024


def padded_planner(planner):
    """The same planner, but every buffer takes PAD more bytes: a worse plan that still verifies."""
    def padded(buffers, **kw):
        bufs = [dataclasses.replace(b, nbytes=b.nbytes + PAD) if b.nbytes else b for b in buffers]
        return planner(bufs, **kw)
    return padded
