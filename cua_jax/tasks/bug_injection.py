"""Bug injection by AST mutation (as SWE-smith does): one small, syntactically valid change
to a Python module's source, located through its syntax tree and applied to the text, so that
every other line (comments and layout included) stays as it was.

    for mutation in mutations(source, path="toolz/itertoolz.py"):
        mutation.kind           # "swapped operator" | "off-by-one" | "removed branch" | "wrong constant"
        mutation.hunk           # cua_jax.tasks.code_tasks.Hunk: old lines -> new lines
        mutation.apply(source)  # the buggy source

Kinds:
    swapped operator  a comparison (< <=, > >=, == !=, in / not in, is / is not), an
                      arithmetic operator (+ -, * //, % //, << >>, & |) or a boolean
                      operator (and / or) replaced by its counterpart
    off-by-one        an integer literal n in a comparison, subscript, slice, range() call or
                      arithmetic becomes n + 1 or n - 1 (never negative)
    removed branch    an `if` without `else` disappears (a `pass` keeps its block non-empty)
    wrong constant    True / False flipped, None replaced by a value, a non-empty string
                      literal (not a docstring) emptied, a non-zero number zeroed

Pure functions over text: no file or process is touched. Docstrings, `__all__`, `__version__`
and type annotations are left alone, and a mutation whose result does not parse, or parses
to the original tree, is not proposed.
"""

from __future__ import annotations

import ast
import dataclasses
import random
import re
from collections.abc import Iterator

from cua_jax.tasks.code_tasks import Hunk

KINDS = ("swapped operator", "off-by-one", "removed branch", "wrong constant")

_COMPARE_SWAPS = {
    ast.Lt: ("<", "<="),
    ast.LtE: ("<=", "<"),
    ast.Gt: (">", ">="),
    ast.GtE: (">=", ">"),
    ast.Eq: ("==", "!="),
    ast.NotEq: ("!=", "=="),
    ast.In: ("in", "not in"),
    ast.NotIn: ("not in", "in"),
    ast.Is: ("is", "is not"),
    ast.IsNot: ("is not", "is"),
}
_BINOP_SWAPS = {
    ast.Add: ("+", "-"),
    ast.Sub: ("-", "+"),
    ast.Mult: ("*", "//"),
    ast.FloorDiv: ("//", "*"),
    ast.Mod: ("%", "//"),
    ast.LShift: ("<<", ">>"),
    ast.RShift: (">>", "<<"),
    ast.BitAnd: ("&", "|"),
    ast.BitOr: ("|", "&"),
}
_BOOL_SWAPS = {ast.And: ("and", "or"), ast.Or: ("or", "and")}
_OPERATOR_PATTERN = {"not in": r"not\s+in", "is not": r"is\s+not"}


@dataclasses.dataclass(frozen=True)
class Mutation:
    kind: str
    path: str
    line: int  # 1-based line of the change
    description: str  # e.g. "`<` -> `<=`"
    hunk: Hunk

    def apply(self, source: str) -> str:
        return apply_hunks(source, [self.hunk])

    def to_json(self) -> dict:
        return {"kind": self.kind, "path": self.path, "line": self.line, "description": self.description}


def apply_hunks(source: str, hunks: list[Hunk]) -> str:
    """`source` with each hunk's `old` lines (checked) replaced by its `new` lines."""
    lines = source.split("\n")
    for hunk in hunks:
        at = hunk.start - 1
        if tuple(lines[at : at + len(hunk.old)]) != hunk.old:
            raise ValueError(f"{hunk.path}:{hunk.start}: the hunk's old lines are not in the source")
        lines[at : at + len(hunk.old)] = hunk.new
    return "\n".join(lines)


class _Source:
    """Offsets of a module's text: (line, column) -> character index, and the edit as a hunk."""

    def __init__(self, text: str):
        self.text = text
        self.lines = text.split("\n")
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line) + 1)

    def index(self, line: int, col: int) -> int:
        # ast columns are UTF-8 byte offsets
        return self.starts[line - 1] + len(self.lines[line - 1].encode()[:col].decode(errors="ignore"))

    def hunk(self, path: str, begin: int, end: int, replacement: str) -> tuple[Hunk, str]:
        first = self.text.count("\n", 0, begin)
        last = self.text.count("\n", 0, end)
        new_text = self.text[:begin] + replacement + self.text[end:]
        old = tuple(self.lines[first : last + 1])
        new_last = last + replacement.count("\n") - self.text.count("\n", begin, end)
        new = tuple(new_text.split("\n")[first : new_last + 1])
        return Hunk(path, first + 1, old, new), new_text


