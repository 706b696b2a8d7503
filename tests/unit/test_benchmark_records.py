"""Benchmark records (post.records, `fednest-mpi report --benchmark FILE --archive`): the committed record of each
benchmark run gives the same table, configs and follow-up sweeps as the run files, once the run files are gone."""

from __future__ import annotations

import gzip
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from small_configs import make_config, write_run

from fednest_mpi import cli, post
from fednest_mpi.errors import UsageError
from fednest_mpi.post import records

TARGET, BUDGET = 0.3, 90


def _write_run(path, seed: int, **algorithm) -> None:
    write_run(path, make_config(seed=seed, algorithm={"outer_iterations": 12, **algorithm}, run={"output": str(path)}))


def _bench(root: Path) -> Path:
    """Tiny quadratic runs of a benchmark task: FedNest (one setting) and an LFedNest grid of outer_lr with an edge,
    on the tuning and the reported seeds; the benchmark file names a records folder."""
    runs = root / "runs" / "quadratic"
    runs.mkdir(parents=True)
    for seed in (0, 1, 2, 100, 101, 102):
        _write_run(runs / f"fednest_s{seed}.h5", seed, name="fednest")
        for lr in (0.05, 0.2):
            if seed < 100 and lr == 0.05:
                continue  # the reported seeds of one setting only, as the protocol runs them
            _write_run(runs / f"lfednest_lr{lr}_s{seed}.h5", seed, name="lfednest", outer_lr=lr)
    path = root / "jobs" / "table.toml"
    path.parent.mkdir()
    path.write_text(
        'records = "../records"\n\n[[task]]\nname = "quadratic"\nruns = "../runs/quadratic"\nmetric = "x_error"\n'
        f"target = {TARGET}\nbudget_rounds = {BUDGET}\n"
    )
    return path


@pytest.fixture(scope="module")
def bench(tmp_path_factory) -> Path:
    return _bench(tmp_path_factory.mktemp("records"))


def _outputs(path: Path, where: Path, capsys) -> dict[str, bytes]:
    """The table (stdout of the command), the config files written beside it and the follow-up sweeps and configs,
    every file's bytes by its name."""
    configs = where / "configs"
    assert cli.main(["report", "--benchmark", str(path), "--configs-dir", str(configs)]) == 0
    out = {"table.md": capsys.readouterr().out.encode()}
    out.update({f"configs/{p.name}": p.read_bytes() for p in sorted(configs.iterdir())})
    follow = where / "follow-up"
    sweeps = post.benchmark.follow_up_sweeps(path, follow)
    assert sweeps  # the LFedNest edge is extended
    here = str(follow.resolve()).encode()  # a sweep names its config by its absolute path
    out.update({f"follow-up/{p.name}": p.read_bytes().replace(here, b"FOLLOW") for p in sorted(follow.iterdir())})
    return out


def test_the_table_from_the_records_alone_is_the_table_from_the_run_files(tmp_path, capsys):
    path = _bench(tmp_path)
    runs = tmp_path / "runs" / "quadratic"
    from_files = _outputs(path, tmp_path / "a", capsys)
    assert cli.main(["report", "--benchmark", str(path), "--archive"]) == 0
    printed = capsys.readouterr().out
    written = sorted((tmp_path / "records" / "quadratic").iterdir())
    assert [p.name for p in written] == ["fednest.jsonl.gz", "lfednest.jsonl.gz"]
    assert "fednest.jsonl.gz: 6 runs (6 new or changed)" in printed
    assert "lfednest.jsonl.gz: 9 runs (9 new or changed)" in printed
    assert sum(p.stat().st_size for p in written) < sum(p.stat().st_size for p in runs.glob("*.h5")) / 5
    shutil.rmtree(runs)
    from_records = _outputs(path, tmp_path / "b", capsys)
    assert from_records.keys() == from_files.keys()
    for name in from_files:  # bit for bit: the Markdown, each linked config, each sweep and its config
        assert from_records[name] == from_files[name], name
    assert b"| lfednest | **outer_lr=0.2** (chosen; edge of grid: outer_lr largest) |" in from_records["table.md"]


def test_records_stand_in_for_the_absent_run_files_only(bench, tmp_path, capsys):
    """Half the run files gone: the table is the same; a run file present wins over its record."""
    root = tmp_path / "copy"
    shutil.copytree(bench.parent.parent, root)
    path = root / "jobs" / "table.toml"
    shutil.rmtree(root / "records", ignore_errors=True)
    reference = _outputs(path, tmp_path / "a", capsys)
    post.benchmark.archive(path)
    for file in sorted((root / "runs" / "quadratic").glob("*.h5"))[::2]:
        file.unlink()
    assert _outputs(path, tmp_path / "b", capsys) == reference
    (task,) = post.read_benchmark_file(path)
    runs = post.benchmark.task_runs(task)
    assert [r.path.name for r in runs] == sorted(r.path.name for r in runs)
    from_files = {r.path.name for r in runs if "record" not in r.attrs}
    assert from_files == {p.name for p in (root / "runs" / "quadratic").glob("*.h5")}


