"""Messages that are true (issue 26): every command, flag and config field that a message or help text of
the package tells the user to use exists. Collected from the package's source text, so a new message is
checked without editing a list."""

import argparse
import ast
import dataclasses
import re
from pathlib import Path

import pytest

from fednest_mpi import cli, config

SRC = Path(cli.__file__).resolve().parents[1]  # the package


def _strings(path: Path) -> list[str]:
    """The string literals of a module (the text of messages and help), docstrings left out; an f-string's
    replacement fields become ``{}``."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            out.append("".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            out.append(node.value)
    return out


TEXT = "\n".join(t for p in sorted(SRC.rglob("*.py")) for t in _strings(p))
# a command line the text tells the user to type: in backticks, or on a line of its own (help examples)
COMMAND = re.compile(r"(?:`|^\s*(?:\S*mpiexec -n \d+ )?)fednest-mpi ([a-z][a-z-]*(?: [a-z][a-z-]*)?)([^`\n#]*)", re.M)
FIELD = re.compile(r"(?<!/)\b(problem|algorithm|run|federation)\.([a-z_]+)\b")


def _subcommands(parser: argparse.ArgumentParser, prefix=()) -> dict[tuple[str, ...], argparse.ArgumentParser]:
    out = {prefix: parser}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out.update(_subcommands(sub, (*prefix, name)))
    return out


PARSERS = _subcommands(cli._parser())
SUGGESTED = sorted({(m.group(1), m.group(2)) for m in COMMAND.finditer(TEXT)})


def test_messages_suggest_commands_at_all():  # the collection itself works
    assert len(SUGGESTED) >= 5 and any(words == "download" and "--dest" in rest for words, rest in SUGGESTED)


@pytest.mark.parametrize("words,rest", SUGGESTED, ids=[f"{w}{r}"[:60] for w, r in SUGGESTED])
def test_every_suggested_command_and_flag_exists(words, rest):
    parts = tuple(words.split())
    parser = PARSERS.get(parts) or PARSERS.get(parts[:1])
    assert parser is not None, f"`fednest-mpi {words}` is suggested but is no command"
    flags = {s for a in parser._actions for s in a.option_strings}
    for flag in re.findall(r"(?<![\w-])(--?[a-z][a-z-]*)", rest):
        assert flag in flags, f"`fednest-mpi {words}{rest}` suggests {flag}, which `{' '.join(parts)}` lacks"


def _fields():
    known = {"run": config.RunSection, "federation": config.FederationConfig}
    names = {s: {f.name for f in dataclasses.fields(c)} for s, c in known.items()}
    names["problem"] = {f.name for s in config.PROBLEMS.values() for f in dataclasses.fields(s.params)}
    names["algorithm"] = {f.name for s in config.ALGORITHMS.values() for f in dataclasses.fields(s.params)}
    return names


FIELDS = _fields()
MENTIONED = sorted({(m.group(1), m.group(2)) for m in FIELD.finditer(TEXT)})


@pytest.mark.parametrize("section,name", MENTIONED, ids=[f"{s}.{n}" for s, n in MENTIONED])
def test_every_field_a_message_names_exists(section, name):
    assert name in FIELDS[section], f"the package names the config field {section}.{name}, which does not exist"