def _excluded_nodes(tree: ast.AST) -> set[int]:
    """Ids of nodes never mutated: docstrings, annotations, __all__ / __version__ values."""
    excluded: set[int] = set()

    def exclude(node: ast.AST | None) -> None:
        if node is not None:
            excluded.update(id(n) for n in ast.walk(node))

    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                exclude(body[0])
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            exclude(node.returns)
            for arg in [
                *node.args.args,
                *node.args.posonlyargs,
                *node.args.kwonlyargs,
                node.args.vararg,
                node.args.kwarg,
            ]:
                if arg is not None:
                    exclude(arg.annotation)
        if isinstance(node, ast.AnnAssign):
            exclude(node.annotation)
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id.startswith("__") for t in node.targets
        ):
            exclude(node.value)
        if isinstance(node, ast.JoinedStr):
            exclude(node)  # f-strings: their parts carry no columns of their own before 3.12
    return excluded


def _operator_site(
    src: _Source, left_end: tuple[int, int], right_start: tuple[int, int], symbol: str
) -> tuple[int, int] | None:
    """The character span of operator `symbol` between two operands, or None."""
    begin, end = src.index(*left_end), src.index(*right_start)
    between = src.text[begin:end]
    pattern = _OPERATOR_PATTERN.get(symbol, re.escape(symbol))
    if symbol.isalpha() or " " in symbol:
        pattern = rf"(?<![\w]){pattern}(?![\w])"
    found = [m for m in re.finditer(pattern, between) if "#" not in between[: m.start()]]
    if len(found) != 1:
        return None
    return begin + found[0].start(), begin + found[0].end()


