"""`onnxplan bench MODELS…`: sweep model x strategy; planned, measured and peer figures to JSON."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from onnxplan.bench import BenchConfig, count_tasks, load_results, new_results, parse_strategies, run_bench
from onnxplan.bench.dask_sweep import open_client, run_bench_dask
from onnxplan.bench.peers import parse_peers
from onnxplan.bench.result_models import BenchRow, FailedRow
from onnxplan.bench.results import dumps_results, rows_to_csv
from onnxplan.bench.sweep import DEFAULT_WARMUP, DEFAULT_WARMUP_SECONDS, check_timing
from onnxplan.cli import options as opt
from onnxplan.cli.common import (
    check_output,
    console,
    handle_errors,
    print_json,
    write_atomic,
)
from onnxplan.errors import EXIT_FAILURE, UsageError
from onnxplan.loading.zoo import model_names
from onnxplan.planning import check_time_limit
from onnxplan.progress import Progress
from onnxplan.report import markdown_summary, render_html
from onnxplan.sizes import format_bytes, parse_size
from onnxplan.threads import resolve_threads

__all__ = ["bench_command"]


def bench_command(
    models: list[str] = typer.Argument(None, help="Zoo names, forward .onnx files or artifact folders."),
    all_models: bool = typer.Option(False, "--all", help="Every model of the zoo."),
    batch: int = typer.Option(None, "--batch", help="Batch size for every model (default: each model's own)."),
    strategies: str = typer.Option("default", "--strategies",
                                   help="Comma-separated strategies: auto, ORDER+PLANNER[/no-interleave]"
                                        "[/no-inplace], no-interleave, no-inplace; 'default' and 'ci' "
                                        "name the built-in sets."),
    peers: str = typer.Option(None, "--peers", help="Peers to measure: ort,torch (default), or none."),
    repeat: int = typer.Option(5, "--repeat", help="Timed steps per measured run (after --warmup)."),
    warmup: int = typer.Option(DEFAULT_WARMUP, "--warmup", help="Untimed first steps per measured run (a fresh process's first steps run slow, ours and the peers')."),
    warmup_seconds: float = typer.Option(DEFAULT_WARMUP_SECONDS, "--warmup-seconds",
                                         help="...and on until the warm-up has lasted this long (ONNX Runtime "
                                              "reaches its steady step only after tens of steps of a small model); "
                                              "0: exactly --warmup steps."),
    rounds: int = typer.Option(1, "--rounds", help="Fresh processes per measured figure, ours and the peers "
                               "alternating round by round; a step figure is the median over rounds of each "
                               "round's median (on a shared machine a process's level moves by up to a third: "
                               "3 steadies the ratios)."),
    measure: bool = typer.Option(True, "--measure/--no-measure",
                                 help="--no-measure: planned figures only, no runs (peers default to none)."),
    time_limit: float = opt.TIME_LIMIT,
    budget: list[str] = typer.Option(None, "--budget",
                                     help="SIZE for every model or MODEL=SIZE (repeatable): a line in the report."),
    out: Path = typer.Option(None, "-o", "--out",
                             help="Results JSON; rows already in it are kept and skipped (resume)."),
    fresh: bool = typer.Option(False, "--fresh", help="Ignore the rows already in --out; start over."),
    csv_out: Path = typer.Option(None, "--csv", help="Also write the flat table as CSV."),
    html_out: Path = typer.Option(None, "--html", help="Also write the HTML report (as `onnxplan report`)."),
    md_out: Path = typer.Option(None, "--markdown", help="Also write the Markdown summary."),
    train: list[str] = opt.TRAIN,
    freeze: list[str] = opt.FREEZE,
    json_out: bool = typer.Option(False, "--json", help="Print the rows as JSON instead of a table."),
    threads: int = typer.Option(None, "--threads", help=opt.THREADS_HELP + " The peers get the same count; "
                                "every row records it (threads) and what each pool got (pool_threads, "
                                "ort_threads, torch_threads)."),
    workers: int = typer.Option(None, "--workers",
                                help="Run the rows on a Dask LocalCluster of N processes on this machine."),
    scheduler: str = typer.Option(None, "--scheduler",
                                  help="Run the rows on the Dask cluster at ADDRESS (tcp://host:8786)."),
) -> None:
    """Benchmark memory strategies: for each model x strategy, the planned peak, lower bound,
    persistent and arena bytes, solve time, and (unless --no-measure) the measured peak and
    step latency of onnxplan's executor; peers (ONNX Runtime training, PyTorch eager) are
    measured in the same run, each in a fresh process (peak RSS increase, median step).

    The results file is JSON with a `rows` list (pandas: pd.DataFrame(json.load(f)["rows"])),
    the chosen plan of every row under `plans` and the peers' figures under `peers`; it is
    rewritten atomically after every model, so an interrupted run resumes where it stopped.
    With --workers N or --scheduler ADDRESS the rows run as Dask tasks (pip install
    'onnxplan[dask]'): planning in parallel, timed runs one at a time per machine; each row
    records its `host`; a row whose worker died or that raised is listed under `failed`.
    Exit 0 when the sweep completed, 1 when some row failed on the cluster, 2 on bad input.
    """
    handle_errors(_bench)(models, all_models, batch, strategies, peers, repeat, warmup, measure, time_limit,
                          budget, out, fresh, csv_out, html_out, md_out, json_out, train, freeze,
                          workers, scheduler, threads, rounds, warmup_seconds)


def _budgets(items: list[str] | None, models: list[str]) -> dict[str, int]:
    """--budget SIZE (every model) or MODEL=SIZE; MODEL must be one of the models benched."""
    out: dict[str, int] = {}
    for item in items or []:
        model, sep, size = item.rpartition("=")
        if sep and model not in models:
            raise UsageError(f"--budget {item}: {model!r} is not a model of this bench ({', '.join(models)})")
        out[model if sep else "*"] = parse_size(size)
    return out


def _bench(models, all_models, batch, strategies, peers, repeat, warmup, measure, time_limit, budget, out,
           fresh, csv_out, html_out, md_out, json_out, train=None, freeze=None, workers=None,
           scheduler=None, threads=None, rounds=1, warmup_seconds=DEFAULT_WARMUP_SECONDS) -> None:
    if batch is not None and batch <= 0:
        raise UsageError(f"invalid --batch {batch}: must be a positive integer")
    check_timing(repeat, warmup, rounds, warmup_seconds)
    check_time_limit(time_limit)
    if workers is not None and scheduler is not None:
        raise UsageError("give --workers N (a local cluster) or --scheduler ADDRESS, not both")
    if workers is not None and workers < 1:
        raise UsageError(f"invalid --workers {workers}: must be a positive integer")
    check_output(out, csv_out, html_out, md_out)
    peer_list = parse_peers(peers if peers is not None else (None if measure else "none"))
    names = model_names(models, all_models)
    config = BenchConfig(names, parse_strategies(strategies), batch, peer_list,
                         repeat, warmup, measure, time_limit, _budgets(budget, names), tuple(train or ()),
                         tuple(freeze or ()), threads=resolve_threads(threads), rounds=rounds,
                         warmup_seconds=warmup_seconds)
    doc = new_results(config.to_json())
    if out is not None and out.exists() and not fresh:
        old = load_results(out)  # a malformed file is exit 2, and it is left as it was
        for option in ("train", "freeze"):  # rows of other parameters would be kept as if current
            if old.get("config", {}).get(option, []) != list(getattr(config, option)):
                raise UsageError(f"{out} was made with other --{option} globs; give --fresh to start over")
        doc.update(rows=old["rows"], plans=old["plans"], peers=old["peers"], created=old.get("created", doc["created"]))

    def save(d: dict) -> None:
        if out is not None:
            write_atomic(out, dumps_results(d))

    with Progress("bench", total=count_tasks(config)) as progress:
        advance = lambda text, n: progress.update(text, n)
        if workers is None and scheduler is None:
            doc = run_bench(config, doc, save, advance)
        else:
            with open_client(scheduler, workers) as client:
                doc = run_bench_dask(config, doc, save, client, advance)
        progress.finish(f"{len(doc['rows'])} row(s)")
    if csv_out is not None:
        write_atomic(csv_out, rows_to_csv(doc["rows"]))
    if html_out is not None or md_out is not None:
        if html_out is not None:
            write_atomic(html_out, render_html([doc]))
        if md_out is not None:
            write_atomic(md_out, markdown_summary([doc]))
    wanted = {(m, s.name) for m in config.models for s in config.strategies}
    rows = [r for r in doc["rows"] if (r["model"], r["strategy"]) in wanted]
    if json_out:
        print_json(rows)
    else:
        _print_table([BenchRow.of(r) for r in rows])
    if report_failed(doc):
        raise typer.Exit(EXIT_FAILURE)


def report_failed(doc: dict) -> bool:
    """One line on stderr per row or peer a Dask sweep could not finish; whether there were any."""
    failed = [FailedRow(**f) for f in doc.get("failed") or ()]
    for f in failed:
        typer.echo(f"onnxplan: {f.model} {f.strategy or f.peer} failed: {f.error}", err=True)
    return bool(failed)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


_COLUMNS = (  # header, BenchRow field, format; a column shows only when some row has a value
    ("planned peak", "planned_peak_bytes", format_bytes), ("lower bound", "lower_bound_bytes", format_bytes),
    ("frag.", "fragmentation", lambda f: f"{f:.2%}"), ("measured", "measured_peak_bytes", format_bytes),
    ("step", "median_step_seconds", _ms), ("ORT peak", "ort_peak_bytes", format_bytes),
    ("ORT step", "ort_median_step_seconds", _ms), ("torch peak", "torch_peak_bytes", format_bytes),
    ("torch step", "torch_median_step_seconds", _ms), ("solve s", "solve_seconds", lambda s: f"{s:.2f}"),
)


def _print_table(rows: list[BenchRow]) -> None:
    con = console(200, 200)
    cols = [c for c in _COLUMNS if any(getattr(r, c[1]) is not None for r in rows)]
    t = Table()
    t.add_column("model", no_wrap=True)
    t.add_column("strategy", no_wrap=True)
    t.add_column("order+planner", no_wrap=True)
    for header, _, _ in cols:
        t.add_column(header, justify="right", no_wrap=True)
    for r in rows:
        t.add_row(r.model, r.strategy, f"{r.order}+{r.planner}",
                  *("-" if getattr(r, key) is None else fmt(getattr(r, key)) for _, key, fmt in cols))
    con.print(t)
    errors = sorted({r.measure_error for r in rows if r.measure_error})
    for error in errors[:3]:
        con.print(f"onnxplan run failed: {error}", highlight=False)
