"""Peers measured in the bench run: ONNX Runtime training and PyTorch eager, each in a fresh probe."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from onnxplan.errors import UsageError
from onnxplan.memprobe import ProbeError, probe_peak
from onnxplan.threads import peer_environment

__all__ = ["PEERS", "combine_rounds", "measure_peer", "parse_peers", "peer_row_fields", "step_stats"]

PEERS = ("ort", "torch")
_TARGETS = {"ort": "onnxplan.verification.reference:probe_target", "torch": "onnxplan.torch_peer:probe_target"}


def parse_peers(text: str | None) -> list[str]:
    """'ort,torch' -> ['ort', 'torch']; '' or 'none' -> []."""
    if text is None:
        return list(PEERS)
    names = [p.strip() for p in text.split(",") if p.strip() and p.strip() != "none"]
    bad = [p for p in names if p not in PEERS]
    if bad:
        raise UsageError(f"unknown peer {bad[0]!r}; known: {', '.join(PEERS)} (or none)")
    return list(dict.fromkeys(names))


def step_stats(seconds: list[float], warmup: int) -> dict[str, Any]:
    """Median, min and max of the steps after `warmup` (all of them if none are left)."""
    timed = seconds[warmup:] or seconds
    if not timed:
        return {"median_step_seconds": None, "min_step_seconds": None, "max_step_seconds": None,
                "steps_timed": 0}
    return {"median_step_seconds": statistics.median(timed), "min_step_seconds": min(timed),
            "max_step_seconds": max(timed), "steps_timed": len(timed)}


def combine_rounds(runs: list[dict[str, Any]], peak: str, error: str) -> dict[str, Any]:
    """One figure from the same measurement taken in several fresh processes (rounds): the median
    step is the median over rounds of each round's median (a process's level moves by up to a
    third on a shared machine), the fastest and slowest steps over all rounds, the timed steps
    summed, the peak (`peak` key) the largest; the rest (first loss, pools) the first round's.
    A failed round (`error` key set) makes the figure that round's failure: no figure is made
    of fewer rounds than asked. `rounds` and `round_median_step_seconds` record the rounds."""
    failed = next((r for r in runs if r.get(error)), None)
    if failed is not None:
        return {**failed, "rounds": len(runs), "round_median_step_seconds": None}
    medians: list[float] | None = [r["median_step_seconds"] for r in runs]
    out = dict(runs[0])
    if all(m is not None for m in medians or ()):
        out.update(median_step_seconds=statistics.median(medians or ()),
                   min_step_seconds=min(r["min_step_seconds"] for r in runs),
                   max_step_seconds=max(r["max_step_seconds"] for r in runs))
    else:  # a round timed no step: no step figure
        medians = None
        out.update(median_step_seconds=None, min_step_seconds=None, max_step_seconds=None)
    out["steps_timed"] = sum(r.get("steps_timed") or 0 for r in runs)
    peaks = [r[peak] for r in runs if r.get(peak) is not None]
    out[peak] = max(peaks) if peaks else None
    return {**out, "rounds": len(runs), "round_median_step_seconds": medians}


def measure_peer(peer: str, artifact_dir: Path, repeat: int, warmup: int = 1, seed: int = 0,
                 timeout_s: float = 900.0, threads: int | None = None, warmup_seconds: float = 0.0) -> dict[str, Any]:
    """One peer's peak RSS increase and step latency: `repeat` seeded steps in a fresh interpreter
    after `warmup` (and on until `warmup_seconds`: data.run_steps), its pools sized for `threads`
    as ours are (onnxplan.threads; None: every available core), OpenMP waiting as for a user of
    that library (no policy of onnxplan's). Never raises for a failed run: the figure is null
    and `error` says why."""
    kwargs = {"artifact_dir": str(Path(artifact_dir).resolve()), "steps": repeat, "seed": seed,
              "threads": threads, "warmup": warmup, "warmup_seconds": warmup_seconds}
    try:
        probe = probe_peak(_TARGETS[peer], kwargs, timeout_s=timeout_s, env=peer_environment())
    except ProbeError as exc:
        return {"peak_bytes": None, **step_stats([], 0), "first_loss": None, "error": str(exc)[:300]}
    losses = probe.result.get("losses") or [None]
    warm = int(probe.result.get("warmup_steps", warmup))
    return {"peak_bytes": probe.peak_increase_bytes, **step_stats(probe.result.get("step_seconds", []), warm),
            "first_loss": losses[0], "error": None, "probe_method": probe.method,
            "threads": probe.result.get("threads"), "warmup_steps": warm}


def peer_row_fields(peer: str, figures: dict[str, Any] | None) -> dict[str, Any]:
    """A peer's figures as the row's flat columns (ort_peak_bytes, torch_median_step_seconds...)."""
    figures = figures or {}
    return {f"{peer}_{k}": figures.get(k) for k in ("peak_bytes", "median_step_seconds", "min_step_seconds",
                                                    "max_step_seconds", "first_loss", "error", "threads")}
