"""UCI Adult loading: the real files in shared/data, small files made here, damaged files."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch
from shared_data import DATA as SHARED
from shared_data import need

from fednest_mpi.data import load_adult
from fednest_mpi.data.adult import CATEGORICAL, NUMERIC, RACES
from fednest_mpi.errors import DataError

TRAIN = """\
39, State-gov, 77516, Bachelors, 13, Never-married, Adm-clerical, Not-in-family, White, Male, 2174, 0, 40, United-States, <=50K
50, ?, 83311, Bachelors, 13, Married-civ-spouse, Exec-managerial, Husband, Black, Male, 0, 0, 13, ?, >50K
38, Private, 215646, HS-grad, 9, Divorced, ?, Not-in-family, Other, Female, 0, 0, 40, Cuba, <=50K
"""
TEST = """\
|1x3 Cross validator
25, Private, 226802, 11th, 7, Never-married, Machine-op-inspct, Own-child, Asian-Pac-Islander, Female, 0, 0, 40, Peru, >50K.
28, ?, 336951, Assoc-acdm, 12, Married-civ-spouse, Protective-serv, Husband, White, Male, 0, 0, 40, United-States, <=50K.

"""


@pytest.fixture(scope="module")
def adult():
    need(SHARED / "adult")
    return load_adult(SHARED / "adult")


def write_files(folder: Path, train: str = TRAIN, test: str = TEST, gz: bool = True) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in (("adult.data", train), ("adult.test", test)):
        if gz:
            (folder / f"{name}.gz").write_bytes(gzip.compress(text.encode()))
        else:
            (folder / name).write_text(text)
    return folder


def column(data, x, name):
    return x[:, data.feature_names.index(name)]


def test_real_adult_rows_labels_and_groups(adult):
    assert adult.train_x.shape[0] == 32561 and adult.test_x.shape[0] == 16281
    assert adult.train_x.shape[1] == adult.test_x.shape[1] == len(adult.feature_names)
    assert adult.train_x.dtype == torch.float32 and adult.train_y.dtype == torch.int64
    assert not torch.isnan(adult.train_x).any() and not torch.isnan(adult.test_x).any()
    assert 0.23 < float(adult.train_y.float().mean()) < 0.25  # 23.93% >50K (adult.names)
    assert 0.22 < float(adult.test_y.float().mean()) < 0.25
    assert adult.train_sex.bincount().tolist() == [10771, 21790]  # Female, Male
    assert adult.train_race.bincount().tolist() == [27816, 1039, 311, 271, 3124]  # in RACES order
    assert torch.equal(column(adult, adult.test_x, "sex=Male").long(), adult.test_sex)
    assert torch.equal(column(adult, adult.train_x, "race=Black").long(), (adult.train_race == 4).long())


def test_real_adult_features_are_standardised_and_one_hot(adult):
    numeric = adult.train_x[:, : len(NUMERIC)].double()
    assert adult.feature_names[: len(NUMERIC)] == NUMERIC
    assert torch.allclose(numeric.mean(0), torch.zeros(len(NUMERIC), dtype=torch.float64), atol=1e-5)
    assert torch.allclose(numeric.std(0), torch.ones(len(NUMERIC), dtype=torch.float64), atol=1e-3)
    one_hot = adult.train_x[:, len(NUMERIC) :]
    assert set(one_hot.unique().tolist()) == {0.0, 1.0}
    assert torch.all(one_hot.sum(1) == len(CATEGORICAL))  # one category per column in train
    assert "workclass=missing" in adult.feature_names and "native-country=missing" in adult.feature_names


@pytest.mark.parametrize("gz", [True, False])
def test_small_files(tmp_path, gz):
    data = load_adult(write_files(tmp_path / "adult", gz=gz))
    assert data.train_y.tolist() == [0, 1, 0] and data.test_y.tolist() == [1, 0]
    assert data.train_sex.tolist() == [1, 1, 0] and data.test_sex.tolist() == [0, 1]
    assert [RACES[r] for r in data.test_race] == ["Asian-Pac-Islander", "White"]
    # categories come from the train file, sorted; '?' is the category "missing"
    workclass = [n for n in data.feature_names if n.startswith("workclass=")]
    assert workclass == ["workclass=Private", "workclass=State-gov", "workclass=missing"]
    assert column(data, data.test_x, "workclass=missing").tolist() == [0.0, 1.0]
    # a test value unseen in train (Peru) encodes as an all-zero block
    country = [data.feature_names.index(n) for n in data.feature_names if n.startswith("native-country=")]
    assert data.test_x[0, country].sum() == 0 and data.test_x[1, country].sum() == 1
    age = (np.array([25.0, 28.0]) - np.mean([39, 50, 38])) / np.std([39, 50, 38])
    assert np.allclose(column(data, data.test_x, "age").numpy(), age, atol=1e-6)


@pytest.mark.parametrize(
    "name, train, test, pattern",
    [
        (
            "adult.data",
            TRAIN.replace("40, Cuba, ", "40, "),
            TEST,
            "line 3: expected 15 comma-separated fields, found 14",
        ),
        ("adult.test", TRAIN, TEST.replace(">50K.", "maybe."), "line 2: income 'maybe' is neither"),
        ("adult.data", TRAIN.replace("39,", "old,"), TEST, "data row 1: age is 'old', not a number"),
        ("adult.test", TRAIN, TEST.replace("Female", "F"), "sex value 'F' is not one of Female, Male"),
        ("adult.data", "", TEST, "holds no data rows"),
    ],
)
def test_malformed_rows(tmp_path, name, train, test, pattern):
    folder = write_files(tmp_path / "adult", train, test)
    with pytest.raises(DataError, match=pattern) as info:
        load_adult(folder)
    assert name in str(info.value)


def test_missing_or_broken_files(tmp_path):
    folder = write_files(tmp_path / "adult")
    (folder / "adult.test.gz").unlink()
    with pytest.raises(DataError, match=r"Adult file '.*adult.test.gz' not found .*download adult --dest"):
        load_adult(folder)
    (folder / "adult.test.gz").write_text(TEST)
    with pytest.raises(DataError, match="adult.test.gz' is not a valid gzip file"):
        load_adult(folder)
