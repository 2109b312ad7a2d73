"""The DAG layout of the console's Run page (app/console/graph.py)."""

from __future__ import annotations

from app.client import DagNode
from app.console.graph import COLUMN_GAP, NODE_WIDTH, layout


def test_columns_by_depth_edges_from_parents_and_statuses() -> None:
    graph = [
        DagNode(name="a", after=[]),
        DagNode(name="b", after=["a"]),
        DagNode(name="c", after=["a"]),
        DagNode(name="d", after=["b", "c"]),
        DagNode(name="e", after=["a", "d"]),  # depth from its deepest parent
    ]
    drawn = layout(graph, {"a": "succeeded", "b": "failed"})
    assert drawn is not None
    by_name = {n.name: n for n in drawn.nodes}
    column = {n: (p.x - by_name["a"].x) // (NODE_WIDTH + COLUMN_GAP) for n, p in by_name.items()}
    assert column == {"a": 0, "b": 1, "c": 1, "d": 2, "e": 3}
    assert by_name["b"].y < by_name["c"].y  # same column: in registration order
    assert [by_name[n].status for n in "abcde"] == ["succeeded", "failed"] + ["pending"] * 3
    assert len(drawn.edges) == 6
    assert all(e.x1 < e.x2 for e in drawn.edges)  # every edge runs left to right
    assert drawn.width >= by_name["e"].x + NODE_WIDTH
    assert drawn.height >= by_name["c"].y + drawn.node_height


def test_long_names_unknown_parents_and_empty_graphs() -> None:
    assert layout([], {}) is None
    drawn = layout([DagNode(name="x" * 40, after=["ghost"])], {})
    assert drawn is not None and not drawn.edges
    (node,) = drawn.nodes
    assert node.name == "x" * 40 and node.label.endswith("…") and len(node.label) == 22
