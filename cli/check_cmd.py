"""`onnxplan check [RESULTS --baseline FILE]`: the memory-regression gate (exit 1 on a regression).

With no RESULTS, the whole gate from [tool.onnxplan] (onnxplan/gate_config.py): plan, compare,
budgets (exit 3 when no plan of a model fits its budget).
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from onnxplan.bench import count_tasks, load_results
from onnxplan.bench.results import dumps_results
from onnxplan.check import METRICS, baseline_document, compare, parse_tolerance
from onnxplan.cli.bench_cmd import report_failed
from onnxplan.cli.common import check_output, console, handle_errors, write_atomic
from onnxplan.errors import EXIT_FAILURE, UsageError
from onnxplan.gate import gate_exit_code, load_gate, over_budget, run_gate
from onnxplan.progress import Progress
from onnxplan.sizes import format_bytes

__all__ = ["check_command"]


def check_command(
    results: Path = typer.Argument(None, help="Results JSON of `onnxplan bench` (default: run the gate "
                                                "configured in pyproject.toml [tool.onnxplan] or onnxplan.toml)."),
    baseline: Path = typer.Option(None, "--baseline", help="Baseline results JSON to compare with."),
    tolerance: str = typer.Option(None, "--tolerance",
                                  help="Allowed growth: 1% or 0.01 (default: planned_peak 1%, "
                                       "measured_peak 10%, latency 25%)."),
    metric: str = typer.Option(None, "--metric",
                               help="planned_peak (default), measured_peak or latency."),
    allow_missing: bool = typer.Option(False, "--allow-missing",
                                       help="Rows of the baseline missing from RESULTS are not a failure."),
    update_baseline: bool = typer.Option(False, "--update-baseline",
                                         help="Write RESULTS (without plans) to --baseline; exit 0."),
) -> None:
    """Compare RESULTS with --baseline row by row (model, batch, strategy) on one metric.

    With no RESULTS: run the gate configured under [tool.onnxplan] in the nearest
    pyproject.toml (or an onnxplan.toml): bench its models and strategies, compare with its
    baseline, and check its per-model budgets (exit 3 naming each model that no plan fits);
    --update-baseline rewrites that baseline. Options given here override the file's.

    Exit 0 when no row got worse than the tolerance allows; 1 with a table of the rows that
    did (model, strategy, before, after, change), or when baseline rows are missing from
    RESULTS (unless --allow-missing); 2 on unusable input (missing or malformed file, no row
    to compare). --update-baseline accepts the new numbers: it writes the baseline and exits 0.
    """
    if results is None:
        handle_errors(_gate)(baseline, tolerance, metric, allow_missing, update_baseline)
    else:
        handle_errors(_check)(results, baseline, tolerance, metric, allow_missing, update_baseline)


def _fmt(value: float, metric: str) -> str:
    if metric == "latency":
        return f"{value * 1000:.2f} ms"
    return f"{value:,.0f} B ({value / 2**20:.2f} MiB)"


def _missing_lines(missing: list[tuple], results: Path, allowed: bool, models_shown: int = 10) -> list[str]:
    """Baseline rows missing from the results: a count, then one line per model and batch
    with its strategies (the first `models_shown` models, then how many more)."""
    by_model: dict[tuple, list[str]] = {}
    for model, batch, strategy in missing:
        by_model.setdefault((model, batch), []).append(strategy)
    verdict = "allowed (--allow-missing)" if allowed else "a failure unless --allow-missing"
    lines = [f"missing from {results}: {len(missing)} baseline row(s) of {len(by_model)} model(s), {verdict}:"]
    for (model, batch), strategies in list(by_model.items())[:models_shown]:
        lines.append(f"  {model} (batch {batch}): {len(strategies)} strateg{'y' if len(strategies) == 1 else 'ies'}: {', '.join(strategies)}")
    if len(by_model) > models_shown:
        lines.append(f"  ... and {len(by_model) - models_shown} more model(s)")
    return lines


def _check(results, baseline, tolerance, metric, allow_missing, update_baseline) -> None:
    if baseline is None:
        raise UsageError("check RESULTS needs --baseline FILE (or give no RESULTS: the configured gate)")
    if _compare(load_results(results), str(results), baseline, tolerance, metric or "planned_peak",
                allow_missing, update_baseline):
        raise typer.Exit(EXIT_FAILURE)


def _gate(baseline, tolerance, metric, allow_missing, update_baseline) -> None:
    """The gate of [tool.onnxplan] (onnxplan.gate): bench, compare with its baseline, check its budgets."""
    gate = load_gate(baseline, update_baseline)
    with Progress("check", total=count_tasks(gate.bench)) as progress:
        doc = run_gate(gate, lambda text, n: progress.update(text, n))
        progress.finish(f"{len(doc['rows'])} row(s)")
    regressed = _compare(doc, gate.label, gate.baseline, tolerance or gate.config.tolerance,
                         metric or gate.config.metric, allow_missing, update_baseline)
    over = over_budget(doc["rows"], gate.bench)
    for o in over:
        typer.echo(f"onnxplan: budget not met: {o.model}: no plan fits {format_bytes(o.budget)} "
                   f"(the smallest: {format_bytes(o.smallest)} with {o.strategy})")
    report_failed(doc)
    code = gate_exit_code(regressed, over, doc.get("failed", []), update_baseline)
    if code:
        raise typer.Exit(code)


def _compare(new: dict, results: str, baseline: Path, tolerance, metric, allow_missing,
             update_baseline) -> bool:
    """Compare `new` with the baseline file and print the outcome; True when the gate fails."""

    if metric not in METRICS:
        raise UsageError(f"unknown --metric '{metric}'; known: {', '.join(METRICS)}")
    tol = parse_tolerance(tolerance, metric)
    if update_baseline:
        check_output(baseline)
    if update_baseline and not baseline.exists():
        write_atomic(baseline, dumps_results(baseline_document(new)))
        typer.echo(f"onnxplan: wrote the baseline {baseline} ({len(new['rows'])} rows)")
        return False
    res = compare(new, load_results(baseline), metric, tol)
    con = console(160, 160)
    summary = (f"{metric}: {res.compared} rows compared (tolerance {res.tolerance:.2%}): "
               f"{len(res.regressions)} worse, {len(res.improvements)} better, {len(res.unchanged)} unchanged")
    if res.not_comparable:
        summary += f"; {len(res.not_comparable)} without the metric on one side"
    if res.new:
        summary += f"; {len(res.new)} new (not in the baseline)"
    con.print(summary, highlight=False)
    if res.regressions:
        t = Table(title=f"worse {metric}")
        for header in ("model", "batch", "strategy", "before", "after", "change"):
            t.add_column(header, no_wrap=True, justify="left" if header in ("model", "strategy") else "right")
        for c in sorted(res.regressions, key=lambda c: -c.change):
            t.add_row(c.model, str(c.batch), c.strategy, _fmt(c.before, metric), _fmt(c.after, metric),
                      f"+{c.change:.2%}")
        con.print(t)
    if res.improvements:
        best = min(res.improvements, key=lambda c: c.change)
        con.print(f"better: {len(res.improvements)} rows, the most {best.model} {best.strategy} "
                  f"{best.change:+.2%} (update the baseline to lock it in: --update-baseline)", highlight=False)
    if res.missing:
        for line in _missing_lines(res.missing, results, allow_missing):
            con.print(line, highlight=False)
    if update_baseline:
        write_atomic(baseline, dumps_results(baseline_document(new)))
        con.print(f"baseline {baseline} updated ({len(new['rows'])} rows)", highlight=False)
        return False
    return bool(res.regressions or (res.missing and not allow_missing))
