"""A lint over the test tree (``ast`` only, nothing imported or run): tests that cannot fail are refused.

1. ``assert all(... for x in xs)`` passes on an empty ``xs``: the collection must be shown non-empty first, by an
   earlier ``assert xs`` / ``assert len(xs) == 3`` / ``assert len(xs) >= 1`` / ``assert xs == [...]`` in the same
   function (or in the same ``assert``: ``assert xs and all(...)``), or be non-empty by construction (a literal,
   ``range(<positive literal>)``, a module constant bound to a non-empty literal). ``.values()``, ``.items()``,
   ``.keys()`` and ``list``/``tuple``/``sorted``/``set`` wrappers are seen through; ``zip(a, b)`` needs each of
   ``a`` and ``b``.
2. A test function must assert something: an ``assert``, ``pytest.raises`` / ``pytest.warns`` / ``pytest.fail``,
   a call of something named ``assert*``, or a call of a helper defined anywhere under tests/ that does one of
   these (transitively).

docs/testing.md explains both rules and how to satisfy them.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

TESTS = Path(__file__).resolve().parent
_SEE_THROUGH_CALLS = {"list", "tuple", "sorted", "set", "frozenset", "reversed", "iter"}
_SEE_THROUGH_METHODS = {"values", "items", "keys"}
_PYTEST_CHECKS = {"raises", "warns", "fail", "deprecated_call"}
# Test helpers that return only a truthy value (or fail the test): tests/service/support.py's polling helper.
_RETURNS_TRUTHY = {"wait_for"}


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    function: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line} {self.function}: {self.message}"


def collect_test_files(root: Path = TESTS) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if p.name.startswith("test_") or p.name.endswith("_test.py"))


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _call_name(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _is_direct_check(node: ast.AST) -> bool:
    """An assert, a pytest.raises/warns/fail, or a call of something named assert*."""
    if isinstance(node, ast.Assert):
        return True
    if isinstance(node, ast.Call):
        func = node.func
        if (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and func.value.id == "pytest"
            and func.attr in _PYTEST_CHECKS
        ):
            return True
        name = _call_name(node)
        return name is not None and name.startswith("assert")
    return False


FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef


def _functions(tree: ast.AST) -> Iterator[FunctionNode]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def checking_helpers(root: Path = TESTS) -> set[str]:
    """Names of functions defined under ``root`` that check something, directly or through another such helper."""
    calls: dict[str, set[str]] = {}
    checking: set[str] = set()
    for path in sorted(root.rglob("*.py")):
        for fn in _functions(_parse(path)):
            called = calls.setdefault(fn.name, set())
            for node in ast.walk(fn):
                if _is_direct_check(node):
                    checking.add(fn.name)
                elif isinstance(node, ast.Call) and (name := _call_name(node)) is not None:
                    called.add(name)
    changed = True
    while changed:
        changed = False
        for name, called in calls.items():
            if name not in checking and called & checking:
                checking.add(name)
                changed = True
    return checking


def _test_functions(tree: ast.Module) -> Iterator[FunctionNode]:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test"):
            yield node
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name.startswith("test"):
                    yield item


def find_tests_without_checks(root: Path = TESTS) -> list[Finding]:
    helpers = checking_helpers(root)
    found = []
    for path in collect_test_files(root):
        for fn in _test_functions(_parse(path)):
            checks = any(
                _is_direct_check(node)
                or (isinstance(node, ast.Call) and _call_name(node) in helpers and _call_name(node) != fn.name)
                for node in ast.walk(fn)
            )
            if not checks:
                rel = path.relative_to(root.parent).as_posix()
                found.append(Finding(rel, fn.lineno, fn.name, "no assert, pytest.raises or checking helper"))
    return found


# -- rule 1: all() over a collection not shown non-empty ---------------------------------------------------------


def _strip(expr: ast.expr) -> ast.expr:
    """``list(xs)``, ``sorted(xs)``, ``xs.values()``... -> ``xs``."""
    while True:
        if (
            isinstance(expr, ast.Call)
            and isinstance(expr.func, ast.Name)
            and expr.func.id in _SEE_THROUGH_CALLS
            and len(expr.args) == 1
        ):
            expr = expr.args[0]
        elif (
            isinstance(expr, ast.Call)
            and isinstance(expr.func, ast.Attribute)
            and expr.func.attr in _SEE_THROUGH_METHODS
            and not expr.args
        ):
            expr = expr.func.value
        else:
            return expr


def _key(expr: ast.expr) -> str:
    return ast.dump(_strip(expr), annotate_fields=False, include_attributes=False)


def _non_empty_literal(expr: ast.expr) -> bool:
    if isinstance(expr, ast.List | ast.Tuple | ast.Set):
        return bool(expr.elts)
    if isinstance(expr, ast.Dict):
        return bool(expr.keys)
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str | bytes):
        return bool(expr.value)
    return False


def _positive_int(expr: ast.expr, at_least: int) -> bool:
    return isinstance(expr, ast.Constant) and isinstance(expr.value, int) and expr.value >= at_least


def _len_arg(expr: ast.expr) -> ast.expr | None:
    if isinstance(expr, ast.Call) and _call_name(expr) == "len" and len(expr.args) == 1:
        return expr.args[0]
    return None


def _collections_of(expr: ast.expr, sources: dict[str, ast.expr]) -> list[ast.expr]:
    """``expr`` and what it was made from: a comprehension (filtered or not) is empty when what it maps over is,
    so showing it non-empty shows its source non-empty too; ``sources`` maps local names bound once to a
    comprehension to what it maps over."""
    found = [expr]
    stripped = _strip(expr)
    if isinstance(stripped, ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp):
        found += _collections_of(stripped.generators[0].iter, sources)
    elif isinstance(stripped, ast.Name) and stripped.id in sources:
        found += _collections_of(sources[stripped.id], sources)
    return found


def _shown_non_empty(test: ast.expr, known: set[str], sources: dict[str, ast.expr]) -> set[str]:
    """Keys of the collections an ``assert <test>`` shows to be non-empty (``known``: names non-empty by
    construction, so ``assert xs == expected`` shows ``xs`` when ``expected`` is one)."""
    shown: set[str] = set()

    def show(expr: ast.expr) -> None:
        shown.update(_key(c) for c in _collections_of(expr, sources))

    def built_non_empty(expr: ast.expr) -> bool:
        return _non_empty_literal(expr) or (isinstance(expr, ast.Name) and expr.id in known)

    parts = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test]
    for part in parts:
        if isinstance(part, ast.Compare):
            operands = [part.left, *part.comparators]
            for left, op, right in zip(operands[:-1], part.ops, operands[1:], strict=True):
                coll = _len_arg(left)
                if coll is not None and (
                    (isinstance(op, ast.Eq | ast.GtE) and _positive_int(right, 1))
                    or (isinstance(op, ast.Gt) and _positive_int(right, 0))
                ):
                    show(coll)
                coll = _len_arg(right)
                if coll is not None and (
                    (isinstance(op, ast.Eq | ast.LtE) and _positive_int(left, 1))
                    or (isinstance(op, ast.Lt) and _positive_int(left, 0))
                ):
                    show(coll)
                if isinstance(op, ast.Eq) and (built_non_empty(right) or built_non_empty(left)):
                    show(right if built_non_empty(left) else left)
                if isinstance(op, ast.NotEq) and _is_empty_literal(right):
                    show(left)
        elif (coll := _len_arg(part)) is not None:
            show(coll)
        elif not isinstance(part, ast.Call | ast.Compare | ast.UnaryOp | ast.BoolOp):
            show(part)
    return shown


def _comprehension_sources(fn: ast.AST) -> dict[str, ast.expr]:
    """Local names bound exactly once, each to a list/set/dict comprehension: what it maps over."""
    count: dict[str, int] = {}
    sources: dict[str, ast.expr] = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            count[node.id] = count.get(node.id, 0) + 1
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.ListComp | ast.SetComp | ast.DictComp)
        ):
            sources[node.targets[0].id] = node.value.generators[0].iter
    return {name: src for name, src in sources.items() if count.get(name) == 1}


def _is_empty_literal(expr: ast.expr) -> bool:
    return isinstance(expr, ast.List | ast.Tuple | ast.Set | ast.Dict) and not (
        expr.elts if not isinstance(expr, ast.Dict) else expr.keys
    )


def _all_collection(test: ast.expr) -> ast.expr | None:
    """The collection ``all(...)`` iterates, when ``test`` is (or is a conjunct of) an ``all(...)`` call."""
    if isinstance(test, ast.Call) and isinstance(test.func, ast.Name) and test.func.id == "all" and len(test.args) == 1:
        arg = test.args[0]
        if isinstance(arg, ast.GeneratorExp | ast.ListComp | ast.SetComp):
            return arg.generators[0].iter
        return arg
    return None


def _non_empty(coll: ast.expr, shown: set[str], constants: set[str]) -> bool:
    coll = _strip(coll)
    if _key(coll) in shown or _non_empty_literal(coll):
        return True
    if isinstance(coll, ast.Name) and coll.id in constants:
        return True
    if isinstance(coll, ast.ListComp | ast.SetComp | ast.DictComp):
        # non-empty when it maps (no filter) over something non-empty
        return not any(g.ifs for g in coll.generators) and all(
            _non_empty(g.iter, shown, constants) for g in coll.generators
        )
    if isinstance(coll, ast.Call) and _call_name(coll) in _RETURNS_TRUTHY:
        return True
    if isinstance(coll, ast.Call) and isinstance(coll.func, ast.Name):
        args = coll.args
        if coll.func.id == "range" and len(args) == 1:
            return _positive_int(args[0], 1)
        if coll.func.id == "range" and len(args) == 2:
            start, stop = args
            return (
                isinstance(start, ast.Constant)
                and isinstance(stop, ast.Constant)
                and isinstance(start.value, int)
                and isinstance(stop.value, int)
                and start.value < stop.value
            )
        if coll.func.id == "zip" and args:
            return all(_non_empty(arg, shown, constants) for arg in args)
    return False


def _bound_non_empty(scope: ast.AST, outer: set[str]) -> set[str]:
    """Names bound once in ``scope`` (module body or function) to something non-empty by construction: a
    non-empty literal, or a comprehension without a filter over something non-empty."""
    bound: dict[str, int] = {}
    values: dict[str, ast.expr] = {}
    body = scope.body if isinstance(scope, ast.Module) else list(ast.walk(scope))
    for node in body:
        targets: list[ast.expr] = []
        value: ast.expr | None = None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        elif isinstance(node, ast.For | ast.AugAssign | ast.With | ast.NamedExpr):
            targets = (
                [node.target]
                if not isinstance(node, ast.With)
                else [i.optional_vars for i in node.items if i.optional_vars is not None]
            )
        for target in targets:
            for leaf in ast.walk(target):
                if isinstance(leaf, ast.Name):
                    bound[leaf.id] = bound.get(leaf.id, 0) + 1
                    if value is not None and target is leaf:
                        values[leaf.id] = value
    if isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef):
        for arg in ast.walk(scope.args):
            if isinstance(arg, ast.arg):
                bound[arg.arg] = bound.get(arg.arg, 0) + 2  # a parameter is never known non-empty
    known = {name for name in outer if name not in bound}  # a local binding hides the outer one
    changed = True
    while changed:
        changed = False
        for name, value in values.items():
            if name not in known and bound[name] == 1 and _non_empty(value, set(), known):
                known.add(name)
                changed = True
    return known


def find_vacuous_all(root: Path = TESTS) -> list[Finding]:
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = _parse(path)
        constants = _bound_non_empty(tree, set())
        for fn in _functions(tree):
            local = _bound_non_empty(fn, constants)
            sources = _comprehension_sources(fn)
            asserts = sorted(
                (n for n in ast.walk(fn) if isinstance(n, ast.Assert)), key=lambda n: (n.lineno, n.col_offset)
            )
            shown: set[str] = set()
            for node in asserts:
                parts = (
                    node.test.values
                    if isinstance(node.test, ast.BoolOp) and isinstance(node.test.op, ast.And)
                    else [node.test]
                )
                for part in parts:
                    coll = _all_collection(part)
                    if coll is not None and not _non_empty(coll, shown, local):
                        rel = path.relative_to(root.parent).as_posix()
                        found.append(
                            Finding(
                                rel,
                                node.lineno,
                                fn.name,
                                f"assert all(...) over {ast.unparse(coll)!r}, not shown non-empty first",
                            )
                        )
                    shown |= _shown_non_empty(part, local, sources)
    return found


def test_no_assert_all_over_a_collection_not_shown_non_empty() -> None:
    found = find_vacuous_all()
    assert not found, "assert all(...) passes on an empty collection:\n" + "\n".join(map(str, found))


def test_every_test_checks_something() -> None:
    found = find_tests_without_checks()
    assert not found, "tests that cannot fail:\n" + "\n".join(map(str, found))


# -- the lint's own rows: what it refuses and what it lets through ------------------------------------------------

VACUOUS = """
ROWS = [1, 2]
ROWS_REBOUND = [1]


