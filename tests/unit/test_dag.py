"""Typed DAG builder: definition-time type checks and registration (no database)."""

from __future__ import annotations

import types
from collections.abc import Sequence
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy.ext.asyncio import AsyncSession

from app.sdk import DagDefinitionError, flow, join
from app.sdk.dag import _assignable
from app.sdk.workflow import definitions_in


class Req(BaseModel):
    n: int


class Other(BaseModel):
    s: str


class Base(BaseModel):
    x: int = 0


class Derived(Base):
    pass


async def start(req: Req) -> int:
    return req.n


async def double(x: int) -> int:
    return 2 * x


async def shout(s: str) -> str:
    return s.upper()


async def as_text(x: int) -> str:
    return str(x)


async def add(a: int, b: int) -> int:
    return a + b


async def unannotated(x):  # type: ignore[no-untyped-def]
    return x


async def no_return(x: int):  # type: ignore[no-untyped-def]
    return x


async def store(tx: AsyncSession, x: int) -> int:
    return x


def test_type_mismatch_names_both_nodes_and_types() -> None:
    root = flow("dag-mismatch", start)
    with pytest.raises(DagDefinitionError) as info:
        root.then(shout)
    message = str(info.value)
    assert "'start' returns int" in message
    assert "node 'shout' parameter 's' expects str" in message
    assert "dag-mismatch" in message
    assert isinstance(info.value, TypeError)


def test_join_mismatch_names_the_branch() -> None:
    root = flow("dag-join-mismatch", start)
    with pytest.raises(
        DagDefinitionError, match=r"'as_text' returns str, but node 'add' parameter 'b' expects int"
    ):
        join(root.then(double), root.then(as_text)).then(add)


def test_join_arity_and_foreign_branches() -> None:
    a = flow("dag-a", start)
    b = flow("dag-b", start)
    with pytest.raises(DagDefinitionError, match="different DAGs"):
        join(a, b)
    with pytest.raises(DagDefinitionError, match="at least two"):
        join(a)
    with pytest.raises(DagDefinitionError, match=r"takes 1 value parameter\(s\) but is fed by 2"):
        join(a.then(double), a.then(double, name="double2")).then(double, name="d3")


def test_annotations_are_required() -> None:
    root = flow("dag-annotations", start)
    with pytest.raises(DagDefinitionError, match=r"'x'.*need a type annotation"):
        root.then(unannotated)
    with pytest.raises(DagDefinitionError, match="'no_return' needs a return annotation"):
        root.then(no_return)


def test_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="timeout must be > 0"):
        flow("dag-timeout", start).then(double, timeout=0)


def test_root_input_must_be_a_model() -> None:
    with pytest.raises(DagDefinitionError, match="must be annotated with a pydantic BaseModel"):
        flow("dag-root", double)


def test_duplicate_node_names_are_refused() -> None:
    root = flow("dag-dupes", start)
    first = root.then(double)
    with pytest.raises(DagDefinitionError, match="'double' is already used"):
        first.then(double)
    with pytest.raises(DagDefinitionError, match="two different nodes are named 'double'"):
        join(first, root.then(double)).then(add)
    # An explicit name resolves it.
    total = join(first, root.then(double, name="double_again")).then(add)
    assert [n.name for n in total.nodes] == ["start", "double", "double_again", "add"]


def test_transactional_node_takes_the_session_first() -> None:
    root = flow("dag-tx", start)
    node = root.then(store, transaction=True)
    assert node.node.transaction
    with pytest.raises(DagDefinitionError, match="takes 2 value parameter"):
        root.then(store)  # without transaction=True the session counts as a value


def test_builder_is_immutable_and_levels_are_deterministic() -> None:
    root = flow("dag-levels", start)
    left = root.then(double, name="left")
    right = root.then(as_text, name="right")
    assert root.node.parents == ()
    assert left.node.parents == (root.node,) and right.node.parents == (root.node,)

    async def combine(a: int, b: str) -> str:
        return f"{a}{b}"

    end = join(left, right).then(combine)
    assert [n.name for n in end.nodes] == ["start", "left", "right", "combine"]
    definition = end.definition
    assert definition is end.definition  # built once
    assert (definition.name, definition.kind, definition.version) == ("dag-levels", "dag", "1")
    assert definition.input_model is Req
    assert definition.output_schema == {"type": "string"}


def test_module_registers_only_each_dag_end() -> None:
    module = types.ModuleType("handlers")
    import examples.order_total as example

    defs = definitions_in(example)
    assert [(d.name, d.kind) for d in defs] == [("order-total", "dag")]
    assert defs[0] is example.order_total.definition
    assert [n.name for n in example.order_total.nodes] == [
        "load_order",
        "price_items",
        "price_shipping",
        "add",
    ]
    # A branch whose result nothing uses would be a second end: refused.
    root = flow("dag-two-ends", start)
    module.root = root  # type: ignore[attr-defined]
    module.a = root.then(double)  # type: ignore[attr-defined]
    module.b = root.then(as_text)  # type: ignore[attr-defined]
    with pytest.raises(DagDefinitionError, match="two end nodes"):
        definitions_in(module)


@pytest.mark.parametrize(
    ("source", "target", "ok"),
    [
        (int, int, True),
        (int, float, True),
        (float, int, False),
        (bool, int, True),
        (Derived, Base, True),
        (Base, Derived, False),
        (int, int | None, True),
        (int | None, int, False),
        (None, int | None, True),
        (list[int], list[int], True),
        (list[int], Sequence[int], True),
        (list[int], list[str], False),
        (list[int], list, True),
        (dict[str, int], dict[str, float], True),
        (tuple[int, ...], tuple[int, ...], True),
        (Any, str, True),
        (str, Any, True),
        (Req, Other, False),
    ],
)
def test_assignable(source: Any, target: Any, ok: bool) -> None:
    assert _assignable(source, target) is ok


def test_access_is_declared_on_the_root_and_kept_by_every_node() -> None:
    assert flow("d-plain", start).then(double).definition.access == "tenant"
    root = flow("d-owned", start, access="owner")
    end = join(root.then(double), root.then(double, name="again")).then(add)
    assert end.definition.access == "owner"
    with pytest.raises(ValueError, match="access must be 'tenant' or 'owner'"):
        flow("d-bad", start, access="public")  # type: ignore[arg-type]
    other = flow("d-owned", start, node_name="start2")
    with pytest.raises(DagDefinitionError, match="different access"):
        join(root, other)
