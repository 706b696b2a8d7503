"""No function in src/ is longer than LIMIT lines: one job per function, steps a reader takes in at a glance.

A function's length is the lines of its body from the first statement after the docstring to its last line
(blank and comment lines inside included; the signature, decorators and docstring not), read from the source
with ``ast``; a nested function counts for itself and for the function around it. The functions of ALLOWED
are longer and not split yet: each may not grow past its recorded length, and an entry is removed as soon as
its function is split or gone (the test says so), so the list only shrinks."""

import ast
from pathlib import Path

import fednest_mpi

SRC = Path(fednest_mpi.__file__).resolve().parent
LIMIT = 40

#: path (below src/fednest_mpi) : qualified name -> its length now, the most it may have until it is split
ALLOWED = {
    "federation.py:Federation._reduce": 43,
}


def _body_length(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    body = node.body
    first = body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        body = body[1:]
    if not body:  # a docstring alone
        return 0
    return (node.end_lineno or body[-1].lineno) - body[0].lineno + 1


def _lengths(tree: ast.AST, prefix: str = ""):
    """(qualified name, length) of every function in ``tree``, methods and nested functions included."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + node.name, _body_length(node)
            yield from _lengths(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from _lengths(node, f"{prefix}{node.name}.")
        else:
            yield from _lengths(node, prefix)


def _all_lengths() -> dict[str, int]:
    found = {}
    for path in sorted(SRC.rglob("*.py")):
        for name, length in _lengths(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            found[f"{path.relative_to(SRC).as_posix()}:{name}"] = length
    return found


def test_no_function_is_longer_than_the_limit():
    found = _all_lengths()
    too_long = {f: n for f, n in found.items() if n > LIMIT and f not in ALLOWED}
    assert not too_long, (
        f"functions of more than {LIMIT} lines (split each into steps of one job each, with names that explain "
        f"them): {too_long}"
    )
    grown = {f: (found[f], n) for f, n in ALLOWED.items() if f in found and found[f] > n}
    assert not grown, f"allow-listed functions grew (now, recorded); split them instead: {grown}"


def test_the_allow_list_only_shrinks():
    found = _all_lengths()
    done = sorted(f for f in ALLOWED if found.get(f, 0) <= LIMIT)
    assert not done, f"these functions are split or gone: remove them from ALLOWED in {Path(__file__).name}: {done}"


def test_the_count_sees_a_long_function_a_method_and_a_nested_one():
    lines = "\n".join(f"    x{i} = {i}" for i in range(LIMIT + 1))
    source = f'def f():\n    """Doc."""\n{lines}\n\n\nclass C:\n    def m(self):\n{lines.replace("    ", "        ")}\n'
    source += f"\n\ndef outer():\n    def inner():\n{lines.replace('    ', '        ')}\n    return inner\n"
    lengths = dict(_lengths(ast.parse(source)))
    assert lengths["f"] == LIMIT + 1 and lengths["C.m"] == LIMIT + 1 and lengths["outer.inner"] == LIMIT + 1
    assert lengths["outer"] == LIMIT + 3  # the nested function counts inside the one around it