def test_archiving_again_keeps_the_records_of_gone_run_files_and_rewrites_nothing(bench, tmp_path):
    root = tmp_path / "copy"
    shutil.copytree(bench.parent.parent, root)
    path = root / "jobs" / "table.toml"
    shutil.rmtree(root / "records", ignore_errors=True)
    first = post.benchmark.archive(path)
    assert [(a.path.name, a.runs, a.changed, a.written) for a in first] == [
        ("fednest.jsonl.gz", 6, 6, True),
        ("lfednest.jsonl.gz", 9, 9, True),
    ]
    data = {a.path: a.path.read_bytes() for a in first}
    for file in (root / "runs" / "quadratic").glob("fednest_*.h5"):
        file.unlink()
    again = post.benchmark.archive(path)
    assert [(a.path.name, a.runs, a.changed, a.written) for a in again] == [("lfednest.jsonl.gz", 9, 0, False)]
    assert {p: p.read_bytes() for p in data} == data  # the same bytes: no time stamp in the gzip header
    # a rerun (here: another config under the same name) replaces its record
    _write_run(root / "runs" / "quadratic" / "lfednest_lr0.2_s0.h5", 0, name="lfednest", outer_lr=0.2, inner_lr=0.1)
    (changed,) = post.benchmark.archive(path)
    assert (changed.runs, changed.changed, changed.written) == (9, 1, True)


def test_a_record_holds_the_columns_bit_for_bit_and_whether_the_run_finished(tmp_path):
    """A run that stopped short (diverged), with NaN and infinite values: the record gives back the same arrays,
    bit for bit, and says that it stopped."""
    from fednest_mpi.io.h5 import RunWriter

    runs = tmp_path / "runs"
    runs.mkdir()
    columns = {"iteration": ("k", "1"), "comm_rounds": ("r", "1"), "comm_bytes": ("b", "B"), "x_error": ("e", "1")}
    values = [1.0, 1 / 3, math.pi * 1e-300, 5e-324, math.inf, math.nan]
    for name, n in (("finished", 4), ("stopped", 6)):
        cfg = {"seed": 100, "algorithm": {"name": "fedmsa", "outer_iterations": n if name == "finished" else 9}}
        w = RunWriter(runs / f"{name}.h5", {"config_json": json.dumps(cfg), "mpi_size": 1}, columns)
        for k in range(n + 1):
            w.append({"iteration": k, "comm_rounds": 3 * k, "comm_bytes": 24 * k, "x_error": values[k % 6]})
        w.close()
    path = tmp_path / "t.toml"
    path.write_text(
        f'records = "rec"\n[[task]]\nname = "t"\nruns = "{runs}"\nmetric = "x_error"\ntarget = 1e-4\n'
        "budget_rounds = 12\n"
    )
    (archived,) = post.benchmark.archive(path)
    with gzip.open(archived.path, "rt") as f:
        header, *lines = [json.loads(line) for line in f]
    assert header == {"format": records.FORMAT, "version": records.VERSION, "task": "t", "metric": "x_error"}
    assert [(r["file"], r["status"], r["iterations"], r["outer_iterations"]) for r in lines] == [
        ("finished.h5", "finished", 4, 4),
        ("stopped.h5", "stopped", 6, 9),
    ]
    assert set(lines[0]["data"]) == {"comm_rounds", "comm_bytes", "x_error"}  # what the table reads, no more
    (task,) = post.read_benchmark_file(path)
    from_files = post.benchmark.task_runs(task)
    shutil.rmtree(runs)
    from_records = post.benchmark.task_runs(task)
    for a, b in zip(from_files, from_records, strict=True):
        assert a.config == b.config and a.attrs["config"] == b.attrs["config"]
        for column in b.data:
            assert a.data[column].dtype == b.data[column].dtype
            assert a.data[column].tobytes() == b.data[column].tobytes(), column


