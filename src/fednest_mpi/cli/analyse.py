"""``fednest-mpi report`` and ``fednest-mpi plot``: tables and figures of run files (:mod:`fednest_mpi.post`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from fednest_mpi.cli.common import subcommand, usage_error
from fednest_mpi.errors import UsageError


def add(sub) -> None:
    _add_report(sub)
    _add_plot(sub)


def _add_report(sub) -> None:
    """The ``report`` subcommand: a summary table of runs, a table at chosen iterations, a benchmark table."""
    rep = subcommand(
        sub,
        "report",
        "text table of runs: differing config, final/best metrics, time, communication",
        "examples:\n  fednest-mpi report runs/*.h5 --metric x_error --metric hypergradient_norm\n"
        "  fednest-mpi report --benchmark jobs/benchmarks/table.toml --configs-dir docs/benchmarks",
    )
    rep.add_argument("runs", nargs="*", help="run files (.h5) written by `fednest-mpi run`, or directories of them")
    _benchmark_arguments(rep)
    rep.add_argument(
        "--metric",
        "-m",
        dest="metrics",
        action="append",
        metavar="COLUMN",
        help="metric to show (repeatable); default: the problem's primary metric, then whichever of x_error, "
        "outer_objective, hypergradient_norm, test_accuracy, test_loss the runs record",
    )
    rep.add_argument(
        "--width", type=int, default=100, help="wrap the table into blocks of at most this many characters"
    )
    rep.add_argument(
        "--at",
        type=int,
        action="append",
        metavar="K",
        help="instead of the summary: a Markdown table of the (first) metric, by default the problem's "
        "primary metric, at outer iteration K (repeatable), mean ± sd over the runs of each --group-by value "
        "('(2 of 3)' where some of them end before K)",
    )
    _grouping_arguments(rep)


def _add_plot(sub) -> None:
    """The ``plot`` subcommand: metrics of runs against an x axis, grouped or not."""
    plot = subcommand(
        sub,
        "plot",
        "plot a metric against iteration, communication rounds or wall time",
        "examples:\n  fednest-mpi plot runs/*.h5 -o figs/x_error.png --group-by algorithm.name\n"
        "  fednest-mpi plot runs/*.h5 -o figs/cost.pdf -m x_error -m hypergradient_norm --x-axis comm_rounds",
    )
    plot.add_argument("runs", nargs="+", help="run files (.h5) written by `fednest-mpi run`, or directories of them")
    plot.add_argument("--output", "-o", required=True, help="image file; format from the suffix: .png, .pdf or .svg")
    plot.add_argument(
        "--metric",
        "-m",
        dest="metrics",
        action="append",
        metavar="COLUMN",
        help="recorded column to plot (repeatable: one subplot each; default: the problem's primary metric)",
    )
    plot.add_argument(
        "--x-axis",
        "-x",
        default="iteration",
        help="iteration (default), comm_rounds, wall_time, or another non-decreasing column",
    )
    _grouping_arguments(plot)
    _axes_arguments(plot)
    _figure_arguments(plot)


def _benchmark_arguments(rep) -> None:
    """``report --benchmark FILE`` and the options that go with it."""
    rep.add_argument(
        "--benchmark",
        metavar="FILE",
        help="instead of runs: the Markdown benchmark table of the tasks of FILE (docs/benchmarks.md): rounds "
        "and bytes to each task's target and the metric at its budget, mean ± sd over seeds, per algorithm",
    )
    rep.add_argument(
        "--configs-dir",
        metavar="DIR",
        help="with --benchmark: write each row's config there as JSON and link it from the table",
    )
    _follow_up_arguments(rep)
    rep.add_argument(
        "--verify",
        metavar="TASK[/ALGORITHM]",
        help="with --benchmark: instead of the table, run again from its config every record of TASK (or of one "
        "ALGORITHM of it) on the task's reported seeds, one rank, in a temporary folder, and compare the new run "
        "with the record bit for bit; exit 1 when one differs",
    )
    rep.add_argument(
        "--archive",
        action="store_true",
        help="with --benchmark: instead of the table, write the benchmark records of the closed run files of its "
        "tasks to the records folder that FILE names (one .jsonl.gz per task and algorithm, to commit: the table "
        "reads them where run files are absent) and print what was written",
    )


def _follow_up_arguments(rep) -> None:
    """``report --benchmark FILE --follow-up DIR`` and the options that go with it."""
    rep.add_argument(
        "--follow-up",
        metavar="DIR",
        help="with --benchmark: instead of the table, write to DIR the sweeps that carry the tuning protocol on "
        "(a grid extended past an edge, the local step count's line at the chosen step sizes, the chosen setting "
        "on the reported seeds) and print their paths",
    )
    rep.add_argument(
        "--task",
        metavar="NAME",
        help="with --follow-up: only this task of the benchmark file (the others' runs are not read)",
    )
    rep.add_argument(
        "--no-extend",
        action="store_true",
        help="with --follow-up: no grid extension, only the local step counts' lines (where not run) and the "
        "chosen settings on the reported seeds",
    )


def _axes_arguments(plot) -> None:
    """``plot``: the axes' scales."""
    logy = plot.add_mutually_exclusive_group()
    logy.add_argument("--logy", dest="logy", action="store_const", const=True, default=None, help="log y axis")
    logy.add_argument(
        "--linear-y",
        dest="logy",
        action="store_const",
        const=False,
        help="linear y axis (default: log for errors/norms spanning more than 2 decades)",
    )
    plot.add_argument("--logx", action="store_true", help="log x axis")


