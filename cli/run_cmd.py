"""`onnxplan run MODEL`: execute a planned training step in its arena; measure; check against ORT."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from onnxplan.budget import MemoryRequest, cost_model, plan_for_budget
from onnxplan.cli.common import FREEZE_HELP, TRAIN_HELP, fail, handle_errors, model_request, print_json
from onnxplan.device import array_module
from onnxplan.executor.prepare import Prepared, load_request, prepare
from onnxplan.executor.swap_account import describe_accounting, swap_accounting
from onnxplan.plan import Plan
from onnxplan.planning import PlanOptions, check_time_limit
from onnxplan.errors import EXIT_FAILURE, OnnxplanError, UsageError
from onnxplan.progress import Progress
from onnxplan.sizes import format_bytes
from onnxplan.verification.report import describe_verification

__all__ = ["run_command"]


class RunFailed(OnnxplanError):
    """Measuring failed (a crashed or killed subprocess)."""

    exit_code = EXIT_FAILURE

_PLAN_DEFAULTS = {"order": "auto", "planner": "auto", "interleave": True, "inplace": True, "time_limit": None}


def run_command(
    model: str = typer.Argument(None, help="Zoo name, forward .onnx, or artifact folder (optional with --plan: the plan names its model)."),
    order: str = typer.Option("auto", "--order", help="Execution order: auto, given, nntrainer, greedy, ilp."),
    planner: str = typer.Option("auto", "--planner", help="Offset planner: auto, naive, sort, greedy-size, best-fit, ilp."),
    interleave: bool = typer.Option(True, "--interleave/--no-interleave", help="Update each parameter right after its gradient."),
    inplace: bool = typer.Option(True, "--inplace/--no-inplace", help="Let ops write into dying inputs."),
    time_limit: float = typer.Option(None, "--time-limit", help="Seconds for each ILP solve (given: the ILPs always run; default: the offset ILP runs only when the heuristics leave a gap, for a budget scaled by the gap and the graph size; --planner/--order ilp alone: 10 s)."),
    plan_file: Path = typer.Option(None, "--plan", help="Run this plan JSON (from `onnxplan plan -o`) instead of planning."),
    batch: int = typer.Option(None, "--batch", help="Batch size (zoo models; dynamic batch dims)."),
    dim: list[str] = typer.Option(None, "--dim", help="Value of a named dynamic dimension: NAME=INT."),
    optimizer: str = typer.Option(None, "--optimizer", help="adamw or sgd (zoo / forward .onnx)."),
    loss: str = typer.Option(None, "--loss", help="ce or mse (zoo / forward .onnx)."),
    train: list[str] = typer.Option(None, "--train", help=TRAIN_HELP),
    freeze: list[str] = typer.Option(None, "--freeze", help=FREEZE_HELP),
    steps: int = typer.Option(3, "--steps", help="Training steps to run and report."),
    warmup: int = typer.Option(1, "--warmup", help="Steps run first on the initial state, then discarded."),
    seed: int = typer.Option(0, "--seed", help="Seed of the step data (the same data ONNX Runtime gets)."),
    lr: float = typer.Option(None, "--lr", help="Learning rate (default: ONNX Runtime's, 1e-3)."),
    verify: bool = typer.Option(False, "--verify", help="Compare every step with ONNX Runtime from the same state (exit 1 on mismatch): loss (relative error <= 1e-5), every gradient before the optimizer (relative norm error <= 3e-2, or 10x the tensor's one-ulp noise if larger), the optimizer's update on identical gradients (<= 1e-5 of the tensor's magnitude), BatchNorm running statistics (<= 1e-4, or 10x noise); random ops use ONNX Runtime's draws. A failure names the first value in execution order that differs, and its node. README: Verifying a run."),
    check_arena: bool = typer.Option(False, "--check-arena", help="Debug: poison dead buffers, check every read is inside its lifetime."),
    threads: int = typer.Option(None, "--threads", help="BLAS threads (default: the BLAS library's own)."),
    measure: bool = typer.Option(True, "--measure/--no-measure", help="Measure the peak in a fresh subprocess (the probe)."),
    swap: str = typer.Option(None, "--swap", help="Swap policy: none, on-demand, reduced, proactive, window (default: none, or auto with --budget)."),
    lookahead: int = typer.Option(1, "--lookahead", help="proactive: issue each swap-in N EOs ahead of its use."),
    window_bytes: str = typer.Option(None, "--window-bytes", help="window: prefetch window, e.g. 8MiB (default: the largest working set)."),
    budget: str = typer.Option(None, "--budget", help="Memory budget, e.g. 64MiB: swap (--swap) or recompute (--checkpoint) until the planned peak fits; with neither, the one predicted faster."),
    swap_dir: Path = typer.Option(None, "--swap-dir", help="Folder of the swap file (default: a temporary folder, removed)."),
    checkpoint: str = typer.Option(None, "--checkpoint", help="Recompute instead of keeping activations: none, sqrt, chen, rotor (with --budget: the fastest schedule that fits). With --budget and neither --checkpoint nor --swap: recompute or swap, whichever fits with the least predicted step time."),
    profile: bool = typer.Option(True, "--profile/--no-profile", help="--checkpoint: time the stages by a short run of our kernels (--no-profile: a FLOP estimate)."),
    device: str = typer.Option("cpu", "--device", help="Where the step runs: cpu (numpy) or cuda (CuPy on the GPU; the measured peak is then the most device memory held by live arrays, from CuPy's pool)."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Run the planned training step: every tensor at its planned offset in one arena.

    Prints the loss of each step, the median step latency, the arena and the planned peak
    (persistent + arena) next to the measured peak: the peak RSS increase of a fresh
    process from just before the arena is allocated (with --device cuda: the most device
    memory held at once by live CuPy arrays, counted by a hook on CuPy's pool from just
    before the arena is allocated; no subprocess). With --plan, MODEL is optional: the plan
    file names its model; the plan is re-verified in full against it. Exit 0 ok, 1 mismatch
    with ONNX Runtime (--verify) or an arena check failed, 2 bad input (model, plan file,
    options), 3 the run does not fit the memory available (checked before allocating).
    """
    plan_opts = {"order": order, "planner": planner, "interleave": interleave, "inplace": inplace,
                 "time_limit": time_limit}
    swap_args = (swap, lookahead, window_bytes, budget, swap_dir)
    handle_errors(_run)(model, plan_opts, plan_file, batch, dim, optimizer, loss, steps,
                        warmup, seed, lr, verify, check_arena, threads, measure, json_out, swap_args,
                        (checkpoint, profile), device, (train, freeze))