def test_an_unclosed_run_file_is_not_archived(tmp_path, capsys):
    from fednest_mpi.io.h5 import RunWriter

    path = _bench(tmp_path)
    columns = {"iteration": ("k", "1"), "comm_rounds": ("r", "1"), "comm_bytes": ("b", "B"), "x_error": ("e", "1")}
    cfg = {"seed": 100, "algorithm": {"name": "fedmsa"}}
    live = tmp_path / "runs" / "quadratic" / "live.h5"
    w = RunWriter(live, {"config_json": json.dumps(cfg)}, columns)
    w.append({"iteration": 0, "comm_rounds": 0, "comm_bytes": 0, "x_error": 1.0})
    try:
        assert cli.main(["report", "--benchmark", str(path), "--archive"]) == 0
    finally:
        w.close()
    captured = capsys.readouterr()
    assert "skipped " in captured.err and "live.h5: run file " in captured.err
    assert "was not closed by the run that wrote it" in captured.err
    assert not (tmp_path / "records" / "quadratic" / "fedmsa.jsonl.gz").exists()


def test_archive_needs_a_records_folder_and_refuses_an_edited_record(bench, tmp_path, capsys):
    plain = tmp_path / "plain.toml"
    plain.write_text(bench.read_text().replace('records = "../records"\n', ""))
    assert cli.main(["report", "--benchmark", str(plain), "--archive"]) == 2
    assert "names no records folder" in capsys.readouterr().err
    root = tmp_path / "copy"
    shutil.copytree(bench.parent.parent, root)
    path = root / "jobs" / "table.toml"
    (archived, _) = post.benchmark.archive(path)
    with gzip.open(archived.path, "rt") as f:
        lines = f.read().splitlines()
    record = json.loads(lines[1])
    record["config_json"] = record["config_json"].replace('"seed": 0', '"seed": 7')  # edited, the old digest
    assert record["config_json"] != json.loads(lines[1])["config_json"]
    lines[1] = json.dumps(record)
    archived.path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    shutil.rmtree(root / "runs")
    with pytest.raises(UsageError, match="does not match its config digest"):
        post.benchmark_table(path)
    assert cli.main(["report", "runs", "--archive"]) == 2  # --archive goes with --benchmark
    assert "go with --benchmark" in capsys.readouterr().err


def test_the_shipped_benchmark_files_name_the_committed_records():
    repo = Path(__file__).resolve().parents[2]
    for name in ("table.toml", "mnist.toml"):
        for task in post.read_benchmark_file(repo / "jobs/benchmarks" / name):
            assert task.records == repo / "jobs/benchmarks/../../docs/benchmarks/records" / task.name
            assert np.all([p.suffixes[-2:] == [".jsonl", ".gz"] for p in task.records.glob("*")])


def test_a_run_written_before_a_config_field_existed_reads_with_the_value_that_reproduces_it():
    """federation.group_clients (new): an older run's config lacks it and ran as 0 (automatic) does, so the
    benchmark table and its follow-up sweeps see one setting, not a varying field with a missing value."""
    from fednest_mpi.post.load import ADDED_FIELDS, run_config

    old = {"seed": 1, "federation": {"reduction": "exact"}, "algorithm": {"name": "fednest"}}
    new = {"seed": 1, "federation": {"reduction": "exact", "group_clients": 0}, "algorithm": {"name": "fednest"}}
    assert run_config(old) == run_config(new)
    assert run_config(old)["federation.group_clients"] == ADDED_FIELDS["federation.group_clients"]
    assert "federation.group_clients" not in run_config({"problem": {"name": "quadratic"}})  # not a run's config


def _edit_record(path: Path, file: str, change) -> None:
    """Rewrite the records file ``path`` with ``change(record)`` applied to the record of run file ``file``."""
    header, kept = records._load(path)
    for record in kept:
        if record["file"] == file:
            change(record)
    path.write_bytes(records.records_text(header["task"], header["metric"], kept))


