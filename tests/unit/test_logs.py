"""One failure, one line: a failing rank's message is one line on stderr in one write, naming the
per-rank log file that holds its traceback (fednest_mpi.logs.log_failure)."""

from fednest_mpi.logs import log_failure


def _raised():
    try:
        raise RuntimeError("deep\ninside")  # a message on two lines still prints as one
    except RuntimeError as exc:
        return exc


def test_the_traceback_goes_to_the_rank_s_log_and_one_line_names_it(tmp_path, capfd):
    line = log_failure(_raised(), "fednest-mpi: rank 1/2: run failed: RuntimeError: deep\ninside", tmp_path / "f", 1)
    err = capfd.readouterr().err
    log = tmp_path / "f" / "traceback-rank00001.log"
    assert err == line + "\n" and err.count("\n") == 1 and f"(traceback: {log})" in line
    assert "Traceback (most recent call last)" in log.read_text() and "_raised" in log.read_text()


def test_where_the_log_cannot_be_written_the_traceback_follows_the_line(tmp_path, capfd):
    (tmp_path / "f").write_text("a file where the folder would go")
    line = log_failure(_raised(), "fednest-mpi: rank 0/2: run failed", tmp_path / "f", 0)
    err = capfd.readouterr().err
    assert "traceback not written to" in line and err.startswith(line + "\n") and "Traceback (most recent" in err
