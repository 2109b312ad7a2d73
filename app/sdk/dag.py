"""Typed DAGs (DESIGN §1b): ``flow(name, fn).then(fn2)``, ``join(a, b).then(fn3)``.

A DAG is sugar over an imperative workflow: each node is a step (or a transactional step)
of one run, journaled under the node's name, so DAG runs share the journal, statuses and
API of every other run. The builder is immutable: ``then`` and ``join`` return new handles
and never change the graph they extend, so one handle can feed several branches.

Types are checked when the graph is built: every node's parameters and return type must be
annotated, and each parent's return type must be assignable to the parameter it feeds
(:class:`DagDefinitionError` otherwise, naming both nodes and both types).

Execution runs the graph level by level (a node's level is one more than its deepest
parent's): the nodes of one level start together with ``asyncio.gather`` over ``ctx.step``,
in the order they were declared. Why levels rather than starting each node the moment its
own parents finish: step ids are assigned in call order, and call order must not depend on
which branch happened to finish first, or a replay could meet the journal in another order
(``failure_nondeterminism``). Levels keep it fixed by the graph alone.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import types
import typing
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Union

from pydantic import BaseModel, TypeAdapter
from sqlalchemy.ext.asyncio import AsyncSession

from app.sdk.retry import RetryPolicy
from app.sdk.workflow import Access, WorkflowDefinition, _check_name, check_access

if TYPE_CHECKING:
    from app.sdk.context import WorkflowContext

_order = itertools.count()


class DagDefinitionError(TypeError):
    """A DAG that cannot be built, raised at definition time.

    Causes: mismatched types between adjacent nodes, a missing annotation, a duplicate node
    name, or branches of different DAGs joined.
    """


@dataclass(frozen=True, eq=False)
class Node:
    """One node: a function run as a step, fed by its parents' results (in order).

    Attributes:
        name: the node's step id (default the function's ``__name__``).
        fn: the function; a transactional node's function takes the session first.
        parents: nodes whose results are the function's arguments (none for a root, which
            receives the DAG's input).
        transaction: run as ``ctx.transaction`` (writes commit with the checkpoint).
        retry: retry policy (None = the engine default).
        timeout: seconds per attempt.
        returns: the function's return annotation.
        order: declaration order (breaks ties within a level, deterministically).
    """

    name: str
    fn: Callable[..., Any]
    parents: tuple[Node, ...]
    transaction: bool
    retry: RetryPolicy | None
    timeout: float | None
    returns: Any
    order: int = field(default_factory=lambda: next(_order))

    def ancestors(self) -> list[Node]:
        """This node and every node it depends on, each once."""
        seen: dict[int, Node] = {}
        stack = [self]
        while stack:
            node = stack.pop()
            if id(node) not in seen:
                seen[id(node)] = node
                stack.extend(node.parents)
        return list(seen.values())


@dataclass(frozen=True, eq=False)
class Flow:
    """A handle on one node of a DAG named ``dag``; extend it with :meth:`then`.

    A top-level ``Flow`` whose node no other top-level ``Flow`` of the same DAG depends on
    is the DAG's end: :func:`app.sdk.workflow.definitions_in` registers its
    :attr:`definition` like any ``@workflow``.
    """

    dag: str
    version: str
    node: Node
    input_model: type[BaseModel]
    access: Access = "tenant"

    def then(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        transaction: bool = False,
        retry: RetryPolicy | None = None,
        timeout: float | None = None,
    ) -> Flow:
        """Add a node fed by this node's result.

        Args:
            fn: ``fn(value) -> T`` (sync or async), or with ``transaction=True``
                ``async def fn(tx: AsyncSession, value) -> T``.
            name: node name (its step id); default ``fn.__name__``.
            transaction: run the node as a transactional step (``ctx.transaction``).
            retry: the node's retry policy.
            timeout: seconds per attempt.

        Returns:
            A new handle on the new node (this one is unchanged).

        Raises:
            DagDefinitionError: ``fn``'s parameter does not accept this node's return type,
                an annotation is missing, or the name is taken in this DAG.
            ValueError: ``timeout`` is not positive.
        """
        return _extend(self, [self], fn, name, transaction, retry, timeout)

    @property
    def definition(self) -> WorkflowDefinition[Any, Any]:
        """The workflow definition that runs the DAG ending at this node."""
        return _definition(self)

    @property
    def nodes(self) -> list[Node]:
        """Every node of the DAG ending here, in execution order (level, declaration)."""
        return [n for level in _levels(self.node) for n in level]


@dataclass(frozen=True, eq=False)
class Join:
    """Branches waiting for a node that takes all their results: see :func:`join`."""

    branches: tuple[Flow, ...]

    def then(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        transaction: bool = False,
        retry: RetryPolicy | None = None,
        timeout: float | None = None,
    ) -> Flow:
        """Add a node fed by every branch's result, as positional arguments in order.

        Args:
            fn: ``fn(a, b, …) -> T`` taking one argument per branch (after ``tx`` when
                ``transaction=True``).
            name: node name; default ``fn.__name__``.
            transaction: run the node as a transactional step.
            retry: the node's retry policy.
            timeout: seconds per attempt.

        Returns:
            A handle on the new node.

        Raises:
            DagDefinitionError: as :meth:`Flow.then`, per branch.
        """
        first = self.branches[0]
        return _extend(
            first,
            list(self.branches),
            fn,
            name,
            transaction,
            retry,
            timeout,
        )


def flow(
    name: str,
    fn: Callable[..., Any],
    *,
    version: int | str = 1,
    node_name: str | None = None,
    transaction: bool = False,
    retry: RetryPolicy | None = None,
    timeout: float | None = None,
    access: Access = "tenant",
) -> Flow:
    """Start a DAG workflow called ``name`` whose first node is ``fn(input)``.

    Args:
        name: workflow name (as for ``@workflow``).
        fn: the root node; its (first value) parameter must be annotated with a pydantic
            ``BaseModel``: the DAG's input, validated on submit like any workflow input.
        version: definition version.
        node_name: the root node's name; default ``fn.__name__``.
        transaction: run the root as a transactional step.
        retry: the root's retry policy.
        timeout: seconds per attempt.
        access: who may see and act on the DAG's runs, as for ``@workflow``:
            ``"tenant"`` (default) or ``"owner"`` (only the submitting subject). Every
            node extending this root belongs to the same definition, so shares it.

    Returns:
        A handle on the root node; extend it with :meth:`Flow.then` or :func:`join`.

    Raises:
        DagDefinitionError: the root's input is not a pydantic model, or an annotation is
            missing.
        ValueError: the name, version or access is malformed, or ``timeout`` is not
            positive.
    """
    _check_name(name)
    version_text = str(version)
    if not version_text or len(version_text) > 64:
        raise ValueError("workflow version must be 1..64 characters")
    check_access(f"flow({name!r})", access)
    label = node_name or _fn_name(fn)
    params, returns = _signature(name, label, fn, transaction, timeout)
    if len(params) != 1:
        raise DagDefinitionError(
            f"DAG {name!r}: root node {label!r} must take exactly one input parameter"
            f"{' after the session' if transaction else ''}, got {len(params)}"
        )
    pname, ptype = params[0]
    if not (isinstance(ptype, type) and issubclass(ptype, BaseModel)):
        raise DagDefinitionError(
            f"DAG {name!r}: root node {label!r} parameter {pname!r} must be annotated with "
            f"a pydantic BaseModel (the workflow input), got {_show(ptype)}"
        )
    node = Node(label, fn, (), transaction, retry, timeout, returns)
    return Flow(name, version_text, node, ptype, access)


def join(*branches: Flow) -> Join:
    """Wait for several branches of one DAG; ``.then(fn)`` receives all their results.

    Independent branches run in parallel (DESIGN §1b).

    Raises:
        DagDefinitionError: fewer than two branches, or branches of different DAGs (or
            of roots declaring different inputs or access).
    """
    if len(branches) < 2:
        raise DagDefinitionError("join() needs at least two branches")
    first = branches[0]
    for b in branches[1:]:
        if (b.dag, b.version) != (first.dag, first.version):
            raise DagDefinitionError(
                f"join() of different DAGs: {first.dag!r}@{first.version} and {b.dag!r}@{b.version}"
            )
        if b.input_model is not first.input_model:
            raise DagDefinitionError(
                f"DAG {first.dag!r}: joined branches take different inputs "
                f"({first.input_model.__name__} and {b.input_model.__name__})"
            )
        if b.access != first.access:
            raise DagDefinitionError(
                f"DAG {first.dag!r}: joined branches declare different access "
                f"({first.access!r} and {b.access!r})"
            )
    return Join(tuple(branches))


def dag_definitions(values: Iterable[object]) -> list[WorkflowDefinition[Any, Any]]:
    """The definitions of the DAGs among ``values`` (a module's top-level objects).

    Only each DAG's end is a definition: a ``Flow`` that another ``Flow`` of the same DAG
    depends on is an intermediate handle.

    Raises:
        DagDefinitionError: one DAG has two ends (a branch whose result nothing uses).
    """
    flows = [v for v in values if isinstance(v, Flow)]
    inner: set[int] = set()
    for f in flows:
        inner.update(id(n) for n in f.node.ancestors() if n is not f.node)
    ends: dict[tuple[str, str], Flow] = {}
    for f in flows:
        if id(f.node) in inner:
            continue
        key = (f.dag, f.version)
        other = ends.get(key)
        if other is not None and other.node is not f.node:
            raise DagDefinitionError(
                f"DAG {f.dag!r} version {f.version!r} has two end nodes, {other.node.name!r} "
                f"and {f.node.name!r}: join them, or give one branch its own DAG name"
            )
        ends[key] = f
    return [f.definition for f in ends.values()]


# --- building --------------------------------------------------------------------------


def _fn_name(fn: Callable[..., Any]) -> str:
    name = getattr(fn, "__name__", None)
    if not isinstance(name, str) or name == "<lambda>":
        raise DagDefinitionError(f"cannot name DAG node {fn!r}; pass name=")
    return name


def _signature(
    dag: str, label: str, fn: Callable[..., Any], transaction: bool, timeout: float | None
) -> tuple[list[tuple[str, Any]], Any]:
    """The node's value parameters ``[(name, annotation)]`` and its return annotation."""
    if timeout is not None and timeout <= 0:
        raise ValueError(f"DAG {dag!r}: node {label!r} timeout must be > 0 seconds")
    if transaction and not inspect.iscoroutinefunction(fn):
        raise DagDefinitionError(
            f"DAG {dag!r}: transactional node {label!r} must be an async def function"
        )
    try:
        hints = typing.get_type_hints(fn)
        sig = inspect.signature(fn)
    except (NameError, TypeError, ValueError) as exc:
        raise DagDefinitionError(
            f"DAG {dag!r}: cannot read the type hints of node {label!r}: {exc}"
        ) from exc
    params = [
        p for p in sig.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if transaction:
        if not params:
            raise DagDefinitionError(
                f"DAG {dag!r}: transactional node {label!r} must take the session first"
            )
        session = hints.get(params[0].name, AsyncSession)
        if session is not AsyncSession:
            raise DagDefinitionError(
                f"DAG {dag!r}: transactional node {label!r} first parameter must be the "
                f"AsyncSession, annotated {_show(session)}"
            )
        params = params[1:]
    missing = [p.name for p in params if p.name not in hints]
    if missing:
        raise DagDefinitionError(
            f"DAG {dag!r}: node {label!r} parameter(s) {', '.join(map(repr, missing))} need "
            "a type annotation"
        )
    if "return" not in hints:
        raise DagDefinitionError(f"DAG {dag!r}: node {label!r} needs a return annotation")
    return [(p.name, hints[p.name]) for p in params], hints["return"]


def _extend(
    first: Flow,
    parents: Sequence[Flow],
    fn: Callable[..., Any],
    name: str | None,
    transaction: bool,
    retry: RetryPolicy | None,
    timeout: float | None,
) -> Flow:
    dag = first.dag
    label = name or _fn_name(fn)
    params, returns = _signature(dag, label, fn, transaction, timeout)
    if len(params) != len(parents):
        fed = ", ".join(repr(p.node.name) for p in parents)
        raise DagDefinitionError(
            f"DAG {dag!r}: node {label!r} takes {len(params)} value parameter(s) but is fed "
            f"by {len(parents)} node(s) ({fed})"
        )
    for parent, (pname, ptype) in zip(parents, params, strict=True):
        if not _assignable(parent.node.returns, ptype):
            raise DagDefinitionError(
                f"DAG {dag!r}: node {parent.node.name!r} returns "
                f"{_show(parent.node.returns)}, but node {label!r} parameter {pname!r} "
                f"expects {_show(ptype)}"
            )
    taken = {id(n): n.name for p in parents for n in p.node.ancestors()}
    if label in taken.values():
        raise DagDefinitionError(
            f"DAG {dag!r}: node name {label!r} is already used in this DAG; pass name="
        )
    names: dict[str, int] = {}
    for node_id, node_name in taken.items():
        if names.setdefault(node_name, node_id) != node_id:
            raise DagDefinitionError(
                f"DAG {dag!r}: two different nodes are named {node_name!r}; pass name="
            )
    node = Node(label, fn, tuple(p.node for p in parents), transaction, retry, timeout, returns)
    return Flow(dag, first.version, node, first.input_model, first.access)


def _show(tp: Any) -> str:
    if isinstance(tp, type) and typing.get_origin(tp) is None:
        return tp.__qualname__
    return repr(tp).replace("typing.", "")


def _assignable(source: Any, target: Any) -> bool:
    """Whether a value of static type ``source`` may be passed where ``target`` is expected.

    Nominal subtyping on classes (with PEP 484's int → float → complex promotion), unions on
    either side, ``Any`` on either side, and generics compared by origin (subclass) and
    argument (recursively); ``None`` matches ``None``/``Optional``.
    """
    if source is Any or target is Any or source == target:
        return True
    if source is None:
        source = type(None)
    if target is None:
        target = type(None)
    if _is_union(source):
        return all(_assignable(s, target) for s in typing.get_args(source))
    if _is_union(target):
        return any(_assignable(source, t) for t in typing.get_args(target))
    if target is float and source is int:
        return True
    if target is complex and source in (int, float):
        return True
    s_origin, t_origin = typing.get_origin(source), typing.get_origin(target)
    if s_origin is None and t_origin is None:
        return isinstance(source, type) and isinstance(target, type) and issubclass(source, target)
    s_base = s_origin or source
    t_base = t_origin or target
    if not (isinstance(s_base, type) and isinstance(t_base, type) and issubclass(s_base, t_base)):
        return False
    t_args = typing.get_args(target)
    if not t_args:
        return True  # e.g. list[int] into a bare list
    s_args = typing.get_args(source)
    if not s_args or len(s_args) != len(t_args):
        return False
    return all(
        (s is Ellipsis and t is Ellipsis) or _assignable(s, t)
        for s, t in zip(s_args, t_args, strict=True)
    )


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType)


# --- running ---------------------------------------------------------------------------


def _levels(end: Node) -> list[list[Node]]:
    level: dict[int, int] = {}

    def depth(node: Node) -> int:
        if id(node) not in level:
            level[id(node)] = 1 + max((depth(p) for p in node.parents), default=-1)
        return level[id(node)]

    nodes = end.ancestors()
    grouped: dict[int, list[Node]] = {}
    for node in nodes:
        grouped.setdefault(depth(node), []).append(node)
    return [sorted(grouped[d], key=lambda n: n.order) for d in sorted(grouped)]


# Keyed by the end node (identity): the registry compares definitions by identity, so a
# DAG's definition must be built once.
_definitions: dict[Node, WorkflowDefinition[Any, Any]] = {}


def _definition(end: Flow) -> WorkflowDefinition[Any, Any]:
    cached = _definitions.get(end.node)
    if cached is not None:
        return cached
    levels = _levels(end.node)

    async def body(ctx: WorkflowContext, input_value: BaseModel) -> Any:
        values: dict[int, Any] = {}
        for level in levels:
            # ctx.step/transaction assign step ids when called: here, in declaration order.
            calls = []
            for node in level:
                args = tuple(values[id(p)] for p in node.parents) or (input_value,)
                if node.transaction:
                    calls.append(
                        ctx.transaction(
                            node.fn,
                            *args,
                            name=node.name,
                            retry=node.retry,
                            timeout=node.timeout,
                        )
                    )
                else:
                    calls.append(
                        ctx.step(
                            node.fn,
                            *args,
                            name=node.name,
                            retry=node.retry,
                            timeout=node.timeout,
                        )
                    )
            results = await asyncio.gather(*calls)
            for node, result in zip(level, results, strict=True):
                values[id(node)] = result
        return values[id(end.node)]

    body.__qualname__ = f"dag[{end.dag}]"
    definition: WorkflowDefinition[Any, Any] = WorkflowDefinition(
        name=end.dag,
        version=end.version,
        fn=body,
        input_model=end.input_model,
        output_adapter=TypeAdapter(end.node.returns),
        kind="dag",
        access=end.access,
        graph=[
            {"name": node.name, "after": [p.name for p in node.parents]}
            for level in levels
            for node in level
        ],
    )
    _definitions[end.node] = definition
    return definition
