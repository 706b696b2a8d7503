"""Where data files live, and reading them safely.

* :func:`resolve_data_dir` turns the user's ``problem.data_dir`` (or the ``FEDNEST_DATA`` environment
  variable) into the folder of one data set. Either may name the data set's own folder or a root
  holding one subfolder per data set (``mnist/``, ``fashion-mnist/``, ``adult/``), the layout
  that :func:`fednest_mpi.data.download.download` writes.
* :func:`find_file` finds ``NAME.gz`` or ``NAME`` in such a folder.
* :func:`read_bytes` returns a file's content, gunzipped when its name ends in ``.gz``.
* :func:`check_md5sums` compares files with the folder's ``MD5SUMS`` list, when there is one.

Every problem a user can fix (missing folder or file, broken gzip, checksum mismatch) raises
:class:`~fednest_mpi.errors.DataError` with a message naming the path and the fix.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import zlib
from pathlib import Path

from fednest_mpi.config import DATASETS
from fednest_mpi.errors import DataError
from fednest_mpi.pathkind import not_a_file

ENV_VAR = "FEDNEST_DATA"
MD5SUMS = "MD5SUMS"


def check_dataset(dataset: str) -> str:
    """Return ``dataset`` if it is a known data set name, else raise :class:`DataError`."""
    if dataset not in DATASETS:
        raise DataError(f"unknown data set {dataset!r}; choose one of {', '.join(DATASETS)}")
    return dataset


def resolve_data_dir(explicit: str | os.PathLike | None, dataset: str) -> Path:
    """The folder holding ``dataset``'s files: from ``explicit``, else from ``$FEDNEST_DATA``.

    When the chosen folder has a subfolder named for the data set (``mnist``, ``fashion-mnist``,
    ``adult``) that subfolder is returned, else the folder itself.
    """
    check_dataset(dataset)
    source = "problem.data_dir" if explicit else ENV_VAR
    base = explicit or os.environ.get(ENV_VAR)
    if not base:
        raise DataError(
            f"no data directory for {dataset}: set problem.data_dir or the environment variable {ENV_VAR} "
            f"(a folder with {', '.join(d.folder + '/' for d in DATASETS.values())} subfolders), "
            f"or run `fednest-mpi download {dataset} --dest DIR` and point {ENV_VAR} at DIR"
        )
    root = Path(base).expanduser()
    if not os.path.isdir(root):  # never raises (a name too long, a loop): not_a_file says what is wrong
        what = not_a_file(root) or "is a file, not a folder"
        raise DataError(
            f"data directory '{root}' (from {source}) {what}; "
            f"fix {source}, or run `fednest-mpi download {dataset} --dest DIR` and point {source} at DIR"
        )
    sub = root / DATASETS[dataset].folder
    return sub if os.path.isdir(sub) else root


def find_file(data_dir: Path, name: str, dataset: str) -> Path:
    """``data_dir/NAME.gz`` if it is a file, else ``data_dir/NAME``; :class:`DataError` if neither, naming
    what is there instead (a folder, a FIFO, a device, a symbolic link loop) when something is."""
    data_dir = Path(data_dir)
    candidates = (data_dir / f"{name}.gz", data_dir / name)
    for candidate in candidates:
        if not_a_file(candidate) is None:
            return candidate
    root = data_dir.parent if data_dir.name == DATASETS[dataset].folder else data_dir
    for candidate in candidates:
        if os.path.lexists(candidate):
            raise DataError(
                f"{DATASETS[dataset].title} file '{candidate}' {not_a_file(candidate)}; replace it with the data "
                f"file, or run `fednest-mpi download {dataset} --dest {root}`"
            )
    sub = data_dir / DATASETS[dataset].folder  # where resolve_data_dir looked first: a link to nothing, a loop, a file
    if os.path.lexists(sub) and not os.path.isdir(sub):
        raise DataError(
            f"{DATASETS[dataset].title} folder '{sub}' {not_a_file(sub) or 'is a file, not a folder'}, and "
            f"'{data_dir}' itself holds no {name}.gz; replace it with the folder of the data files, or run "
            f"`fednest-mpi download {dataset} --dest {data_dir}`"
        )
    raise DataError(
        f"{DATASETS[dataset].title} file '{data_dir / name}.gz' not found in data directory '{data_dir}' "
        f"(looked for {name}.gz or {name}); set {ENV_VAR} or problem.data_dir, "
        f"or run `fednest-mpi download {dataset} --dest {root}`"
    )


def read_bytes(path: Path) -> bytes:
    """The content of ``path``, decompressed when its name ends in ``.gz``."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DataError(f"cannot read data file '{path}': {exc.strerror or exc}") from None
    if not raw:  # gzip reads an empty file as an empty stream
        raise DataError(f"data file '{path}' is empty (0 bytes); delete it and download it again")
    if path.suffix != ".gz":
        return raw
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(
            f"data file '{path}' is not a valid gzip file ({exc}); delete it and download it again"
        ) from None


def md5(data: bytes) -> str:
    """Hex MD5 digest of ``data``."""
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def read_md5sums(data_dir: Path) -> dict[str, str]:
    """``{file name: md5}`` from ``data_dir/MD5SUMS`` (``md5sum`` output format); {} if absent."""
    path = Path(data_dir) / MD5SUMS
    if not os.path.isfile(path) or os.path.getsize(path) == 0:  # none, or an empty list
        return {}
    sums = {}
    for number, line in enumerate(read_bytes(path).decode("utf-8", "replace").splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 2 or len(parts[0]) != 32:
            raise DataError(f"'{path}' line {number} is not `MD5  FILENAME`: {line!r}; fix or delete the file")
        sums[parts[1].lstrip("*")] = parts[0].lower()
    return sums


def write_md5sums(data_dir: Path, names: list[str]) -> None:
    """Write ``data_dir/MD5SUMS`` listing the md5 of each named file as stored."""
    data_dir = Path(data_dir)
    lines = [f"{md5((data_dir / n).read_bytes())}  {n}\n" for n in names]
    (data_dir / MD5SUMS).write_text("".join(lines))


def check_md5sums(data_dir: Path, paths: list[Path]) -> None:
    """Compare each file with its entry in ``data_dir/MD5SUMS``; files it does not list pass."""
    sums = read_md5sums(data_dir)
    for path in paths:
        expected = sums.get(path.name)
        if expected is None:
            continue
        try:
            actual = md5(path.read_bytes())
        except OSError as exc:
            raise DataError(f"cannot read data file '{path}': {exc.strerror or exc}") from None
        if actual != expected:
            raise DataError(
                f"data file '{path}' has md5 {actual} but {Path(data_dir) / MD5SUMS} says {expected}: "
                f"the file is damaged or was replaced; download it again (a file replaced on purpose: delete its "
                f"line from {Path(data_dir) / MD5SUMS}; from Python: load_mnist(..., verify=False))"
            )
