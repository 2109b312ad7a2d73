"""Determinism checker: static analysis of workflow bodies (``treadle check``).

A workflow body is replayed from the top on every claim (docs/adr/0003-replay-model.md), so
it must not read the clock, draw random numbers, sleep, touch files, processes, the
network, the environment or threads itself: those belong in a step, or go through the
context's journaled replacements (``ctx.now()``, ``ctx.uuid()``, ``ctx.random()``,
``ctx.sleep()``). This module finds such calls with Python's :mod:`ast`, without importing
or running the code.

What is checked: every function decorated with ``@workflow(...)`` from ``app.sdk``, and,
transitively, every function of the same module it calls directly (module-level helpers
and functions nested in the body). Functions handed to ``ctx.step`` / ``ctx.transaction``
(and ``compensate=`` / ``on_reject=``) run as steps and are *not* checked, nor are lambdas
passed there; the step's other arguments are evaluated in the body and are checked.
Imports are resolved through aliases (``import datetime as dt``, ``from time import time
as now``). A finding is silenced by a comment on its line: ``# treadle: allow[TRD101]``
(several codes separated by commas).

Codes are stable; see :data:`RULES`. The checker is a linter, not a proof: calls through
objects whose type it cannot see (a client passed in, ``getattr``) are not found.
"""

from __future__ import annotations

import ast
import importlib.util
import io
import re
import tokenize
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["RULES", "CheckError", "Finding", "Rule", "check_module", "check_source"]


@dataclass(frozen=True, slots=True)
class Rule:
    """One kind of nondeterminism: a stable code, a category and the fix to suggest."""

    code: str
    category: str
    replacement: str


RULES: dict[str, Rule] = {
    r.code: r
    for r in (
        Rule("TRD101", "clock", "use `await ctx.now()` (journaled database time)"),
        Rule(
            "TRD102",
            "randomness",
            "use `await ctx.random()` or `await ctx.uuid()` (journaled), or draw it in a step",
        ),
        Rule("TRD103", "sleep", "use `await ctx.sleep(seconds)` (a durable timer)"),
        Rule("TRD104", "file system", "do file and OS access in a step: `await ctx.step(fn, …)`"),
        Rule("TRD105", "process", "start processes in a step: `await ctx.step(fn, …)`"),
        Rule("TRD106", "network", "call the network in a step: `await ctx.step(fn, …)`"),
        Rule(
            "TRD107",
            "environment",
            "read the environment in a step, or pass the value in the workflow input",
        ),
        Rule(
            "TRD108",
            "threading",
            "run blocking work as a step (`await ctx.step(fn, …)`; sync steps run in a "
            "thread) or branch with `asyncio.gather(ctx.step(a), ctx.step(b))`",
        ),
    )
}