def _run(model, plan_opts, plan_file, batch, dim, optimizer, loss, steps, warmup, seed, lr, verify,
         check_arena, threads, measure, json_out, swap_args=(None, 1, None, None, None),
         checkpoint_args=(None, False), device="cpu", select_args=(None, None)) -> None:
    if steps < 1 or warmup < 0:
        raise UsageError(f"invalid --steps {steps} / --warmup {warmup}: need steps >= 1, warmup >= 0")
    if lr is not None and not lr > 0:
        raise UsageError(f"invalid --lr {lr}: must be positive")
    check_time_limit(plan_opts["time_limit"])
    if threads is not None and threads < 1:
        raise UsageError(f"invalid --threads {threads}: must be >= 1")
    xp = array_module(device)  # before planning: a missing GPU is a usage error, said at once
    if model is None and plan_file is None:
        raise UsageError("run needs a MODEL (zoo name, forward .onnx or artifact folder) or --plan plan.json "
                         "(from `onnxplan plan MODEL -o plan.json`), e.g. `onnxplan run mlp --swap proactive`")
    req = model_request(model or "", batch, optimizer, loss, dim, *select_args)
    swap, lookahead, window_bytes, budget, swap_dir = swap_args
    checkpoint, profile = checkpoint_args
    if swap_dir is not None and not Path(swap_dir).is_dir():
        raise UsageError(f"--swap-dir {swap_dir}: no such folder")
    if plan_file is not None:
        if swap is not None or window_bytes is not None or budget is not None or lookahead != 1 or checkpoint:
            raise UsageError("--plan fixes the plan; drop --swap, --lookahead, --window-bytes, --budget, --checkpoint")
        changed = [k.replace("_", "-") for k, v in plan_opts.items() if v != _PLAN_DEFAULTS[k]]
        if changed:
            raise UsageError(f"--plan fixes the plan; drop --{', --'.join(changed)}")
        how = Plan.load(plan_file)
        req = _plan_request(how, req, model is None)
    else:
        how = PlanOptions(**plan_opts)
        memory = MemoryRequest.from_flags(budget, swap, lookahead, window_bytes, checkpoint)
    with Progress("run") as progress:
        progress.update("checking the plan" if plan_file is not None else "planning")
        prep = prepare(req, how) if plan_file is not None else \
            _prepare_planned(req, how, memory, cost_model(profile, device))
        out = _execute(req, prep, steps, warmup, seed, lr, check_arena, threads, measure, verify, swap_dir, xp,
                       progress)
        progress.finish("done")
    if json_out:
        print_json(out)
    else:
        _print(out)
    if out["verified"] is False:
        first = out["worst"][0] if out["worst"] else "?"
        fail(f"the run differs from ONNX Runtime beyond tolerance: {first}", EXIT_FAILURE)