def get() -> list[int]:
    return []


def test_unchecked() -> None:
    xs = get()
    assert all(x > 0 for x in xs)


def test_checked_after() -> None:
    xs = get()
    assert all(x > 0 for x in xs)
    assert xs


def test_len_against_a_variable() -> None:
    xs, n = get(), 0
    assert len(xs) == n
    assert all(x > 0 for x in xs)


def test_len_at_least_zero() -> None:
    xs = get()
    assert len(xs) >= 0
    assert all(x > 0 for x in xs)


def test_a_local_hides_the_constant() -> None:
    ROWS_REBOUND = get()
    assert all(x > 0 for x in ROWS_REBOUND)


def test_a_filtered_comprehension() -> None:
    xs = [x for x in range(3) if x > 5]
    assert all(x > 0 for x in xs)


def test_a_generator_call() -> None:
    assert all(x > 0 for x in iter(get()))
"""

NOT_VACUOUS = """
ROWS = [1, 2]


def get() -> list[int]:
    return [1]


def wait_for(f):
    return f()


def test_truthy_first() -> None:
    xs = get()
    assert xs
    assert all(x > 0 for x in xs)


def test_in_the_same_assert() -> None:
    xs = get()
    assert xs and all(x > 0 for x in xs)


def test_len() -> None:
    xs, ys, zs = get(), get(), get()
    assert len(xs) == 1 and len(ys) >= 1 and 1 <= len(zs) <= 3
    assert all(x > 0 for x in xs) and all(y > 0 for y in ys) and all(z > 0 for z in zs)


