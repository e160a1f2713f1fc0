"""A small AST mutator for the answer cells of an instructor source.

Each mutant is one small, plausible slip in a solution region (``### BEGIN SOLUTION`` ...
``### END SOLUTION``): the kind of bug a student makes and the hidden tests must catch.

    for m in mutate_cell(cell.source, "cached_mha"):
        m.key, m.source    # a stable name ("cached_mha:19:dim:dim=2 -> dim=1") and the whole mutated cell

The operators (the ``op`` of a mutant):
    arith    swap an arithmetic operator (+ -, * /, // /, % //, ** *, @ *)
    compare  swap a comparison (< <=, > >=, == !=, is / is not, in / not in)
    index    +1 or -1 on an integer index or a slice bound
    drop     replace one statement by ``pass``
    args     swap two adjacent positional arguments of a call
    dim      change a ``dim=``/``axis=`` (or the positional dim of softmax, cat, unsqueeze, ...)
    cast     drop a dtype cast (``.float()``, ``.to(...)``, ``int(x)``, ``round(x)``) or a ``dtype=`` keyword
    mode     replace a mode string ("causal" -> "none", ...)
    default  change a default argument or a constant keyword argument (True <-> False, n -> n + 1)

Only the text of the mutated node changes (comments, markers and layout stay), so a mutant is
also a readable diff and can be submitted to the real autograder as it is. Mutants whose code
does not differ from the original after normalisation (``ast.unparse``) are not produced.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Iterator

SOLUTION_BEGIN, SOLUTION_END = "BEGIN SOLUTION", "END SOLUTION"

ARITH = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Div,
         ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult, ast.MatMult: ast.Mult, ast.LShift: ast.RShift,
         ast.RShift: ast.LShift, ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd}
COMPARE = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
           ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In}
# Methods whose first positional integer argument is a dimension.
DIM_METHODS = {"softmax", "log_softmax", "cat", "stack", "unsqueeze", "squeeze", "argmax", "argmin", "amax", "amin",
               "sum", "mean", "max", "min", "cumsum", "flatten", "size", "topk", "sort", "argsort", "norm",
               "transpose", "split", "chunk", "narrow", "select", "repeat_interleave", "expand_dims", "flip"}
CAST_METHODS = {"float", "double", "half", "bfloat16", "long", "int", "short", "bool", "to", "type", "item",
                "tolist", "contiguous", "clone"}
CAST_FUNCS = {"int", "float", "round", "bool"}
SYMMETRIC = {"min", "max", "maximum", "minimum", "transpose", "swapaxes"}  # swapping their two arguments changes nothing
# Mode strings a student may confuse: each maps to the one it is replaced by.
MODES = {"causal": "none", "none": "causal", "full": "causal", "window": "causal", "sliding": "causal",
         "left": "right", "right": "left", "sum": "mean", "mean": "sum", "max": "min", "min": "max",
         "floor": "ceil", "ceil": "floor", "fifo": "lru", "lru": "fifo"}


@dataclass(frozen=True)
class Mutant:
    grade_id: str
    op: str
    line: int  # 1-based line in the cell
    change: str  # "before -> after", short
    source: str  # the whole mutated cell

    @property
    def key(self) -> str:
        """Stable name, used in the equivalent-mutants file: grade_id:line:op:change."""
        return f"{self.grade_id}:{self.line}:{self.op}:{self.change}"


def solution_lines(source: str) -> set[int]:
    """1-based numbers of the lines inside solution regions (marker lines excluded)."""
    inside, lines = False, set()
    for i, line in enumerate(source.split("\n"), 1):
        if SOLUTION_BEGIN in line:
            inside = True
        elif SOLUTION_END in line:
            inside = False
        elif inside:
            lines.add(i)
    return lines


def _short(text: str, n: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n - 3] + "..."


def _change(before: str, after: str, context: int = 12) -> str:
    """"before -> after" for the part that differs, with a little context on each side."""
    before, after = " ".join(before.split()), " ".join(after.split())
    p = 0
    while p < min(len(before), len(after)) and before[p] == after[p]:
        p += 1
    s = 0
    while s < min(len(before), len(after)) - p and before[-1 - s] == after[-1 - s]:
        s += 1
    a, z = max(0, p - context), max(0, s - context)
    cut = lambda t: ("..." if a else "") + t[a:len(t) - z] + ("..." if z else "")  # noqa: E731
    return f"{_short(cut(before))} -> {_short(cut(after))}"


def _int_const(node: ast.AST) -> int | None:
    """The value of an integer literal (``3``, ``-1``), else None."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant) \
            and type(node.operand.value) is int:
        return -node.operand.value
    return None