def _plan_request(plan, req, no_model: bool):
    """MODEL omitted, or the model the plan's reference names: the request of that reference
    (--batch, --dim, --optimizer, --loss given override it); the artifacts must hold the
    content the plan was made with. Another MODEL: as given (adopt_plan refuses it when its
    graph is not the plan's)."""
    from onnxplan.resolve import (
        check_content_hash,
        model_reference,
        request_from_reference,
        resolve_artifacts,
    )

    if not plan.source:
        if no_model:
            raise UsageError("this plan file names no model (made by an older onnxplan): give MODEL before --plan")
        return req
    if not no_model and model_reference(req, None)["model"] != plan.source.get("model"):
        return req
    overridden = req.batch is not None or req.optimizer or req.loss or req.dims or req.train or req.freeze
    req = request_from_reference(plan.source, req.batch, req.optimizer, req.loss, req.dims, req.train, req.freeze)
    if not overridden:  # else the graph's fingerprint tells
        check_content_hash(plan.source, resolve_artifacts(req))
    return req


def _prepare_planned(req, opts, memory, costs):
    """Load and plan as `onnxplan plan` does (onnxplan.budget decides what the budget needs)."""
    folder, graph = load_request(req)
    res = plan_for_budget(graph, opts, memory, costs)
    return Prepared(folder, res.graph, res.plan)


def _predicted(plan) -> tuple[float | None, str]:
    """The plan's predicted step time and what it rests on (recorded when a checkpoint
    policy or the memory strategy planned it)."""
    if plan.checkpoint is not None:
        return plan.checkpoint.predicted_step_seconds, plan.checkpoint.time_source
    if plan.strategy is not None:
        chosen = plan.strategy.chosen_candidate
        return (chosen.predicted_step_seconds if chosen else None), "strategy"
    return None, ""


def _execute(req, prep, steps, warmup, seed, lr, check_arena, threads, measure, verify, swap_dir=None,
             xp=None, progress=None) -> dict:
    import numpy as np

    from onnxplan.device import DevicePeak, device_name
    from onnxplan.executor.runner import run_plan
    from onnxplan.executor.threads import blas_threads

    xp = np if xp is None else xp
    progress = progress or Progress("run", enabled=False)
    tell = progress.update
    counted = DevicePeak(xp) if xp is not np and measure else contextlib.nullcontext()
    with counted as device_peak:  # on a GPU the run itself is measured (None on the CPU)
        res = run_plan(req, None, steps=steps, warmup=warmup, seed=seed, check_arena=check_arena,
                       learning_rate=lr, prepared=prep, threads=threads, swap_dir=swap_dir, xp=xp,
                       on_step=lambda text: tell(f"running {text}"))
    plan = prep.plan
    out = {
        "model": plan.model, "folder": str(prep.folder), "steps": steps, "warmup": warmup, "seed": seed,
        "learning_rate": lr if lr is not None else 1e-3, "order_policy": plan.order_policy,
        "planner": plan.planner, "passes": list(plan.passes), "loss": res.losses,
        "step_seconds": res.step_seconds, "median_step_seconds": res.median_step_seconds,
        "arena_bytes": res.arena_bytes, "persistent_bytes": res.persistent_bytes,
        "state_region_bytes": res.state_region_bytes, "peak_bytes": res.peak_bytes,
        "measured_peak_bytes": None, "measured_minus_planned_bytes": None, "check_arena": check_arena,
        "verified": None, "max_rel_diff": None, "worst": [], "blas_threads": blas_threads(),
        "swap": None, "predicted_step_seconds": _predicted(prep.plan)[0],
        "predicted_from": _predicted(prep.plan)[1], "device": device_name(xp),
    }
    if res.swap is not None:  # accounting, and the latency of the same plan without swap
        tell("the same steps without swap (for comparison)")
        out["swap"] = swap_accounting(req, prep, res, steps=steps, warmup=warmup, seed=seed, lr=lr,
                                      threads=threads, xp=xp)
    if device_peak is not None:  # the run above, counted on the device: no subprocess needed
        peak = device_peak.peak
        out["measured_peak_bytes"] = peak
        out["measured_minus_planned_bytes"] = peak - res.peak_bytes
        if out["swap"] is not None:
            out["swap"]["measured_peak_bytes"] = peak
        out["measurement"] = {"method": "device memory held by live CuPy arrays (pool memory hook)",
                              "pool_total_bytes": device_peak.pool_total_bytes,
                              "state_alignment_bytes": res.state_region_bytes - res.persistent_bytes}
    elif measure:
        from onnxplan.executor.measure import measure_run
        from onnxplan.memprobe import ProbeError

        try:
            tell("measuring the peak in a fresh process")
            child, peak = measure_run(req, None, steps=steps, warmup=warmup, seed=seed, learning_rate=lr,
                                      prepared=prep, threads=threads)
        except ProbeError as exc:
            raise RunFailed(f"measuring the peak failed: {exc}") from None
        out["measured_peak_bytes"] = peak
        out["measured_minus_planned_bytes"] = peak - res.peak_bytes
        if out["swap"] is not None:
            out["swap"]["measured_peak_bytes"] = peak
        out["measurement"] = {"method": child["probe"]["method"],
                              "median_step_seconds_in_probe": _median(child["step_seconds"]),
                              "state_alignment_bytes": res.state_region_bytes - res.persistent_bytes}
    if verify:
        from onnxplan.verification.step_check import verify_run

        tell("verifying against ONNX Runtime")
        ver = verify_run(prep, steps=steps, seed=seed, learning_rate=lr, xp=xp, swap_dir=swap_dir,
                         check_arena=check_arena)
        errors = [c.error for s in ver.steps for k, c in s.checks.items() if k != "update"]
        out.update(verified=ver.ok, max_rel_diff=max(errors, default=0.0), verification=ver.as_dict(),
                   ort_loss=[s.ort_loss for s in ver.steps], worst=[] if ver.ok else [ver.summary()])
    return out