def test_equal_to_a_literal() -> None:
    xs = get()
    assert {x for x in xs} == {1}
    assert all(x > 0 for x in xs)


def test_by_construction() -> None:
    squares = [i * i for i in range(1, 4)]
    assert all(x > 0 for x in ROWS) and all(x >= 0 for x in range(3)) and all(s > 0 for s in squares)
    assert all(x > 0 for x in [1, 2]) and all(a == b for a, b in zip(ROWS, ROWS))


def test_values_are_seen_through() -> None:
    d = {"a": 1}
    assert d
    assert all(v > 0 for v in d.values()) and all(v > 0 for v in sorted(d.values()))


def test_a_polled_value() -> None:
    xs = wait_for(get)
    assert all(x > 0 for x in xs)
"""

CHECKS = """
import pytest


def helper(x: int) -> None:
    assert x > 0


def outer_helper(x: int) -> None:
    helper(x)


def builder() -> int:
    return 1


def test_nothing() -> None:
    builder()


def test_assert() -> None:
    assert builder() == 1


def test_raises() -> None:
    with pytest.raises(ZeroDivisionError):
        _ = 1 / 0


def test_a_helper_that_asserts() -> None:
    outer_helper(builder())


class TestGrouped:
    def test_nothing_either(self) -> None:
        builder()

    def test_unittest_style(self) -> None:
        self.assertEqual(1, 1)
"""


def lint_tree(tmp_path: Path, source: str) -> Path:
    root = tmp_path / "tests"
    root.mkdir()
    (root / "test_sample.py").write_text(source, encoding="utf-8")
    return root


def test_the_lint_refuses_all_over_a_collection_not_shown_non_empty(tmp_path: Path) -> None:
    found = {f.function for f in find_vacuous_all(lint_tree(tmp_path, VACUOUS))}
    assert found == {
        "test_unchecked",
        "test_checked_after",
        "test_len_against_a_variable",
        "test_len_at_least_zero",
        "test_a_local_hides_the_constant",
        "test_a_filtered_comprehension",
        "test_a_generator_call",
    }


def test_the_lint_lets_collections_shown_non_empty_through(tmp_path: Path) -> None:
    assert find_vacuous_all(lint_tree(tmp_path, NOT_VACUOUS)) == []


def test_the_lint_refuses_tests_that_check_nothing(tmp_path: Path) -> None:
    found = find_tests_without_checks(lint_tree(tmp_path, CHECKS))
    assert [(f.path, f.function) for f in found] == [
        ("tests/test_sample.py", "test_nothing"),
        ("tests/test_sample.py", "test_nothing_either"),
    ]