def _plus(node: ast.expr, delta: int) -> ast.expr:
    """``node + delta`` folded when ``node`` is an integer literal."""
    value = _int_const(node)
    if value is not None:
        return ast.Constant(value + delta) if value + delta >= 0 else ast.UnaryOp(ast.USub(), ast.Constant(-(value + delta)))
    op = ast.Add() if delta > 0 else ast.Sub()
    return ast.BinOp(node, op, ast.Constant(abs(delta)))


def _other_dim(node: ast.expr) -> ast.expr | None:
    value = _int_const(node)
    if value is None:
        return None
    new = value - 1 if value < 0 else (value + 1 if value == 0 else value - 1)
    return ast.Constant(new) if new >= 0 else ast.UnaryOp(ast.USub(), ast.Constant(-new))


def _call_name(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def _node_edits(node: ast.AST) -> Iterator[tuple[str, ast.AST, ast.AST]]:
    """(op, node to replace, replacement) for one expression node."""
    if isinstance(node, ast.BinOp) and type(node.op) in ARITH:
        yield "arith", node, ast.BinOp(node.left, ARITH[type(node.op)](), node.right)
    if isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            if type(op) in COMPARE:
                ops = list(node.ops)
                ops[i] = COMPARE[type(op)]()
                yield "compare", node, ast.Compare(node.left, ops, node.comparators)
    if isinstance(node, ast.Subscript):
        parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        for part in parts:
            if isinstance(part, ast.Slice):
                for bound in (part.lower, part.upper):
                    if bound is not None:
                        for delta in (1, -1):
                            yield "index", bound, _plus(bound, delta)
            elif _int_const(part) is not None:
                for delta in (1, -1):
                    yield "index", part, _plus(part, delta)
    if isinstance(node, ast.Call):
        name = _call_name(node)
        args = node.args
        for i in range(len(args) - 1 if name not in SYMMETRIC else 0):
            if not isinstance(args[i], ast.Starred) and not isinstance(args[i + 1], ast.Starred):
                swapped = list(args)
                swapped[i], swapped[i + 1] = args[i + 1], args[i]
                yield "args", node, ast.Call(node.func, swapped, node.keywords)
        for kw in node.keywords:
            if kw.arg in ("dim", "axis"):
                new = _other_dim(kw.value)
                if new is not None:
                    yield "dim", kw.value, new
            elif kw.arg == "dtype":
                yield "cast", node, ast.Call(node.func, node.args, [k for k in node.keywords if k is not kw])
            elif isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, bool):
                yield "default", kw.value, ast.Constant(not kw.value.value)
            elif _int_const(kw.value) is not None:
                yield "default", kw.value, _plus(kw.value, 1)
        if name in DIM_METHODS and args and isinstance(node.func, ast.Attribute):
            dim_arg = args[1] if name in ("cat", "stack") and len(args) > 1 else args[-1] if name == "transpose" else args[0]
            new = _other_dim(dim_arg)
            if new is not None:
                yield "dim", dim_arg, new
        if isinstance(node.func, ast.Attribute) and name in CAST_METHODS and name not in ("contiguous", "clone"):
            yield "cast", node, node.func.value
        if isinstance(node.func, ast.Name) and name in CAST_FUNCS and len(args) == 1 and not node.keywords \
                and not isinstance(args[0], ast.Constant):  # float("-inf") is a value, not a cast
            yield "cast", node, args[0]
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in MODES:
        yield "mode", node, ast.Constant(MODES[node.value])