def _figure_arguments(plot) -> None:
    """``plot``: the figure's words (title, axis labels, legend entries), legend, baselines, size."""
    plot.add_argument("--title", help="figure title (default: the problem and what is drawn; '' for none)")
    plot.add_argument("--xlabel", help="x-axis label (default: from the column's description and unit)")
    plot.add_argument(
        "--ylabel", action="append", metavar="TEXT", help="y-axis label, one per --metric (default: from the run file)"
    )
    plot.add_argument(
        "--label",
        dest="labels",
        action="append",
        default=[],
        metavar="VALUE=TEXT",
        help="legend entry for a group or config value, e.g. --label fednest='FedNest (ours)' or "
        "--label 'fednest, iid=FedNest, iid clients' (repeatable; default: the values in words)",
    )
    plot.add_argument(
        "--legend",
        choices=("best", "right", "below", "none"),
        default="best",
        help="legend inside the axes where it covers least (default), right of them, below them, or none",
    )
    plot.add_argument(
        "--constant",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="draw the runs with this config value as a constant, a black dashed line at their final value "
        "(a baseline, e.g. --constant problem.tune_loss=false: Fig. 3's untuned accuracy; repeatable: all must hold)",
    )
    plot.add_argument("--size", metavar="WxH", help="figure size in inches, e.g. 3.5x2.6 (default: 6.4x4.4 per plot)")
    plot.add_argument("--dpi", type=float, default=150, help="resolution of a .png (default %(default)s)")


def _grouping_arguments(parser) -> None:
    """The options ``report`` and ``plot`` share: the groups of runs averaged, the running mean."""
    parser.add_argument(
        "--group-by",
        "-g",
        metavar="FIELD",
        action="append",
        help="config field (dotted, e.g. algorithm.name, or mpi_size; repeatable): one line/row per "
        "combination of values, mean ± sd over its runs (seeds); default: one per run",
    )
    parser.add_argument(
        "--smooth",
        type=int,
        default=1,
        metavar="K",
        help="trailing running mean over K iterations before averaging (the paper's curves: 5)",
    )


def execute(args) -> int:
    try:
        if args.smooth < 1:
            raise UsageError(f"--smooth: expected a window of at least 1 iteration, got {args.smooth}")
        if args.command == "report":
            return _report(args)
        _plot(args)
    except UsageError as exc:
        return usage_error(exc)
    return 0


def _report(args) -> int:
    """``report``: the benchmark table (or its follow-up sweeps), the table at iterations ``--at`` or the summary."""
    from fednest_mpi import post

    if args.benchmark:
        return _benchmark(args)
    if not args.runs:
        raise UsageError("report: name run files (.h5) or folders of them, or a benchmark file with --benchmark")
    if args.configs_dir or args.follow_up or args.no_extend or args.archive or args.verify or args.task:
        raise UsageError(
            "--configs-dir, --follow-up, --task, --no-extend, --archive and --verify go with --benchmark FILE"
        )
    if args.at:
        metric = args.metrics[0] if args.metrics else None  # None: the runs' primary metric
        print(post.checkpoint_table(args.runs, metric, args.at, group_by=args.group_by, smooth=args.smooth))
    else:
        text = post.report(args.runs, args.metrics, width=args.width, group_by=args.group_by, smooth=args.smooth)
        print(text, end="")
    return 0


def _benchmark(args) -> int:
    """``report --benchmark FILE``: its table, or with ``--follow-up DIR`` the paths of the sweeps written there."""
    from fednest_mpi import post

    if args.runs:
        raise UsageError("--benchmark reads the runs its file names; drop the run files from the command")
    if args.archive and (args.follow_up or args.configs_dir):
        raise UsageError("--archive writes the records only; run --follow-up or --configs-dir in another command")
    if args.verify and (args.archive or args.follow_up or args.configs_dir):
        raise UsageError("--verify runs the records again only; run --archive, --follow-up or --configs-dir apart")
    if args.task and not args.follow_up:
        raise UsageError("--task NAME goes with --follow-up DIR (the table and --archive read every task)")
    if args.verify:
        return _verify(args.benchmark, args.verify)
    if args.archive:
        for done in post.benchmark.archive(args.benchmark):
            for why in done.skipped:
                print(f"skipped {why}", file=sys.stderr)
            if not done.skipped:
                what = f"{done.changed} new or changed" if done.written else "unchanged"
                print(f"{os.path.normpath(done.path)}: {done.runs} runs ({what})")
    elif args.follow_up:
        sweeps = post.benchmark.follow_up_sweeps(
            args.benchmark, args.follow_up, not args.no_extend, task_name=args.task
        )
        for sweep in sweeps:
            print(sweep)
    else:
        base = Path(args.configs_dir).parent if args.configs_dir else None
        print(post.benchmark_table(args.benchmark, args.configs_dir, link_base=base), end="")
    return 0


