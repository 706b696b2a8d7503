"""Words for figures: config fields, their values, problems and columns as a reader of a paper reads them
("FedNest", "non-iid (shards)", "clients per round = 50", "accuracy on the 10k test set [%]").

Every function takes what a run file holds (dotted config names, config values, the column attributes
``description`` and ``units``) and falls back to a plain rendering of it, so runs of plugins and of
fields added later get readable, if plainer, labels. No matplotlib here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = ["ALGORITHM_LABELS", "axis_label", "field_label", "group_label", "problem_label", "value_label"]

#: ``algorithm.name`` -> the name the papers use (FedNest, Tarzanagh et al. 2022, Table 2 and Fig. 2;
#: FedBiO / FedBiOAcc, Li, Huang & Huang; FedAvg, McMahan et al.; FedSVRG; SimFBO / ShroFBO, FedMSA, FedMBO).
ALGORITHM_LABELS = {
    "fednest": "FedNest",
    "fednest_sgd": "FedNest-SGD",
    "lfednest": "LFedNest",
    "lfednest_svrg": "LFedNest-SVRG",
    "lfednest_nonalt": "LFedNest (non-alternating)",
    "fedavg_s": "FedAvg-S",
    "fedbio": "FedBiO",
    "fedbioacc": "FedBiOAcc",
    "fedavg": "FedAvg",
    "fedsvrg": "FedSVRG",
    "simfbo": "SimFBO",
    "shrofbo": "ShroFBO",
    "fedmsa": "FedMSA",
    "fedmbo": "FedMBO",
}

_PROBLEM_LABELS = {
    "quadratic": "Quadratic bilevel problem",
    "hyper_representation": "Hyper-representation",
    "loss_tuning": "Loss-function tuning",
    "minimax": "Federated minimax",
    "compositional": "Federated compositional",
    "synthetic": "Synthetic (FedProx data)",
    "fairness": "Fair classification",
    "hyper_cleaning": "Data hyper-cleaning",
}

_DATASET_LABELS = {"mnist": "MNIST", "fashion": "Fashion-MNIST", "adult": "UCI Adult"}

_FIELD_LABELS = {
    "algorithm.name": "algorithm",
    "problem.name": "problem",
    "mpi_size": "MPI ranks",
    "algorithm.outer_lr": "outer step size",
    "algorithm.inner_lr": "inner step size",
    "algorithm.outer_local_steps": "\u03c4",  # tau, FedOut local steps (paper Fig. 2c)
    "algorithm.clients_per_round": "clients per round",
    "algorithm.neumann_steps": "N",
    "algorithm.inner_rounds": "T",
}

_VALUE_LABELS: dict[str, dict] = {
    "problem.partition": {"iid": "iid", "shards": "non-iid (shards)", "dirichlet": "non-iid (Dirichlet)"},
    "problem.tune_loss": {True: "tuned loss", False: "cross-entropy (untuned)"},
    "problem.dataset": _DATASET_LABELS,
}

_AXIS_LABELS = {
    "iteration": "outer iteration",
    "comm_rounds": "communication rounds",
    "comm_bytes": "communicated bytes per rank [B]",
    "comm_seconds": "time in Allreduce [s]",
    "wall_time": "wall time [s]",
}


def algorithm_label(name: str) -> str:
    """``fednest`` -> ``FedNest``; a plugin ``module:Class`` -> ``Class``; else the name."""
    return ALGORITHM_LABELS.get(name, name.rpartition(":")[2] or name)


def field_label(field: str) -> str:
    """A dotted config field as words: ``algorithm.clients_per_round`` -> ``clients per round``."""
    return _FIELD_LABELS.get(field, field.rpartition(".")[2].replace("_", " "))


def _number(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def value_label(field: str, value) -> str:
    """One config value as a legend entry reads it: ``FedNest``, ``non-iid (shards)``, ``seed 2``,
    ``outer step size = 0.05``, ``dropout: on``, ``ihgp mode: truncated``."""
    if field == "algorithm.name" and isinstance(value, str):
        return algorithm_label(value)
    if field == "problem.name" and isinstance(value, str):
        return _PROBLEM_LABELS.get(value, value)
    known = _VALUE_LABELS.get(field, {})
    if isinstance(value, (str, bool)) and value in known:
        return known[value]
    name = field_label(field)
    if value is None:
        return f"{name}: -"
    if isinstance(value, bool):
        return f"{name}: {'on' if value else 'off'}"
    if isinstance(value, (int, float)):
        return f"seed {value}" if field == "seed" else f"{name} = {_number(value)}"
    return f"{name}: {value}"


def group_label(fields, values, labels: Mapping[str, str] | None = None) -> str:
    """The legend entry of a group: its values' labels joined by commas; ``labels`` maps a group's plain
    label (``"fednest, iid"``, the ``report``'s) or one value (``"fednest"``) to the text to show instead."""
    labels = labels or {}
    plain = ", ".join(_number(v) if v is not None else "-" for v in values)
    if plain in labels:
        return labels[plain]
    return ", ".join(
        labels.get(str(v), value_label(f, v)) if v is not None else value_label(f, v) for f, v in zip(fields, values)
    )


def problem_label(config: Mapping) -> str:
    """``Hyper-representation, MNIST`` from a run's flattened config (problem name and data set)."""
    name = str(config.get("problem.name", "?"))
    text = _PROBLEM_LABELS.get(name, name.rpartition(":")[2].replace("_", " "))
    dataset = config.get("problem.dataset", "adult" if name == "fairness" else None)
    if isinstance(dataset, str) and dataset:
        text += f", {_DATASET_LABELS.get(dataset, dataset)}"
    return text


def axis_label(column: str, info: Mapping | None = None) -> str:
    """An axis label from a column's stored ``description`` and ``units`` (docs/hdf5.md): the
    description up to its first parenthetical remark, ``||.||`` as norms, ``^2`` as a superscript, the unit in brackets
    (none for ``1``); the known x-axes by their short names; else the column name."""
    if column in _AXIS_LABELS:
        return _AXIS_LABELS[column]
    info = info or {}
    text = str(info.get("description") or column)
    text = text.split(" (", 1)[0].strip().rstrip(",;:") or column
    text = text.replace("||", "\u2016").replace("grad ", "\u2207").replace("^2", "\u00b2")
    if re.match(r"[a-z]{2,}\b", text):
        text = text[0].upper() + text[1:]
    units = str(info.get("units") or "1")
    return text if units == "1" else f"{text} [{units}]"
