"""A DAG run drawn as a graph: nodes in columns by depth, edges from parents, step status.

Input is the definition's registered graph (``GET /workflows`` → ``versions[].graph``:
nodes in execution order with the nodes they follow) and the run's steps (a node's step
id is its name). The output is plain geometry for ``templates/_dag.html``, which draws it
as inline SVG: no script and no layout library, so the page stays static and offline.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from app.client import DagNode

NODE_WIDTH = 168
NODE_HEIGHT = 44
COLUMN_GAP = 56
ROW_GAP = 18
MARGIN = 8
LABEL_CHARS = 22  # longer names are cut with "…" in the box (the full name is the title)


@dataclass(frozen=True, slots=True)
class PlacedNode:
    """A node's box: top-left corner ``x``, ``y`` in SVG user units, and what it shows."""

    name: str
    label: str
    status: str
    x: int
    y: int


@dataclass(frozen=True, slots=True)
class Edge:
    """A line from the middle of a parent's right side to a child's left side."""

    x1: int
    y1: int
    x2: int
    y2: int


@dataclass(frozen=True, slots=True)
class DagLayout:
    """The whole drawing: ``width`` × ``height`` user units, nodes and edges."""

    width: int
    height: int
    nodes: Sequence[PlacedNode]
    edges: Sequence[Edge]
    node_width: int = NODE_WIDTH
    node_height: int = NODE_HEIGHT


def layout(graph: Iterable[DagNode], statuses: Mapping[str, str]) -> DagLayout | None:
    """Place each node in the column of its depth (a root is depth 0) and connect parents.

    Args:
        graph: the registered nodes, each after its parents (the DAG's execution order).
        statuses: step status by step id; a node without a step shows ``pending``.

    Returns:
        The layout, or None for an empty graph. A parent name that is not a node of the
        graph (a corrupt registration) is ignored rather than drawn.
    """
    nodes = list(graph)
    if not nodes:
        return None
    depth: dict[str, int] = {}
    for node in nodes:
        known = [depth[p] for p in node.after if p in depth]
        depth[node.name] = 1 + max(known) if known else 0
    rows: dict[int, int] = {}
    placed: dict[str, PlacedNode] = {}
    for node in nodes:
        column = depth[node.name]
        row = rows.get(column, 0)
        rows[column] = row + 1
        label = node.name if len(node.name) <= LABEL_CHARS else node.name[: LABEL_CHARS - 1] + "…"
        placed[node.name] = PlacedNode(
            name=node.name,
            label=label,
            status=statuses.get(node.name, "pending"),
            x=MARGIN + column * (NODE_WIDTH + COLUMN_GAP),
            y=MARGIN + row * (NODE_HEIGHT + ROW_GAP),
        )
    edges = [
        Edge(
            x1=placed[p].x + NODE_WIDTH,
            y1=placed[p].y + NODE_HEIGHT // 2,
            x2=placed[n.name].x,
            y2=placed[n.name].y + NODE_HEIGHT // 2,
        )
        for n in nodes
        for p in n.after
        if p in placed
    ]
    columns = max(depth.values()) + 1
    tallest = max(rows.values())
    return DagLayout(
        width=2 * MARGIN + columns * NODE_WIDTH + (columns - 1) * COLUMN_GAP,
        height=2 * MARGIN + tallest * NODE_HEIGHT + (tallest - 1) * ROW_GAP,
        nodes=list(placed.values()),
        edges=edges,
    )
