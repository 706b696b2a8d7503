"""Command line: ``fednest-mpi run | report | plot | recover | jobs | download | data | config-doc``
(also ``python -m fednest_mpi``).

Exit codes: 0 success, also a run stopped by SIGTERM/SIGINT/SIGUSR1 after writing its checkpoint
(continue it with ``--resume``); 1 failure of the run; 2 usage error (bad arguments, config,
output path, checkpoint, missing or damaged data file). Usage errors are detected identically on
every rank (or agreed on in one collective while building the problem) and printed once (by rank
0). A NaN/Inf stops every rank after the same iteration with one message; any other exception
during the run prints ``rank r/P`` and its cause, and aborts the whole MPI job, so no rank is left
waiting in a collective. See docs/reliability.md.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from fednest_mpi import __version__
from fednest_mpi.errors import UsageError

EPILOG_RUN = """\
example:
  mpiexec -n 2 fednest-mpi run configs/quadratic.toml --set algorithm.outer_iterations=50 \\
      --output runs/quadratic.h5 --overwrite
  # after a preemption or SIGTERM (on any number of ranks):
  mpiexec -n 1 fednest-mpi run configs/quadratic.toml --set algorithm.outer_iterations=50 \\
      --output runs/quadratic.h5 --resume
"""


def _parser() -> argparse.ArgumentParser:
    from fednest_mpi.config import DATASETS  # here, not at import: the stop signals are installed first

    parser = argparse.ArgumentParser(
        prog="fednest-mpi",
        description="MPI simulator for federated bilevel optimisation (FedNest family).",
        epilog="example: mpiexec -n 2 fednest-mpi run configs/quadratic.toml",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"fednest-mpi {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = _config_command(sub, "run", "run a simulation (under mpiexec for several ranks)", EPILOG_RUN)
    run.add_argument("--output", "-o", help="HDF5 output path (run.output)")
    run.add_argument("--overwrite", action="store_true", help="replace an existing output file (run.overwrite)")
    run.add_argument("--quiet", "-q", action="store_true", help="warnings only")
    run.add_argument(
        "--resume",
        action="store_true",
        help="continue from the run's latest checkpoint (run.checkpoint_dir): same config, any number of "
        "ranks; the output file is cut back to the checkpoint and appended to",
    )
    rep = sub.add_parser(
        "report",
        help="text table of runs: differing config, final/best metrics, time, communication",
        epilog="examples:\n  fednest-mpi report runs/*.h5 --metric x_error --metric hypergradient_norm\n"
        "  fednest-mpi report --benchmark jobs/benchmarks/table.toml --configs-dir docs/benchmarks",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    rep.add_argument("runs", nargs="*", help="run files (.h5) written by `fednest-mpi run`, or directories of them")
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
    rep.add_argument(
        "--follow-up",
        metavar="DIR",
        help="with --benchmark: instead of the table, write to DIR the sweeps that carry the tuning protocol on "
        "(a grid extended past an edge, the chosen setting on the reported seeds) and print their paths",
    )
    rep.add_argument(
        "--no-extend",
        action="store_true",
        help="with --follow-up: no grid extension, only the chosen settings on the reported seeds",
    )
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
        "primary metric, at outer iteration K (repeatable), mean ± sd over the runs of each --group-by value",
    )
    _grouping_arguments(rep)
    plot = sub.add_parser(
        "plot",
        help="plot a metric against iteration, communication rounds or wall time",
        epilog="examples:\n  fednest-mpi plot runs/*.h5 -o figs/x_error.png --group-by algorithm.name\n"
        "  fednest-mpi plot runs/*.h5 -o figs/cost.pdf -m x_error -m hypergradient_norm --x-axis comm_rounds",
        formatter_class=argparse.RawDescriptionHelpFormatter,
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
    rec = sub.add_parser(
        "recover",
        help="close the files of a killed run (SIGKILL, node loss) at its last complete iteration",
        epilog="example:\n  fednest-mpi recover runs/q.h5   # then continue it with run ... --resume",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    rec.add_argument("run", help="run file (.h5) of a run that was killed before it closed its files")
    epilog_jobs = (
        "examples:\n  fednest-mpi jobs list jobs/sweeps/quadratic_variants.toml\n"
        "  fednest-mpi jobs render jobs/sweeps/quadratic_variants.toml --site local\n"
        "  fednest-mpi jobs render jobs/sweeps/fig2a.toml --site jobs/sites/YOURS.toml -o runs/jobs/fig2a\n"
        "  bash runs/jobs/quadratic_variants/quadratic_variants.local.sh -j 2"
    )
    jobs = sub.add_parser(
        "jobs",
        help="batch scripts for a sweep of runs: SLURM job array, one sbatch per run, workstation script",
        epilog=epilog_jobs,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    jsub = jobs.add_subparsers(dest="jobs_command", required=True, metavar="ACTION")
    ren = jsub.add_parser(
        "render",
        help="validate a sweep and write its tasks file and scripts for one site",
        epilog=epilog_jobs,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ren.add_argument("sweep", help="sweep file (jobs/sweeps/*.toml)")
    ren.add_argument(
        "--site",
        "-s",
        default="local",
        help="a built-in site (local, example-cluster) or the path of a site file (default: %(default)s)",
    )
    ren.add_argument("--out-dir", "-o", help="folder for the scripts, tasks file and logs (default: runs/jobs/SWEEP)")
    ren.add_argument("--workdir", help="folder the jobs run in (default: the current directory)")
    ren.add_argument(
        "--launcher", choices=("srun", "mpirun"), help="MPI launcher of the SLURM scripts (default: the site's)"
    )
    ren.add_argument("--no-check", dest="check", action="store_false", help="do not validate every task's config first")
    lst = jsub.add_parser(
        "list", help="print the runs of a sweep", epilog="example: fednest-mpi jobs list jobs/sweeps/fig4.toml -P paper"
    )
    lst.add_argument("sweep", help="sweep file (jobs/sweeps/*.toml)")
    for p in (ren, lst):
        p.add_argument(
            "--preset",
            "-P",
            default="",
            help="a named [presets.NAME] of the sweep file laid over it (figures: paper, authors_code); "
            "its runs go to OUTPUT_DIR/NAME (default: none, the file as written)",
        )
    dl = sub.add_parser(
        "download",
        help="fetch MNIST, Fashion-MNIST or UCI Adult (needs internet), checking checksums",
        epilog="example:\n  fednest-mpi download mnist --dest ~/data && export FEDNEST_DATA=~/data",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    dl.add_argument("datasets", nargs="+", choices=tuple(DATASETS), help="data set(s) to fetch")
    dl.add_argument("--dest", "-d", help="data root (default: $FEDNEST_DATA); the files go to DEST/mnist, ...")
    dl.add_argument("--mirror", help="base URL replacing the default mirror (file:// works too)")
    _data_parser(sub)
    _check_parser(sub)
    sub.add_parser(
        "config-doc",
        help="print the config reference (Markdown) generated from the config definitions",
        epilog="example: fednest-mpi config-doc > docs/config.md",
    )
    return parser


EPILOG_CHECK = """\
example: fednest-mpi check my_plugin.toml --set problem.n_clients=8
prints one line per check (contract, chunks, ranks): ok, differs (the first column and iteration), or not
run (why). Exit codes: 0 every check ran and agreed, 2 a mistake in the config or a plugin's broken contract
(one line naming the hook), 3 a check differs, 4 a check could not run (and none differs).
"""


def _config_command(sub, name: str, help_text: str, epilog: str):
    """The subcommand ``name`` that reads a config file and its ``--set`` overrides (``run``, ``check``)."""
    parser = sub.add_parser(name, help=help_text, epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="TOML config file (see docs/config.md)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="override a config field, e.g. --set algorithm.outer_lr=0.05 (repeatable)",
    )
    return parser


def _check_parser(sub) -> None:
    chk = _config_command(
        sub,
        "check",
        "check a config's plugins: their contract, and the same bits at 1 and 2 ranks and any chunk size",
        EPILOG_CHECK,
    )
    chk.add_argument("--iterations", type=int, default=3, help="outer iterations of each run (default 3)")
    chk.add_argument("--ranks", type=int, default=2, help="ranks of the run compared with one rank (default 2)")
    chk.add_argument("--timeout", type=float, default=600.0, help="seconds the many-rank run may take (default 600)")


def _check(args) -> int:
    from fednest_mpi.checking import check
    from fednest_mpi.logs import setup_logging

    setup_logging(0, 1, logging.WARNING)
    try:
        return check(args.config, args.overrides, args.iterations, args.ranks, args.timeout)
    except UsageError as exc:
        print(f"fednest-mpi: error: {exc}", file=sys.stderr)
        return 2


EPILOG_DATA = """\
examples:
  fednest-mpi data convert mine.npz --partition dirichlet --clients 100 --alpha 0.5 --seed 0 -o mine.h5
  fednest-mpi data check mine.h5
  # mine.npz: np.savez("mine.npz", features=X, labels=Y[, test_features=Xt, test_labels=Yt]); docs/data.md
