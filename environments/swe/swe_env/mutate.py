"""Procedural bugs by AST mutation (SWE-smith's recipe): each mutant changes one small piece of
one function, edited in the source text so the rest of the file keeps its formatting.

Operators: flip a binary operator, flip a comparison, swap `and`/`or`, negate an `if`/`while`
condition, change a constant (off by one, True/False), swap the operands of a non-commutative
operation, drop a `not`, and remove a statement. Only single-line expressions are rewritten,
so comments and layout around them survive.
"""

from __future__ import annotations

import ast
import random
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import zip_longest

BINOP_FLIPS: dict[type, type] = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.FloorDiv,
    ast.FloorDiv: ast.Mult,
    ast.Div: ast.Mult,
    ast.Mod: ast.FloorDiv,
    ast.BitAnd: ast.BitOr,
    ast.BitOr: ast.BitAnd,
    ast.LShift: ast.RShift,
    ast.RShift: ast.LShift,
}
CMP_FLIPS: dict[type, type] = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}
NON_COMMUTATIVE = (ast.Sub, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.LShift, ast.RShift)


@dataclass(frozen=True)
class Mutant:
    """One single-site change: replace `old` (lines `start`..`end`, 1-based) with `new`."""

    operator: str
    function: str
    function_lines: int
    start: int
    end: int
    old: str
    new: str

    def apply(self, source: str) -> str:
        lines = source.splitlines(keepends=True)
        segment = "".join(lines[self.start - 1 : self.end])
        assert segment == self.old, "mutant does not match the source"
        return "".join([*lines[: self.start - 1], self.new, *lines[self.end :]])


def _line_edit(lines: list[str], node: ast.expr, replacement: str) -> tuple[str, str] | None:
    """(old line, new line) replacing a single-line node's text; positions are UTF-8 offsets."""
    if node.lineno != node.end_lineno:
        return None
    line = lines[node.lineno - 1]
    raw = line.encode()
    start, end = node.col_offset, node.end_col_offset
    assert end is not None
    new = (raw[:start] + replacement.encode() + raw[end:]).decode()
    return (line, new) if new != line else None


def _expression_mutations(node: ast.AST) -> Iterator[tuple[str, ast.expr]]:
    """(operator name, mutated copy of the node) for one expression node."""
    if isinstance(node, ast.BinOp) and type(node.op) in BINOP_FLIPS:
        yield "flip_binop", ast.BinOp(node.left, BINOP_FLIPS[type(node.op)](), node.right)
    if isinstance(node, ast.BinOp) and isinstance(node.op, NON_COMMUTATIVE):
        yield "swap_operands", ast.BinOp(node.right, node.op, node.left)
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in CMP_FLIPS:
        yield (
            "flip_compare",
            ast.Compare(node.left, [CMP_FLIPS[type(node.ops[0])]()], node.comparators),
        )
    if isinstance(node, ast.BoolOp):
        other = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        yield "swap_boolop", ast.BoolOp(other, node.values)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        yield "drop_not", node.operand
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool):
            yield "flip_bool", ast.Constant(not node.value)
        elif isinstance(node.value, int) and 0 <= node.value < 1000:
            yield "change_constant", ast.Constant(node.value + 1 if node.value != 1 else 0)


def _wrap(expr: ast.expr) -> str:
    text = ast.unparse(expr)
    return f"({text})" if isinstance(expr, ast.BinOp | ast.BoolOp | ast.Compare) else text


def function_mutants(source: str) -> list[Mutant]:
    """Every mutant of every function (and method) in a module's source."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    mutants: list[Mutant] = []
    for func in ast.walk(tree):
        if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        size = (func.end_lineno or func.lineno) - func.lineno + 1
        body_nodes = [n for stmt in func.body for n in ast.walk(stmt)]
        for node in body_nodes:
            edits: list[tuple[str, str]] = []
            if isinstance(node, ast.expr):
                for name, mutated in _expression_mutations(node):
                    edit = _line_edit(lines, node, _wrap(mutated))
                    if edit:
                        edits.append((name, *edit))  # type: ignore[arg-type]
            if isinstance(node, ast.If | ast.While):
                edit = _line_edit(lines, node.test, f"not {_wrap(node.test)}")
                if edit:
                    edits.append(("negate_condition", *edit))  # type: ignore[arg-type]
            for name, old, new in edits:  # type: ignore[misc]
                mutants.append(Mutant(name, func.name, size, node.lineno, node.lineno, old, new))
        for stmt in ast.walk(func):
            for body in (getattr(stmt, "body", None), getattr(stmt, "orelse", None)):
                if not isinstance(body, list) or len(body) < 2:
                    continue
                for victim in body:
                    if not isinstance(victim, ast.Assign | ast.AugAssign | ast.Expr | ast.Return):
                        continue
                    if isinstance(victim, ast.Expr) and isinstance(victim.value, ast.Constant):
                        continue  # a docstring
                    start, end = victim.lineno, victim.end_lineno or victim.lineno
                    old = "".join(lines[start - 1 : end])
                    mutants.append(Mutant("remove_statement", func.name, size, start, end, old, ""))
    unique = {(m.start, m.end, m.old, m.new): m for m in mutants}
    return list(unique.values())


def interleave(mutants: list[Mutant], seed: int) -> list[Mutant]:
    """All mutants in a deterministic order that visits every function before any repeats."""
    rng = random.Random(seed)
    by_function: dict[str, list[Mutant]] = defaultdict(list)
    for mutant in mutants:
        by_function[mutant.function].append(mutant)
    groups = list(by_function.values())
    for group in groups:
        rng.shuffle(group)
    rng.shuffle(groups)
    return [m for batch in zip_longest(*groups) for m in batch if m is not None]