# Qualified names (after import resolution) and what they are. A trailing ``.*`` matches
# everything under a module or class; the longest match wins, and ``None`` marks a safe
# exception under a flagged prefix (``os.path.join`` under ``os.*``).
_CALLS: dict[str, str | None] = {
    # clock
    "time.time": "TRD101",
    "time.time_ns": "TRD101",
    "time.monotonic": "TRD101",
    "time.monotonic_ns": "TRD101",
    "time.perf_counter": "TRD101",
    "time.perf_counter_ns": "TRD101",
    "time.process_time": "TRD101",
    "time.process_time_ns": "TRD101",
    "time.thread_time": "TRD101",
    "time.localtime": "TRD101",
    "time.gmtime": "TRD101",
    "time.ctime": "TRD101",
    "time.asctime": "TRD101",
    "datetime.datetime.now": "TRD101",
    "datetime.datetime.utcnow": "TRD101",
    "datetime.datetime.today": "TRD101",
    "datetime.date.today": "TRD101",
    # randomness
    "random.*": "TRD102",
    "secrets.*": "TRD102",
    "uuid.uuid1": "TRD102",
    "uuid.uuid4": "TRD102",
    "uuid.uuid6": "TRD102",
    "uuid.uuid7": "TRD102",
    "os.urandom": "TRD102",
    "os.getrandom": "TRD102",
    "numpy.random.*": "TRD102",
    # sleep
    "time.sleep": "TRD103",
    "asyncio.sleep": "TRD103",
    "anyio.sleep": "TRD103",
    "trio.sleep": "TRD103",
    # files and the OS
    "open": "TRD104",
    "io.open": "TRD104",
    "builtins.open": "TRD104",
    "os.*": "TRD104",
    "os.path.*": "TRD104",
    "shutil.*": "TRD104",
    "tempfile.*": "TRD104",
    "glob.*": "TRD104",
    "fileinput.*": "TRD104",
    "aiofiles.*": "TRD104",
    # processes
    "subprocess.*": "TRD105",
    "os.system": "TRD105",
    "os.popen": "TRD105",
    "os.fork": "TRD105",
    "os.forkpty": "TRD105",
    "os.kill": "TRD105",
    "os.posix_spawn": "TRD105",
    "os.posix_spawnp": "TRD105",
    "asyncio.create_subprocess_exec": "TRD105",
    "asyncio.create_subprocess_shell": "TRD105",
    "multiprocessing.*": "TRD105",
    # network
    "httpx.*": "TRD106",
    "requests.*": "TRD106",
    "urllib.request.*": "TRD106",
    "urllib3.*": "TRD106",
    "aiohttp.*": "TRD106",
    "socket.*": "TRD106",
    "http.client.*": "TRD106",
    "smtplib.*": "TRD106",
    "ftplib.*": "TRD106",
    "asyncio.open_connection": "TRD106",
    "asyncio.start_server": "TRD106",
    "asyncpg.*": "TRD106",
    "psycopg.*": "TRD106",
    "psycopg2.*": "TRD106",
    # environment
    "os.environ.*": "TRD107",
    "os.environb.*": "TRD107",
    "os.getenv": "TRD107",
    "os.getenvb": "TRD107",
    "os.putenv": "TRD107",
    "os.unsetenv": "TRD107",
    # threading
    "threading.*": "TRD108",
    "_thread.*": "TRD108",
    "concurrent.futures.*": "TRD108",
    "asyncio.to_thread": "TRD108",
    # pure helpers under flagged prefixes
    "os.path.join": None,
    "os.path.basename": None,
    "os.path.dirname": None,
    "os.path.split": None,
    "os.path.splitext": None,
    "os.path.normpath": None,
    "os.path.normcase": None,
    "os.path.commonpath": None,
    "os.path.commonprefix": None,
    "os.path.isabs": None,
    "os.fspath": None,
    "os.fsencode": None,
    "os.fsdecode": None,
}

# Names whose mere use (not only a call) reads process state.
_READS: dict[str, str] = {
    "os.environ": "TRD107",
    "os.environb": "TRD107",
    "sys.argv": "TRD107",
}

# Methods recognised on any object: their names are specific enough to pathlib, event
# loops and sockets that a false positive is unlikely.
_METHODS: dict[str, str] = {
    "read_text": "TRD104",
    "write_text": "TRD104",
    "read_bytes": "TRD104",
    "write_bytes": "TRD104",
    "run_in_executor": "TRD108",
}

# ctx methods whose first argument (and these keywords) run as steps, not in the body.
_STEP_METHODS = {"step": ("compensate",), "transaction": (), "approval": ("on_reject",)}
_WORKFLOW_DECORATORS = {"app.sdk.workflow", "app.sdk.workflow.workflow"}
_ALLOW = re.compile(r"#\s*treadle:\s*allow\[([A-Za-z0-9_,\s]+)\]")


@dataclass(frozen=True, slots=True)
class Finding:
    """One nondeterministic call in a workflow body.

    Attributes:
        code: stable rule code (``TRD101`` …), see :data:`RULES`.
        category: ``clock``, ``randomness``, ``sleep``, ``file system``, ``process``,
            ``network``, ``environment`` or ``threading``.
        path: the source file.
        line: 1-based line.
        column: 1-based column.
        call: the resolved name (``datetime.datetime.now``).
        workflow: the workflow function whose body reaches it.
        function: the function it is in (the workflow, or a helper it calls).
        message: what to do instead.
    """

    code: str
    category: str
    path: str
    line: int
    column: int
    call: str
    workflow: str
    function: str
    message: str

    def render(self) -> str:
        """``path:line:col: CODE message`` (the format of ruff and mypy)."""
        return f"{self.path}:{self.line}:{self.column}: {self.code} {self.message}"

    def as_dict(self) -> dict[str, Any]:
        """JSON-able form (``--format json``)."""
        return asdict(self)