def _candidates(tree: ast.AST, src: _Source) -> Iterator[tuple[str, int, int, int, str, str]]:
    """(kind, line, begin, end, replacement, description) for every mutation site."""
    excluded = _excluded_nodes(tree)
    parents: dict[int, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[id(child)] = node
    for node in ast.walk(tree):
        if id(node) in excluded:
            continue
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for i, op in enumerate(node.ops):
                if type(op) in _COMPARE_SWAPS:
                    old, new = _COMPARE_SWAPS[type(op)]
                    left, right = operands[i], operands[i + 1]
                    span = _operator_site(
                        src, (left.end_lineno, left.end_col_offset), (right.lineno, right.col_offset), old
                    )
                    if span:
                        yield "swapped operator", left.end_lineno, *span, new, f"`{old}` -> `{new}`"
        elif isinstance(node, ast.BinOp) and type(node.op) in _BINOP_SWAPS:
            old, new = _BINOP_SWAPS[type(node.op)]
            if isinstance(node.left, ast.Constant) and isinstance(node.left.value, str):
                continue  # "%" formatting and string concatenation make poor bugs
            span = _operator_site(
                src, (node.left.end_lineno, node.left.end_col_offset), (node.right.lineno, node.right.col_offset), old
            )
            if span:
                yield "swapped operator", node.left.end_lineno, *span, new, f"`{old}` -> `{new}`"
        elif isinstance(node, ast.BoolOp):
            old, new = _BOOL_SWAPS[type(node.op)]
            for left, right in zip(node.values, node.values[1:]):
                span = _operator_site(
                    src, (left.end_lineno, left.end_col_offset), (right.lineno, right.col_offset), old
                )
                if span:
                    yield "swapped operator", left.end_lineno, *span, new, f"`{old}` -> `{new}`"
        elif isinstance(node, ast.Constant) and node.end_lineno is not None:
            begin = src.index(node.lineno, node.col_offset)
            end = src.index(node.end_lineno, node.end_col_offset)
            value, parent = node.value, parents.get(id(node))
            if isinstance(value, bool):
                yield "wrong constant", node.lineno, begin, end, repr(not value), f"`{value}` -> `{not value}`"
            elif value is None and isinstance(parent, (ast.Return, ast.Assign, ast.keyword)):
                yield "wrong constant", node.lineno, begin, end, "0", "`None` -> `0`"
            elif isinstance(value, int):
                in_index = isinstance(parent, (ast.Compare, ast.Subscript, ast.Slice, ast.BinOp)) or (
                    isinstance(parent, ast.Call)
                    and isinstance(parent.func, ast.Name)
                    and parent.func.id in ("range", "enumerate")
                )
                text = src.text[begin:end]
                if in_index and text.isdigit():
                    for new in (value + 1, value - 1):
                        if new >= 0:
                            yield "off-by-one", node.lineno, begin, end, str(new), f"`{value}` -> `{new}`"
                elif value != 0 and text.isdigit():
                    yield "wrong constant", node.lineno, begin, end, "0", f"`{value}` -> `0`"
            elif isinstance(value, float) and value != 0:
                yield "wrong constant", node.lineno, begin, end, "0.0", f"`{value}` -> `0.0`"
            elif (
                isinstance(value, str)
                and value
                and not isinstance(parent, ast.JoinedStr)
                and node.lineno == node.end_lineno
                and len(value) <= 40
            ):
                yield "wrong constant", node.lineno, begin, end, "''", f"`{value!r}` -> `''`"
        elif isinstance(node, ast.If) and not node.orelse:
            parent = parents.get(id(node))
            if isinstance(parent, ast.If) and parent.orelse == [node]:
                continue  # an elif: removing it changes the chain's shape, not one branch
            body = None
            for field in ("body", "orelse", "finalbody", "handlers"):
                block = getattr(parent, field, None)
                if isinstance(block, list) and node in block:
                    body = block
            if body is None:
                continue
            first_line, last_line = node.lineno, node.end_lineno
            begin = src.starts[first_line - 1]
            end = src.starts[last_line]  # through the newline after the last line
            indent = src.lines[first_line - 1][: node.col_offset]
            replacement = f"{indent}pass\n" if len(body) == 1 else ""
            test = ast.unparse(node.test)
            yield (
                "removed branch",
                first_line,
                begin,
                end,
                replacement,
                f"removed `if {test[:60]}:` and its block ({last_line - first_line + 1} lines)",
            )


def mutations(source: str, path: str) -> list[Mutation]:
    """Every mutation of one module's `source` (`path`: its path in the repository), in
    source order; each parses and differs from the original tree."""
    tree = ast.parse(source)
    src = _Source(source)
    # Each top-level statement parses on its own: a mutation is checked by re-parsing the
    # statement that holds it, not the whole module.
    statements = []
    for node in tree.body:
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        statements.append((src.starts[first - 1], src.starts[node.end_lineno], node))
    found, seen = [], set()
    for kind, line, begin, end, replacement, description in _candidates(tree, src):
        if (begin, end, replacement) in seen:
            continue
        seen.add((begin, end, replacement))
        holder = next((s for s in statements if s[0] <= begin and end <= s[1]), None)
        if holder is None:
            continue
        low, high, node = holder
        try:
            mutated = ast.parse(source[low:begin] + replacement + source[end:high])
        except SyntaxError:
            continue
        if ast.dump(mutated) == ast.dump(ast.Module([node], [])):
            continue
        hunk, _ = src.hunk(path, begin, end, replacement)
        found.append(Mutation(kind, path, line, description, hunk))
    found.sort(key=lambda m: (m.line, m.kind, m.description))
    return found


def sample_mutations(candidates: list[Mutation], count: int, seed: int) -> list[Mutation]:
    """Up to `count` mutations drawn without replacement, round-robin over the kinds (so the
    rarer kinds are not crowded out), shuffled within each kind by `seed`."""
    rng = random.Random(seed)
    by_kind = {kind: [m for m in candidates if m.kind == kind] for kind in KINDS}
    for group in by_kind.values():
        rng.shuffle(group)
    chosen: list[Mutation] = []
    while len(chosen) < count and any(by_kind.values()):
        for kind in KINDS:
            if by_kind[kind] and len(chosen) < count:
                chosen.append(by_kind[kind].pop())
    return chosen