class _Locate(ast.NodeVisitor):
    """All expression nodes and statements, with their parents' statement kinds."""

    def __init__(self) -> None:
        self.exprs: list[ast.AST] = []
        self.stmts: list[ast.stmt] = []
        self.defaults: list[ast.expr] = []
        self.docstrings: set[int] = set()

    def generic_visit(self, node: ast.AST) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                self.docstrings.add(id(body[0]))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            self.defaults += [d for d in node.args.defaults + node.args.kw_defaults if d is not None]
        if isinstance(node, ast.stmt):
            self.stmts.append(node)
        elif isinstance(node, ast.expr) and not isinstance(node, ast.JoinedStr):
            self.exprs.append(node)
        if isinstance(node, ast.JoinedStr):  # f-strings: messages, not logic
            return
        super().generic_visit(node)


def _offsets(source: str) -> list[int]:
    starts, pos = [], 0
    for line in source.split("\n"):
        starts.append(pos)
        pos += len(line.encode("utf-8")) + 1
    return starts


def _replace(source: str, node: ast.AST, text: str) -> str:
    """``source`` with the span of ``node`` replaced by ``text`` (ast offsets are UTF-8 bytes)."""
    raw = source.encode("utf-8")
    starts = _offsets(source)
    a = starts[node.lineno - 1] + node.col_offset
    b = starts[node.end_lineno - 1] + node.end_col_offset
    return (raw[:a] + text.encode("utf-8") + raw[b:]).decode("utf-8")


def _drop(source: str, stmt: ast.stmt) -> str:
    lines = source.split("\n")
    first = lines[stmt.lineno - 1]
    indent = first[:len(first) - len(first.lstrip())]
    head = first[:stmt.col_offset] if first[:stmt.col_offset].strip() else indent
    tail = lines[stmt.end_lineno - 1][stmt.end_col_offset:]
    return "\n".join(lines[:stmt.lineno - 1] + [head + "pass" + tail] + lines[stmt.end_lineno:])


def _normal(code: str) -> str:
    return ast.unparse(ast.parse(code))


def mutate_cell(source: str, grade_id: str) -> list[Mutant]:
    """Every mutant of the solution regions of one answer cell, in source order, without duplicates
    or no-ops. A cell that does not parse (magics) gives none."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    lines = solution_lines(source)
    if not lines:
        return []
    loc = _Locate()
    loc.visit(tree)
    inside = lambda n: n.lineno in lines and n.end_lineno in lines  # noqa: E731
    edits: list[tuple[str, ast.AST, str]] = []
    for node in loc.exprs:
        for op, target, new in _node_edits(node):
            if inside(target):
                edits.append((op, target, ast.unparse(new)))
    for d in loc.defaults:
        if inside(d) and isinstance(d, ast.Constant):
            v = d.value
            new = (not v) if isinstance(v, bool) else v + 1 if isinstance(v, (int, float)) else None if v is not None else 0
            edits.append(("default", d, repr(new)))
    original = _normal(source)
    seen, out = set(), []
    for op, target, text in edits:
        new_source = _replace(source, target, f"({text})" if "\n" in ast.get_source_segment(source, target) else text)
        out.append((target.lineno, op, ast.get_source_segment(source, target), text, new_source))
    for stmt in loc.stmts:
        if inside(stmt) and id(stmt) not in loc.docstrings and not isinstance(stmt, ast.Pass):
            out.append((stmt.lineno, "drop", ast.get_source_segment(source, stmt).split("\n")[0], "pass",
                        _drop(source, stmt)))
    mutants, keys = [], set()
    for line, op, before, after, new_source in sorted(out, key=lambda x: x[0]):
        try:
            normal = _normal(new_source)
        except SyntaxError:
            continue
        if normal == original or normal in seen:
            continue
        seen.add(normal)
        change = _change(before, after) if op != "drop" else f"{_short(before)} -> pass"
        mutant = Mutant(grade_id, op, line, change, new_source)
        n = 2
        while mutant.key in keys:  # the same change twice on one line: number the later ones
            mutant = Mutant(grade_id, op, line, f"{change} #{n}", new_source)
            n += 1
        keys.add(mutant.key)
        mutants.append(mutant)
    return mutants