def _median(xs) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else 0.5 * (xs[len(xs) // 2 - 1] + xs[len(xs) // 2])


def _print(out: dict) -> None:
    con = Console(width=shutil.get_terminal_size((120, 24)).columns, highlight=False)
    con.print(f"[bold]{out['model']}[/]: order {out['order_policy']} + planner {out['planner']}, passes "
              f"{' -> '.join(out['passes'])}; {out['steps']} step(s) after {out['warmup']} warm-up, "
              f"seed {out['seed']}, lr {out['learning_rate']:g}" + (", arena checked" if out["check_arena"] else ""))
    t = Table("step", "loss", "seconds")
    for k, (l, s) in enumerate(zip(out["loss"], out["step_seconds"])):
        t.add_row(str(k), f"{l:.7g}", f"{s:.4f}")
    con.print(t)
    con.print(f"median step latency {out['median_step_seconds'] * 1e3:.2f} ms on {out['device']}")
    if out.get("predicted_step_seconds"):
        pred, meas = out["predicted_step_seconds"], out["median_step_seconds"]
        con.print(f"predicted step {pred * 1e3:.2f} ms ({out['predicted_from']}) vs measured {meas * 1e3:.2f} ms "
                  f"({pred / meas - 1:+.1%})")
    con.print(f"arena {format_bytes(out['arena_bytes'])} + persistent {format_bytes(out['persistent_bytes'])} "
              f"= planned peak {format_bytes(out['peak_bytes'])} ({out['peak_bytes']} B)")
    if out["measured_peak_bytes"] is not None:
        diff = out["measured_minus_planned_bytes"]
        m = out["measurement"]
        con.print(f"measured peak {format_bytes(out['measured_peak_bytes'])} ({out['measured_peak_bytes']} B, "
                  f"{m['method']}): {'+' if diff >= 0 else '-'}{format_bytes(abs(diff))} "
                  f"({diff / max(out['peak_bytes'], 1):+.1%}) vs planned")
        if "pool_total_bytes" in m:
            con.print(f"  the difference: state slots aligned to 64 B (+{m['state_alignment_bytes']} B), the "
                      "alignment slack of the two allocations, CuPy's 512-byte rounding, and small temporaries "
                      f"of kernels; CuPy's pool holds {format_bytes(m['pool_total_bytes'])} in all (cached blocks)")
        else:
            con.print(f"  the difference: state slots aligned to 64 B (+{m['state_alignment_bytes']} B), page "
                      "granularity (4 KiB per touched page), Python objects for the views, and what "
                      "kernels and BLAS allocate outside the arena (thread buffers, small temporaries); "
                      "pages of the arena never touched by a live buffer are not counted")
    if out.get("swap") is not None:
        for line in describe_accounting(out["swap"]):
            con.print(line)
    if out["verified"] is not None:
        for line in describe_verification(out["verification"]):
            con.print(line)
