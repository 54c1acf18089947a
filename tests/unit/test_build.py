"""`app/build.py`: what the compiled build compiles, and what mypyc can compile.

The build itself runs in CI only (`make test-compiled`, three minutes). These checks are
the cheap, early half: a listed module that mypyc would refuse (an async generator, a
class of several bases) fails here, with the module's name, before anyone waits for gcc.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil

import app
from app import build
from tests.support.procs import ROOT


def _async_generators(tree: ast.Module) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.AsyncFunctionDef):
            inner = [
                n
                for n in ast.walk(node)
                if isinstance(n, (ast.Yield, ast.YieldFrom)) and _owner(node, n) is node
            ]
            if inner:
                found.append(node.name)
    return found


def _owner(top: ast.AST, target: ast.AST) -> ast.AST | None:
    """The innermost function around `target` inside `top` (a nested `def` owns its
    own `yield`)."""
    owner: ast.AST | None = None

    def visit(node: ast.AST, current: ast.AST | None) -> None:
        nonlocal owner
        if node is target:
            owner = current
            return
        for child in ast.iter_child_nodes(node):
            nested = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            visit(child, child if nested else current)

    visit(top, top)
    return owner


def test_every_listed_module_exists_and_none_is_a_package_init() -> None:
    paths = build.compiled_paths(ROOT)
    assert len(paths) >= 70, paths  # the request's path, not a handful
    for path in paths:
        assert (ROOT / path).is_file(), path
        assert not path.endswith("__init__.py")
    assert not set(paths) & build.INTERPRETED.keys()


def test_the_interpreted_exceptions_are_still_in_the_listed_packages() -> None:
    """An entry of INTERPRETED for a module that moved or went away hides nothing: drop it."""
    for path in build.INTERPRETED:
        assert (ROOT / path).is_file(), f"{path} is gone: drop it from INTERPRETED"
        assert any(path.startswith(pkg + "/") for pkg in build.PACKAGES)


def test_no_listed_module_defines_an_async_generator() -> None:
    """mypyc: "async generators are unimplemented". Such a module goes to INTERPRETED."""
    offenders = {
        path: names
        for path in build.compiled_paths(ROOT)
        if (names := _async_generators(ast.parse((ROOT / path).read_text())))
    }
    assert not offenders, offenders


def test_the_interpreted_ones_are_interpreted_for_their_reason() -> None:
    """Each module left interpreted for async generators really has one (else compile it)."""
    for path, why in build.INTERPRETED.items():
        if why.startswith("async generators"):
            assert _async_generators(ast.parse((ROOT / path).read_text())), path


def test_no_listed_class_has_two_bases() -> None:
    """A compiled class has one base (mixins and Protocols aside, which mypyc allows
    as traits only when compiled too); `app/metrics` stays interpreted for this."""
    offenders = []
    for path in build.compiled_paths(ROOT):
        for node in ast.walk(ast.parse((ROOT / path).read_text())):
            if isinstance(node, ast.ClassDef):
                bases = [ast.unparse(b) for b in node.bases if ast.unparse(b) != "Generic"]
                bases = [b for b in bases if not b.startswith(("Generic[", "Protocol"))]
                if len(bases) > 1:
                    offenders.append(f"{path}: {node.name}({', '.join(bases)})")
    assert not offenders, offenders


def test_the_source_tree_runs_interpreted() -> None:
    """The repo's `app` has no extension beside it: tests import the source."""
    compiled, listed = build.compiled_modules()
    assert (compiled, listed) == (0, len(build.compiled_paths(ROOT)))
    assert build.build_name() == "interpreted"


def test_no_interpreted_class_inherits_a_compiled_one() -> None:
    """Compiled, a class refuses interpreted subclasses ("interpreted classes cannot
    inherit from compiled", at import or first use): a subclass lives in its base's
    module, or in another compiled one."""
    compiled = {p.removesuffix(".py").replace("/", ".") for p in build.compiled_paths(ROOT)}
    offenders = []
    for info in pkgutil.walk_packages(app.__path__, "app."):
        if info.name in compiled or info.name == "app.db.migrations.env":  # Alembic's script
            continue
        module = importlib.import_module(info.name)
        for name, cls in vars(module).items():
            if inspect.isclass(cls) and cls.__module__ == info.name:
                bases = [b for b in cls.__mro__[1:] if b.__module__ in compiled]
                offenders += [f"{info.name}.{name}({b.__module__}.{b.__name__})" for b in bases]
    assert not offenders, offenders


