"""The values of site and sweep files: checks that name the file and the field, TOML spelling, time limits."""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fednest_mpi.config import flatten_config
from fednest_mpi.errors import UsageError
from fednest_mpi.pathkind import not_a_file
from fednest_mpi.text import did_you_mean


def _check_keys(where: str, data: Mapping, known: Sequence[str], what: str = "field") -> None:
    for key in data:
        if key not in known:
            raise UsageError(
                f"{where}{key}: unknown {what}" + did_you_mean(key, known) + f"; known: {', '.join(known)}"
            )


def _read_toml(path: str | Path, kind: str) -> dict:
    p = Path(path)
    instead = not_a_file(p)  # missing, a folder, a FIFO (the read would block), a name too long, a link loop
    if instead is not None:
        raise UsageError(f"{kind} file {str(p)!r} {instead}; see jobs/{kind}s/ of the repository for examples")
    try:
        return tomllib.loads(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise UsageError(f"{kind} file {str(p)!r} is not UTF-8 text (at byte {exc.start}); save it as UTF-8") from None
    except OSError as exc:
        raise UsageError(f"{kind} file {str(p)!r} cannot be read ({exc.strerror or exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{kind} file {str(p)!r} is not valid TOML: {exc}") from None


def _string(where: str, value: Any, *, empty: bool = True) -> str:
    if not isinstance(value, str) or (not empty and not value):
        raise UsageError(f"{where}: expected a {'non-empty ' if not empty else ''}string, got {value!r}")
    if "\n" in value or "\r" in value:
        raise UsageError(f"{where}: must be one line, got {value!r}")
    return value


def _strings(where: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise UsageError(f"{where}: expected a list of strings, got {value!r}")
    return tuple(_string(f"{where}[{i}]", v, empty=False) for i, v in enumerate(value))


def _int(where: str, value: Any, low: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise UsageError(f"{where}: expected an integer, got {value!r}")
    if value < low:
        raise UsageError(f"{where}: must be >= {low}, got {value}")
    return value


def _word(where: str, value: Any) -> str:
    """A value that goes on an ``#SBATCH`` line: no spaces, quotes or newlines."""
    value = _string(where, value)
    if re.search(r"[\s'\"\\]", value):
        raise UsageError(f"{where}: {value!r} must not contain spaces, quotes or backslashes")
    return value


def _flatten(where: str, table: Any) -> dict[str, Any]:
    """``{"algorithm": {"name": [...]}}`` -> ``{"algorithm.name": [...]}`` (TOML dotted keys)."""
    if not isinstance(table, dict):
        raise UsageError(f"{where}: expected a table, got {table!r}")
    return flatten_config(table, hashable=False)  # lists stay lists: they are the swept values


def shell_expandable(text: str) -> str:
    """Double-quote ``text`` for bash, keeping ``$VAR``/``${VAR}`` expansion (a leading ``~`` becomes ``$HOME``)."""
    if text == "~" or text.startswith("~/"):
        text = "$HOME" + text[1:]
    return '"' + re.sub(r'(["\\`])', r"\\\1", text) + '"'


def toml_value(value: Any) -> str:
    """``value`` as a TOML literal, the form ``--set section.field=VALUE`` parses."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        out = []
        for ch in value:
            if ch in '"\\':
                out.append("\\" + ch)
            elif ord(ch) < 0x20 or ord(ch) == 0x7F:
                out.append(f"\\u{ord(ch):04x}")
            else:
                out.append(ch)
        return '"' + "".join(out) + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise UsageError(f"cannot pass {value!r} as a config value; use a number, string, boolean or list")


def _label(value: Any) -> str:
    text = toml_value(value).strip('"') if not isinstance(value, str) else value
    return re.sub(r"[^A-Za-z0-9._+-]+", "-", text).strip("-") or "x"


def parse_time(text: str) -> int:
    """SLURM time limit (``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``) in seconds."""
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text.strip())
    if not m:
        raise ValueError(text)
    days, a, b, c = m.groups()
    a, b, c = int(a), int(b) if b else None, int(c) if c else None
    if days is not None:  # D-HH[:MM[:SS]]
        return int(days) * 86400 + a * 3600 + (b or 0) * 60 + (c or 0)
    if c is not None:  # HH:MM:SS (c is set only with b)
        return a * 3600 + (b or 0) * 60 + c
    if b is not None:  # MM:SS
        return a * 60 + b
    return a * 60  # MM
