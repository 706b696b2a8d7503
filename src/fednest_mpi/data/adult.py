"""The UCI Adult ("Census Income") data set from ``adult.data`` and ``adult.test`` (``.gz`` or raw).

:func:`load_adult` parses both files (the test file's ``|1x3 Cross validator`` first line is
skipped, and the '.' ending its labels is dropped) into an :class:`AdultData`:

* features: the 6 numeric columns (``fnlwgt``, the census sampling weight, included),
  standardised with the train mean and std, then a one-hot block for each of the 8 categorical
  columns (``sex`` and ``race`` included), in the column order of ``adult.names``. Each block's
  categories are the values seen in the TRAIN file, sorted; a '?' (missing value) is its own
  category ``missing``, and a test value unseen in train encodes as an all-zero block;
* label: 1 for income ``>50K``, 0 for ``<=50K``;
* groups for fairness: sex (1 = Male, 0 = Female) and race (index into :data:`RACES`).

A missing file or a row that is not Adult's 15 comma-separated fields raises
:class:`~fednest_mpi.errors.DataError` naming the file and line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fednest_mpi.data.files import check_md5sums, find_file, read_bytes
from fednest_mpi.errors import DataError

COLUMNS = (
    "age",
    "workclass",
    "fnlwgt",
    "education",
    "education-num",
    "marital-status",
    "occupation",
    "relationship",
    "race",
    "sex",
    "capital-gain",
    "capital-loss",
    "hours-per-week",
    "native-country",
    "income",
)
NUMERIC = ("age", "fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week")
CATEGORICAL = tuple(c for c in COLUMNS[:-1] if c not in NUMERIC)
RACES = ("White", "Asian-Pac-Islander", "Amer-Indian-Eskimo", "Other", "Black")  # adult.names order
SEXES = ("Female", "Male")  # index = sex code
INCOMES = ("<=50K", ">50K")  # index = label
MISSING = "missing"
FILES = {"train": "adult.data", "test": "adult.test"}


@dataclass(frozen=True)
class AdultData:
    """Features (float32), labels, sex and race codes (int64) of both splits, and feature names."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    train_sex: torch.Tensor
    train_race: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    test_sex: torch.Tensor
    test_race: torch.Tensor
    feature_names: tuple[str, ...]


def _read_columns(path: Path) -> dict[str, tuple[str, ...]]:
    rows = []
    for number, line in enumerate(read_bytes(path).decode("latin-1").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("|"):
            continue
        fields = list(map(str.strip, line.split(",")))
        if len(fields) != len(COLUMNS):
            raise DataError(
                f"'{path}' line {number}: expected {len(COLUMNS)} comma-separated fields, "
                f"found {len(fields)}; is it the UCI Adult file? download it again"
            )
        fields[-1] = fields[-1].rstrip(".")
        if fields[-1] not in INCOMES:
            raise DataError(
                f"'{path}' line {number}: income {fields[-1]!r} is neither "
                f"{' nor '.join(INCOMES)}; download the file again"
            )
        rows.append(fields)
    if not rows:
        raise DataError(f"'{path}' holds no data rows; download the file again")
    return {name: tuple(MISSING if v == "?" else v for v in values) for name, values in zip(COLUMNS, zip(*rows))}


def _codes(values: tuple[str, ...], names: tuple[str, ...], column: str, path: Path) -> np.ndarray:
    index = {v: k for k, v in enumerate(names)}
    unknown = next((v for v in values if v not in index), None)
    if unknown is not None:
        raise DataError(f"'{path}': {column} value {unknown!r} is not one of {', '.join(names)}")
    return np.array([index[v] for v in values], dtype=np.int64)


def _numeric(columns: dict, path: Path) -> np.ndarray:
    out = np.empty((len(columns[NUMERIC[0]]), len(NUMERIC)))
    for j, name in enumerate(NUMERIC):
        try:
            out[:, j] = np.array(columns[name], dtype=np.float64)
        except ValueError:
            row, value = next((i, v) for i, v in enumerate(columns[name]) if not _is_number(v))
            raise DataError(f"'{path}' data row {row + 1}: {name} is {value!r}, not a number") from None
    return out


def _is_number(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


def _one_hot(values: tuple[str, ...], categories: list[str]) -> np.ndarray:
    index = {v: k for k, v in enumerate(categories)}
    codes = np.array([index.get(v, -1) for v in values])
    return (codes[:, None] == np.arange(len(categories))).astype(np.float32)


def load_adult(data_dir: str | Path, verify: bool = True) -> AdultData:
    """Load Adult's train and test files from ``data_dir`` (see the module docstring).

    With ``verify`` the files are checked against the folder's ``MD5SUMS`` where it lists them.
    """
    data_dir = Path(data_dir)
    paths = {split: find_file(data_dir, name, "adult") for split, name in FILES.items()}
    if verify:
        check_md5sums(data_dir, list(paths.values()))
    columns = {split: _read_columns(path) for split, path in paths.items()}
    numeric = {split: _numeric(columns[split], path) for split, path in paths.items()}
    mean, std = numeric["train"].mean(axis=0), numeric["train"].std(axis=0)
    std[std == 0] = 1.0
    categories = {name: sorted(set(columns["train"][name])) for name in CATEGORICAL}
    fields = {}
    for split, path in paths.items():
        cols = columns[split]
        blocks = [((numeric[split] - mean) / std).astype(np.float32)]
        blocks += [_one_hot(cols[name], categories[name]) for name in CATEGORICAL]
        fields[f"{split}_x"] = torch.from_numpy(np.concatenate(blocks, axis=1))
        fields[f"{split}_y"] = torch.from_numpy(_codes(cols["income"], INCOMES, "income", path))
        fields[f"{split}_sex"] = torch.from_numpy(_codes(cols["sex"], SEXES, "sex", path))
        fields[f"{split}_race"] = torch.from_numpy(_codes(cols["race"], RACES, "race", path))
    names = NUMERIC + tuple(f"{name}={cat}" for name in CATEGORICAL for cat in categories[name])
    return AdultData(feature_names=names, **fields)