def test_verify_runs_the_reported_records_again_and_tells_a_changed_bit(tmp_path, capsys):
    from fednest_mpi import numerics

    path = _bench(tmp_path)
    post.benchmark.archive(path)
    shutil.rmtree(tmp_path / "runs")  # the records alone, as in a fresh clone
    verify = ["report", "--benchmark", str(path), "--verify", "quadratic/lfednest"]
    assert cli.main(verify) == 0
    out = capsys.readouterr().out
    assert out.count(": same bits") == 3 and "3 of 3 records of quadratic/lfednest give the same bits again" in out
    kept = tmp_path / "records" / "quadratic" / "lfednest.jsonl.gz"
    one = "lfednest_lr0.2_s1.h5"

    def nudge(record):  # one value of the series, one ulp up
        record["data"]["x_error"][3] = float(np.nextafter(record["data"]["x_error"][3], np.inf))

    _edit_record(kept, one, nudge)
    assert cli.main(verify) == 1
    assert f"{one}: DIFFERS (recorded on an unknown CPU class): x_error at iteration 3" in capsys.readouterr().out
    here = numerics.in_force()
    _edit_record(kept, one, lambda r: r.update(numerics=json.dumps(here)))
    assert cli.main(verify) == 1
    assert f"{one}: DIFFERS (on the same CPU class)" in capsys.readouterr().out
    elsewhere = {**here, "mkl": "AUTO,STRICT", "cpu_vendor": "SomeOtherVendor"}
    _edit_record(kept, one, lambda r: r.update(numerics=json.dumps(elsewhere)))
    assert cli.main(verify) == 0  # the default mode's bits are a CPU class's own: a difference there is expected
    out = capsys.readouterr().out
    assert f"{one}: DIFFERS (expected: recorded on 'SomeOtherVendor; MKL AUTO,STRICT" in out
    assert "2 of 3 records of quadratic/lfednest give the same bits again; 0 differ unexpectedly" in out
    with pytest.raises(UsageError, match="no task 'nosuch'"):
        post.benchmark.records_to_verify(path, "nosuch")
    with pytest.raises(UsageError, match="no records of algorithm 'fedmsa' of task 'quadratic'"):
        post.benchmark.records_to_verify(path, "quadratic/fedmsa")



def _names(path: Path) -> set[str]:
    with gzip.open(path, "rt") as f:
        return {json.loads(line).get("file") for line in f}


def test_a_run_stopped_by_a_signal_is_not_a_result_until_resumed(tmp_path, capsys, monkeypatch):
    """A run stopped by SIGTERM at a checkpoint is marked in its file (``stopped``): the table leaves it out and
    --archive skips it (a diverged run, which also ends early, is a result); --resume drops the mark."""
    from fednest_mpi.io.h5 import read_run

    path = _bench(tmp_path)
    cut = tmp_path / "runs" / "quadratic" / "lfednest_lr0.1_s100.h5"
    cfg = make_config(seed=100, algorithm={"name": "lfednest", "outer_lr": 0.1, "outer_iterations": 12})
    data = {**json.loads(cfg.to_json()), "run": {"output": str(cut), "progress": "never"}}
    (tmp_path / "cut.json").write_text(json.dumps(data))
    monkeypatch.setenv("FEDNEST_MPI_INJECT_FAULT", "0:4:term")
    assert cli.main(["run", str(tmp_path / "cut.json"), "-q"]) == 0
    monkeypatch.delenv("FEDNEST_MPI_INJECT_FAULT")
    assert "stopped by SIGTERM after iteration 4" in capsys.readouterr().err
    assert json.loads(read_run(cut)[0]["stopped"])["iteration"] == 4
    assert cli.main(["report", str(cut)]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "--resume (interrupted, not ended): lfednest_lr0.1_s100 (by SIGTERM after iteration 4)" in printed
    (task,) = post.benchmark.read_benchmark_file(path)
    assert cut.name not in {run.path.name for run in post.benchmark.task_runs(task)}
    assert cli.main(["report", "--benchmark", str(path), "--archive"]) == 0
    err = capsys.readouterr().err
    assert f"{cut.name}: stopped by SIGTERM after iteration 4: an interrupted run, not a result" in err
    records_file = tmp_path / "records" / "quadratic" / "lfednest.jsonl.gz"
    assert cut.name not in _names(records_file)
    assert cli.main(["run", str(tmp_path / "cut.json"), "-q", "--resume"]) == 0
    attrs, data = read_run(cut)
    assert "stopped" not in attrs and data["iteration"][-1] == 12
    assert cut.name in {run.path.name for run in post.benchmark.task_runs(task)}
    assert cli.main(["report", "--benchmark", str(path), "--archive"]) == 0
    assert "lfednest.jsonl.gz: 10 runs (1 new or changed)" in capsys.readouterr().out
    assert cut.name in _names(records_file)


def test_a_file_that_refuses_the_stopped_mark_is_a_warning_not_a_failed_stop(tmp_path, capfd, monkeypatch):
    from fednest_mpi.io import h5

    def full_disk(*args):
        raise OSError(28, "No space left on device")

    cfg = make_config(algorithm={"outer_iterations": 8})
    data = {**json.loads(cfg.to_json()), "run": {"output": str(tmp_path / "o.h5"), "progress": "never"}}
    (tmp_path / "c.json").write_text(json.dumps(data))
    monkeypatch.setattr(h5, "mark_stopped", full_disk)
    monkeypatch.setenv("FEDNEST_MPI_INJECT_FAULT", "0:3:term")
    assert cli.main(["run", str(tmp_path / "c.json")]) == 0
    err = capfd.readouterr().err
    assert "could not mark" in err and "No space left on device" in err
    assert "stopped by SIGTERM after iteration 3" in err