exit codes: 0 done / valid, 2 bad arguments or a malformed input file (one line naming the defect)
"""


def _data_parser(sub) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    data = sub.add_parser("data", help="your own data: convert arrays to a federated data-set file, check one",
                          epilog=EPILOG_DATA, formatter_class=fmt)  # fmt: skip
    dsub = data.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    conv = dsub.add_parser("convert", help="split (features, labels) of a .npz among clients into an HDF5 file",
                           epilog=EPILOG_DATA, formatter_class=fmt)  # fmt: skip
    conv.add_argument("input", help=".npz with features and labels (or x_train, y_train)")
    conv.add_argument("--output", "-o", required=True, help="federated data-set file to write (.h5)")
    conv.add_argument("--partition", "-p", default="iid", choices=("iid", "shards", "dirichlet"), help="(default iid)")
    conv.add_argument("--clients", "-M", type=int, default=10, help="number of clients (default %(default)s)")
    conv.add_argument("--seed", type=int, default=0, help="seed of the partition (default %(default)s)")
    conv.add_argument("--alpha", type=float, default=0.5, help="Dirichlet concentration (default %(default)s)")
    conv.add_argument("--shards-per-client", type=int, default=2, help="shards partition (default %(default)s)")
    conv.add_argument("--min-size", type=int, default=1, help="Dirichlet: samples per client at least (default 1)")
    conv.add_argument("--n-classes", type=int, help="number of classes (default: the largest label + 1)")
    conv.add_argument("--overwrite", action="store_true", help="replace an existing output file")
    chk = dsub.add_parser("check", help="validate a federated data-set file (reads it whole) and summarise it",
                          epilog=EPILOG_DATA, formatter_class=fmt)  # fmt: skip
    chk.add_argument("file", help="federated data-set file (.h5)")


def _data(args) -> int:
    from fednest_mpi.data.federated import convert_npz, describe

    try:
        if args.data_command == "check":
            print(describe(args.file), end="")
            return 0
        options = dict(partition=args.partition, n_clients=args.clients, seed=args.seed, alpha=args.alpha,
                       shards_per_client=args.shards_per_client, min_size=args.min_size)  # fmt: skip
        path = convert_npz(args.input, args.output, n_classes=args.n_classes, overwrite=args.overwrite, **options)
        print(describe(path), end="")
    except UsageError as exc:
        print(f"fednest-mpi: error: {exc}", file=sys.stderr)
        return 2
    return 0


def _run(args) -> int:
    from fednest_mpi import config as configuration
    from fednest_mpi.comm import world  # starts MPI (after the thread-level setting)
    from fednest_mpi.errors import RunFailed
    from fednest_mpi.logs import setup_logging
    from fednest_mpi.session import Session, report_failure, report_usage_error

    comm = world()
    rank, size = comm.Get_rank(), comm.Get_size()
    log = setup_logging(rank, size, logging.WARNING if args.quiet else logging.INFO)
    try:  # deterministic on every rank, before any collective
        values: dict[str, object] = {}  # as given, never through TOML: a path is a path, whatever its bytes
        if args.output is not None:
            values["run.output"] = args.output
        if args.overwrite:
            values["run.overwrite"] = True
        cfg = configuration.load(args.config, args.overrides, values)
    except UsageError as exc:
        return report_usage_error(comm, exc)
    try:
        return Session(cfg, comm, resume=args.resume, log=log).run_to_file()
    except UsageError as exc:
        return report_usage_error(comm, exc)
    except RunFailed as exc:
        return report_failure(comm, exc)


def _grouping_arguments(parser) -> None:
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


def _analyse(args) -> int:
    from fednest_mpi import post

    try:
        if args.smooth < 1:
            raise UsageError(f"--smooth: expected a window of at least 1 iteration, got {args.smooth}")
        if args.command == "report" and args.benchmark:
            if args.runs:
                raise UsageError("--benchmark reads the runs its file names; drop the run files from the command")
            if args.follow_up:
                for sweep in post.benchmark.follow_up_sweeps(args.benchmark, args.follow_up, not args.no_extend):
                    print(sweep)
            else:
                base = Path(args.configs_dir).parent if args.configs_dir else None
                print(post.benchmark_table(args.benchmark, args.configs_dir, link_base=base), end="")
        elif args.command == "report" and not args.runs:
            raise UsageError("report: name run files (.h5) or folders of them, or a benchmark file with --benchmark")
        elif args.command == "report" and (args.configs_dir or args.follow_up or args.no_extend):
            raise UsageError("--configs-dir, --follow-up and --no-extend go with --benchmark FILE")
        elif args.command == "report" and args.at:
            metric = args.metrics[0] if args.metrics else None  # None: the runs' primary metric
            print(post.checkpoint_table(args.runs, metric, args.at, group_by=args.group_by, smooth=args.smooth))
        elif args.command == "report":
            text = post.report(args.runs, args.metrics, width=args.width, group_by=args.group_by, smooth=args.smooth)
            print(text, end="")
        else:
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
    except UsageError as exc:
        print(f"fednest-mpi: error: {exc}", file=sys.stderr)
        return 2
    return 0


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


def _jobs(args) -> int:
    from fednest_mpi import jobs

    try:
        if args.jobs_command == "list":
            print(jobs.describe(jobs.expand(jobs.load_sweep(args.sweep, args.preset))), end="")
            return 0
        paths = jobs.render_all(
            args.sweep,
            args.site,
            args.out_dir,
            workdir=args.workdir,
            launcher=args.launcher,
            check=args.check,
            preset=args.preset,
        )
    except UsageError as exc:
        print(f"fednest-mpi: error: {exc}", file=sys.stderr)
        return 2
    print(*paths, sep="\n")
    print(f"submit: sbatch {paths[1]}\nworkstation: bash {paths[2]} [-j N] [TASK_ID ...]")
    return 0


def main(argv=None) -> int:
    program_run = argv is None and sys.argv[1:2] == ["run"]  # the program itself, not a test calling main()
    for stream in (sys.stdout, sys.stderr) if argv is None else ():  # a path's undecodable bytes printed as such
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="surrogateescape")
    if program_run:  # as early as can be
        from fednest_mpi import stop

        stop.install()
    args = _parser().parse_args(argv)
    if program_run and args.command == "run":
        code = _run(args)
        stop.ignore_from_now()  # the run is over: the interpreter's teardown would put back SIG_DFL (exit 15)
        return code
    if args.command == "config-doc":
        from fednest_mpi.config import reference_markdown

        print(reference_markdown())
        return 0
    if args.command in ("report", "plot"):
        return _analyse(args)
    if args.command == "jobs":
        return _jobs(args)
    if args.command == "download":
        return _download(args)
    if args.command == "data":
        return _data(args)
    if args.command == "recover":
        return _recover(args)
    if args.command == "check":
        return _check(args)
    return _run(args)


def _recover(args) -> int:
    from fednest_mpi.io.recover import recover

    try:
        print(recover(args.run))
    except UsageError as exc:
        print(f"fednest-mpi: error: {exc}", file=sys.stderr)
        return 2
    return 0


def _download(args) -> int:
    import os

    from fednest_mpi.data import ENV_VAR, download
    from fednest_mpi.errors import DataError

    dest = args.dest or os.environ.get(ENV_VAR)
    if not dest:
        print(
            f"fednest-mpi: error: --dest: no data root given and {ENV_VAR} is not set; pass --dest DIR", file=sys.stderr
        )
        return 2
    try:
        for name in args.datasets:
            print(f"output: {download(name, dest, base_url=args.mirror)}")
    except DataError as exc:
        print(f"fednest-mpi: error: {exc}", file=sys.stderr)
        return 1
    return 0