class CheckError(Exception):
    """A module cannot be found or parsed."""


# --- import resolution ------------------------------------------------------------------


def _aliases(tree: ast.Module, module_name: str) -> dict[str, str]:
    """Map each name bound by an import anywhere in the module to its qualified name."""
    found: dict[str, str] = {}
    package = module_name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    found[alias.asname] = alias.name
                else:
                    root = alias.name.split(".")[0]
                    found[root] = root
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".") if package else []
                parts = parts[: len(parts) - (node.level - 1)] if node.level > 1 else parts
                base = ".".join([*parts, base] if base else parts)
            for alias in node.names:
                if alias.name != "*":
                    found[alias.asname or alias.name] = f"{base}.{alias.name}"
    return found


def _dotted(node: ast.expr) -> list[str] | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return parts[::-1]
    return None


def _match(table: dict[str, str | None], name: str) -> str | None:
    if name in table:
        return table[name]
    parts = name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        key = ".".join(parts[:i]) + ".*"
        if key in table:
            return table[key]
    return None


def _suppressions(source: str) -> dict[int, set[str]]:
    allowed: dict[int, set[str]] = {}
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                found = _ALLOW.search(tok.string)
                if found:
                    codes = {c.strip().upper() for c in found[1].split(",") if c.strip()}
                    allowed.setdefault(tok.start[0], set()).update(codes)
    except (tokenize.TokenError, SyntaxError):  # the parse already succeeded; be lenient
        pass
    return allowed


# --- the analysis -----------------------------------------------------------------------

_FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass
class _Module:
    path: str
    aliases: dict[str, str]
    functions: dict[str, _FunctionNode]
    allowed: dict[int, set[str]]
    findings: list[Finding] = field(default_factory=list)
    seen: set[tuple[int, int, str]] = field(default_factory=set)

    def resolve(self, node: ast.expr, local: set[str]) -> str | None:
        parts = _dotted(node)
        if parts is None:
            return None
        root = parts[0]
        if root in local:
            return None  # a parameter or local variable shadows any import
        if root in self.aliases:
            return ".".join([self.aliases[root], *parts[1:]])
        if len(parts) == 1 and root == "open":
            return root  # the builtin, unless shadowed
        return None


def _is_workflow(fn: _FunctionNode, module: _Module) -> bool:
    for deco in fn.decorator_list:
        target = deco.func if isinstance(deco, ast.Call) else deco
        if module.resolve(target, set()) in _WORKFLOW_DECORATORS:
            return True
    return False