def test_no_listed_module_unpacks_a_none_into_a_variable_typed_later() -> None:
    """`status, ticket = 200, None`, then `ticket = await admit()`: mypy reads the
    variable as `Ticket | None`, the compiled build as `Ticket`, and `if ticket is not
    None` raised `TypeError: Ticket object expected; got None` in a WebSocket warm-up.
    Such a variable is declared with its type first (`ticket: Ticket | None = None`)."""
    offenders = []
    for path in build.compiled_paths(ROOT):
        for node in ast.walk(ast.parse((ROOT / path).read_text())):
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.targets[0], ast.Tuple)
                and isinstance(node.value, ast.Tuple)
                and any(isinstance(e, ast.Constant) and e.value is None for e in node.value.elts)
            ):
                offenders.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
    assert not offenders, offenders


def test_every_test_file_make_test_compiled_runs_exists() -> None:
    lines = (ROOT / "tests" / "compiled.txt").read_text().splitlines()
    files = [ln for ln in lines if ln.strip() and not ln.startswith("#")]
    assert "tests/e2e/test_build.py" in files  # the one that proves the build is compiled
    assert not [f for f in files if not (ROOT / f).is_file()]
    assert len(files) == len(set(files))


def _optional_locals(func: ast.AST) -> set[str]:
    """Locals first bound to `None`, or declared with a union (`X | None`, `Optional`)."""
    names: set[str] = set()
    for node in ast.walk(func):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            shown = ast.unparse(node.annotation)
            if "|" in shown or "Optional" in shown:
                names.add(node.target.id)
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            if node.value.value is None:
                names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def test_no_listed_module_reads_in_a_finally_an_optional_its_try_narrowed() -> None:
    """`ticket: Ticket | None = None; try: ticket = await admit() ... finally: if ticket
    is not None`: compiled, the `finally` reads `ticket` with the type its `try` narrowed it
    to, and raises `TypeError: Ticket object expected; got None` when `admit` raised first
    (mypy 2.4.1; a rate-limited Responses WebSocket warm-up answered 500). Bind the value
    before the `try`, or settle in the handlers."""
    offenders = []
    for path in build.compiled_paths(ROOT):
        tree = ast.parse((ROOT / path).read_text())
        for func in ast.walk(tree):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            optional = _optional_locals(func)
            for node in ast.walk(func):
                if not isinstance(node, ast.Try) or not node.finalbody:
                    continue
                bound = {
                    n.id
                    for st in node.body
                    for n in ast.walk(st)
                    if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
                }
                read = {
                    n.id
                    for st in node.finalbody
                    for n in ast.walk(st)
                    if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
                }
                if names := sorted(bound & read & optional):
                    offenders.append(f"{path}:{node.lineno} {func.name}: {names}")
    assert not offenders, offenders


def test_no_listed_exception_class_has_class_level_attributes() -> None:
    """Compiled, an `Exception` subclass loses its class-level values: `status = 503`
    read `AttributeError` on every `ServiceUnavailable` (mypy 2.4.1), which is why
    `app/errors.py` stays interpreted. Set them in `__init__`, or keep the class there."""
    offenders = []
    for path in build.compiled_paths(ROOT):
        for node in ast.walk(ast.parse((ROOT / path).read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = {ast.unparse(b) for b in node.bases}
            if not any(b.endswith(("Exception", "Error")) for b in bases):
                continue
            assigns = [s for s in node.body if isinstance(s, (ast.Assign, ast.AnnAssign))]
            offenders += [f"{path}: {node.name}: {ast.unparse(s)}" for s in assigns]
    assert not offenders, offenders


# Records the gateway builds on every request. Their `__init__` must be written in their
# class: the compiled build runs a written one as C, while a dataclass's generated
# `__init__` (code compiled from a string) and a NamedTuple's constructor (a lambda) stay
# Python there: these eleven cost 60,000 instructions a request until issue #32's sixth
# pass. The cost guard would see one come back; this names it.
PER_REQUEST_RECORDS = (
    "app.pipeline.request:ClientRequest",
    "app.pipeline.trace:Trace",
    "app.pipeline.trace:Attempt",
    "app.pipeline.replies:Reply",
    "app.pipeline.replies:JsonAnswer",
    "app.limits.admission:Ticket",
    "app.limits.bucket:Decision",
    "app.billing.ledger:UsageEntry",
    "app.billing.prices:Tokens",
    "app.billing.budget_rules:Ask",
    "app.upstream.answer_usage:Usage",
)


def test_the_records_built_per_request_write_their_init_in_a_compiled_module() -> None:
    listed = {p.removesuffix(".py").replace("/", ".") for p in build.compiled_paths(ROOT)}
    for name in PER_REQUEST_RECORDS:
        module, _, cls_name = name.partition(":")
        assert module in listed, f"{module} is not compiled"
        cls = getattr(importlib.import_module(module), cls_name)
        assert not issubclass(cls, tuple), f"{name} is a NamedTuple"
        init = cls.__dict__.get("__init__")
        assert init is not None and inspect.getsourcefile(init) == inspect.getsourcefile(cls), (
            f"{name}: its __init__ is generated, not written in its class"
        )
