"""Downloading the data sets, for users with internet access.

:func:`download` fetches a data set's files with :mod:`urllib` into ``DEST/<folder>``
(``mnist/``, ``fashion-mnist/`` or ``adult/``, the layout :func:`~fednest_mpi.data.files.resolve_data_dir`
expects under ``FEDNEST_DATA``), each into a temporary file that is renamed into place only after
its checksum matched. Files already present with the right content are kept. Finally it writes
the folder's ``MD5SUMS`` (md5 of the files as stored), which the loaders check with ``verify``.

The checksums below are md5 of the *uncompressed* content, so they hold for any gzip encoding
of the same data (mirrors and distributions recompress the ``.gz`` files).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from fednest_mpi.config import DATASETS
from fednest_mpi.data.files import check_dataset, md5, read_bytes, write_md5sums
from fednest_mpi.errors import DataError

SOURCES = {  # data set -> (base URL, {file name: md5 of the uncompressed content})
    "mnist": (
        "https://ossci-datasets.s3.amazonaws.com/mnist/",
        {
            "train-images-idx3-ubyte.gz": "6bbc9ace898e44ae57da46a324031adb",
            "train-labels-idx1-ubyte.gz": "a25bea736e30d166cdddb491f175f624",
            "t10k-images-idx3-ubyte.gz": "2646ac647ad5339dbf082846283269ea",
            "t10k-labels-idx1-ubyte.gz": "27ae3e4e09519cfbb04c329615203637",
        },
    ),
    "fashion": (
        "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
        {
            "train-images-idx3-ubyte.gz": "f4a8712d7a061bf5bd6d2ca38dc4d50a",
            "train-labels-idx1-ubyte.gz": "9018921c3c673c538a1fc5bad174d6f9",
            "t10k-images-idx3-ubyte.gz": "8181f5470baa50b63fa0f6fddb340f0a",
            "t10k-labels-idx1-ubyte.gz": "15d484375f8d13e6eb1aabb0c3f46965",
        },
    ),
    "adult": (
        "https://archive.ics.uci.edu/ml/machine-learning-databases/adult/",
        {
            "adult.data": "5d7c39d7b8804f071cdd1f2a7c460872",
            "adult.test": "35238206dfdf7f1fe215bbb874adecdc",
        },
    ),
}


def _content_md5(path: Path) -> str | None:
    """md5 of the (uncompressed) content of ``path``; None if it cannot be read or gunzipped."""
    try:
        return md5(read_bytes(path))
    except DataError:
        return None


def _fetch(url: str, path: Path, expected: str, timeout: float) -> None:
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=".partial-", suffix=f"-{path.name}")
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as out:
            try:
                with urllib.request.urlopen(url, timeout=timeout) as response:
                    shutil.copyfileobj(response, out)
            except OSError as exc:  # urllib.error.URLError, timeouts, connection resets
                raise DataError(
                    f"could not download {url}: {getattr(exc, 'reason', exc)}; check the "
                    f"internet connection or the mirror, or copy the file into "
                    f"'{path.parent}' by hand"
                ) from None
        actual = _content_md5(tmp)
        if actual != expected:
            raise DataError(
                f"downloaded {url} but its content has md5 {actual or '(not valid gzip)'}, "
                f"expected {expected}; the transfer or the mirror is corrupt: try again "
                f"or use another mirror"
            )
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def download(dataset: str, dest_dir: str | os.PathLike, base_url: str | None = None, timeout: float = 60.0) -> Path:
    """Fetch ``dataset`` ("mnist", "fashion" or "adult") into ``dest_dir/<folder>``; return that folder.

    ``base_url`` replaces the default mirror (files are fetched from ``base_url/NAME``; any URL
    scheme urllib knows, ``file://`` included).
    """
    default_url, sums = SOURCES[check_dataset(dataset)]
    base = (base_url or default_url).rstrip("/") + "/"
    target = Path(dest_dir).expanduser() / DATASETS[dataset].folder
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(f"cannot create data directory '{target}': {exc.strerror or exc}") from None
    for name, expected in sums.items():
        if _content_md5(target / name) != expected:
            _fetch(base + name, target / name, expected, timeout)
    write_md5sums(target, list(sums))
    return target