def _locals(fn: _FunctionNode | ast.Lambda) -> set[str]:
    args = fn.args
    names = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}
    names |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
    for node in ast.walk(fn) if isinstance(fn, ast.Lambda) else _walk_body(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def _walk_body(fn: _FunctionNode) -> Iterator[ast.AST]:
    """Nodes of a function's own body (lambdas included), not of nested defs or classes."""
    stack: list[ast.AST] = list(reversed(fn.body))
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        stack.extend(reversed(list(ast.iter_child_nodes(node))))


class _BodyVisitor:
    """Checks one function's body; queues the same-module functions it calls."""

    def __init__(self, module: _Module, workflow: str, fn: _FunctionNode) -> None:
        self.module = module
        self.workflow = workflow
        self.fn = fn
        self.local = _locals(fn)
        self.nested: dict[str, _FunctionNode] = {
            n.name: n
            for n in _walk_body(fn)
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
        }
        # Nested defs are callable helpers, not shadowing variables.
        self.local -= set(self.nested)
        self.calls: list[_FunctionNode] = []
        self.skip: set[int] = set()  # ids of nodes that run as steps

    def run(self) -> list[_FunctionNode]:
        for node in _walk_body(self.fn):
            if id(node) in self.skip:
                continue
            if isinstance(node, ast.Call):
                self._call(node)
            elif isinstance(node, ast.Attribute | ast.Name):
                self._read(node)
        return self.calls

    def _call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in _STEP_METHODS:
            receiver = func.value
            if isinstance(receiver, ast.Name) and receiver.id in self.local:
                # ctx.step(fn, *args): fn runs as a step; its args are evaluated here.
                if node.args and isinstance(node.args[0], ast.Lambda):
                    self._skip_tree(node.args[0])
                for kw in node.keywords:
                    if kw.arg in _STEP_METHODS[func.attr] and isinstance(kw.value, ast.Lambda):
                        self._skip_tree(kw.value)
                return
        if isinstance(func, ast.Attribute) and func.attr in _METHODS:
            receiver = func.value.func if isinstance(func.value, ast.Call) else func.value
            owner = self.module.resolve(receiver, self.local) or "<object>"
            name = f"{owner}.{func.attr}"
            self._report(node, _METHODS[func.attr], name)
            return
        if isinstance(func, ast.Name):
            if func.id in self.nested:
                self.calls.append(self.nested[func.id])
                return
            if func.id in self.module.functions and func.id not in self.local:
                self.calls.append(self.module.functions[func.id])
                return
        resolved = self.module.resolve(func, self.local)
        if resolved is None:
            return
        code = _match(_CALLS, resolved)
        if code is not None:
            self._report(node, code, resolved)

    def _read(self, node: ast.Attribute | ast.Name) -> None:
        name = self.module.resolve(node, self.local)
        if name is not None and name in _READS:
            self._report(node, _READS[name], name)

    def _skip_tree(self, node: ast.AST) -> None:
        self.skip.update(id(n) for n in ast.walk(node))

    def _report(self, node: ast.expr, code: str, name: str) -> None:
        line, col = node.lineno, node.col_offset + 1
        key = (line, col, code)
        if key in self.module.seen or code in self.module.allowed.get(line, set()):
            return
        self.module.seen.add(key)
        rule = RULES[code]
        where = "" if self.fn.name == self.workflow else f" (in {self.fn.name}(), which it calls)"
        self.module.findings.append(
            Finding(
                code=code,
                category=rule.category,
                path=self.module.path,
                line=line,
                column=col,
                call=name,
                workflow=self.workflow,
                function=self.fn.name,
                message=f"{rule.category}: `{name}` in workflow {self.workflow!r}{where}; "
                f"{rule.replacement}",
            )
        )


def check_source(source: str, path: str = "<string>", module_name: str = "") -> list[Finding]:
    """Check the workflows defined in ``source``.

    Args:
        source: Python source text.
        path: shown in findings.
        module_name: the module's dotted name (resolves relative imports).

    Returns:
        Findings sorted by line and column (empty when the workflows are clean).

    Raises:
        CheckError: the source does not parse.
    """
    try:
        tree = ast.parse(source, filename=path)
    except SyntaxError as exc:
        raise CheckError(f"{path}:{exc.lineno}: cannot parse: {exc.msg}") from exc
    module = _Module(
        path=path,
        aliases=_aliases(tree, module_name),
        functions={
            n.name: n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
        },
        allowed=_suppressions(source),
    )
    for fn in tree.body:
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) and _is_workflow(fn, module):
            done: set[int] = set()
            queue: list[_FunctionNode] = [fn]
            while queue:
                current = queue.pop()
                if id(current) in done:
                    continue
                done.add(id(current))
                queue.extend(_BodyVisitor(module, fn.name, current).run())
    return sorted(module.findings, key=lambda f: (f.line, f.column, f.code))


def module_path(target: str) -> tuple[Path, str]:
    """Resolve a dotted module name (or a ``.py`` path) to its file, without running it.

    Returns:
        ``(file, dotted name)``.

    Raises:
        CheckError: not found, or not a Python source file.
    """
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise CheckError(f"{target}: no such file")
        return path, path.stem
    try:
        spec = importlib.util.find_spec(target)
    except (ImportError, ValueError) as exc:
        raise CheckError(f"{target}: cannot find module ({exc})") from exc
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        raise CheckError(f"{target}: no such Python module")
    return Path(spec.origin), target


def check_module(target: str) -> list[Finding]:
    """Check one module given as a dotted name (``examples.orders``) or a ``.py`` path.

    Raises:
        CheckError: the module cannot be found or parsed.
    """
    path, name = module_path(target)
    return check_source(path.read_text(encoding="utf-8"), str(path), name)