def _verify(benchmark: str, which: str) -> int:
    """``report --benchmark FILE --verify TASK[/ALGORITHM]``: each record on the reported seeds run again (one rank,
    a temporary folder) and compared bit for bit; a line per record, then the count. Exit 1 when one differs on the
    CPU class it was recorded on (or on an unknown one), or a run fails; a difference between classes in a mode whose
    bits are a class's own (the default, ``reproducible``) is reported as such and expected."""
    import tempfile

    from fednest_mpi import post

    records = post.benchmark.records_to_verify(benchmark, which)
    same = failures = 0
    with tempfile.TemporaryDirectory(prefix="fednest-verify-") as folder:
        for record in records:
            outcome, unexpected = _verify_record(record, Path(folder) / record.path.name)
            same += outcome == "same bits"
            failures += unexpected
            print(f"{record.path.name}: {outcome}", flush=True)
    print(f"{same} of {len(records)} records of {which} give the same bits again; {failures} differ unexpectedly")
    return 1 if failures else 0


def _verify_record(record, output: Path) -> tuple[str, bool]:
    """(what the run of ``record``'s config, written to ``output``, gives against the record; whether that is
    unexpected): "same bits", a difference and where, or the run's failure."""
    import contextlib
    import io
    import json
    import logging

    from fednest_mpi import config as configuration
    from fednest_mpi import post
    from fednest_mpi.comm import SerialComm
    from fednest_mpi.errors import RunFailed
    from fednest_mpi.session import Session

    data = json.loads(record.attrs["config_json"])
    data["run"] = {**data.get("run", {}), "output": str(output), "progress": "never", "checkpoint_dir": ""}
    cfg = configuration.from_dict(data)
    quiet = logging.getLogger("fednest_mpi.verify")
    quiet.setLevel(logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # its "output: PATH" line: a temporary file
            Session(cfg, SerialComm(), log=quiet).run_to_file()
    except (UsageError, RunFailed) as exc:
        return f"the run failed: {exc}", True
    rerun = post.load.read_runs([str(output)])[0]
    difference = post.benchmark.series_difference(record, rerun)
    if difference is None:
        return "same bits", False
    was, now = post.benchmark.cpu_class_of(record), post.benchmark.cpu_class_of(rerun)
    if was is not None and was != now and cfg.run.numerics != "portable":
        return f"DIFFERS (expected: recorded on {was!r}, run on {now!r}, in mode {cfg.run.numerics!r}): " + (
            f"{difference}, the record's value first"
        ), False
    where = "on the same CPU class" if was == now else "recorded on an unknown CPU class"
    return f"DIFFERS ({where}): {difference}, the record's value first", True


def _plot(args) -> None:
    """``plot``: the figure written to ``--output``."""
    from fednest_mpi import post

    post.plot(
        args.runs,
        args.output,
        metric=args.metrics,
        x_axis=args.x_axis,
        group_by=args.group_by,
        logy=args.logy,
        smooth=args.smooth,
        title=args.title,
        xlabel=args.xlabel,
        ylabel=args.ylabel[0] if args.ylabel and len(args.ylabel) == 1 else args.ylabel,
        size=_size(args.size),
        logx=args.logx,
        labels=_labels(args.labels),
        legend=args.legend,
        dpi=args.dpi,
        constant=args.constant,
    )
    print(f"output: {args.output}")


def _size(text: str | None) -> tuple[float, float] | None:
    """``--size 3.5x2.6`` as (width, height) in inches."""
    if text is None:
        return None
    try:
        width, height = (float(v) for v in text.lower().replace(",", "x").split("x"))
    except ValueError:
        raise UsageError(f"--size: expected WIDTHxHEIGHT in inches, e.g. 3.5x2.6, got {text!r}") from None
    return width, height


def _labels(items: list[str]) -> dict[str, str]:
    """``--label VALUE=TEXT`` (repeatable) as {VALUE: TEXT}."""
    labels = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--label: expected VALUE=TEXT, e.g. fednest='FedNest (ours)', got {item!r}")
        labels[key.strip()] = text
    return labels
