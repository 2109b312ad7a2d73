"""Workflow definitions a worker can run, loaded from ``--handlers`` modules."""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from app.core import json
from app.db.queries import definitions as q
from app.sdk.workflow import WorkflowDefinition, definitions_in


class Registry:
    """An immutable map ``(name, version) -> WorkflowDefinition``.

    Raises:
        ValueError: two definitions share one name and version.
    """

    def __init__(self, definitions: Iterable[WorkflowDefinition[Any, Any]]) -> None:
        self._by_key: dict[tuple[str, str], WorkflowDefinition[Any, Any]] = {}
        for d in definitions:
            key = (d.name, d.version)
            if key in self._by_key and self._by_key[key] is not d:
                raise ValueError(f"workflow {d.name!r} version {d.version!r} defined twice")
            self._by_key[key] = d

    @classmethod
    def from_modules(cls, module_names: Sequence[str]) -> Registry:
        """Import each module and collect its top-level definitions.

        Raises:
            ImportError: a module cannot be imported.
            ValueError: a module defines no workflow, or a duplicate exists.
        """
        found: list[WorkflowDefinition[Any, Any]] = []
        for name in module_names:
            module = importlib.import_module(name)
            defs = definitions_in(module)
            if not defs:
                raise ValueError(f"handler module {name!r} defines no @workflow")
            found.extend(defs)
        return cls(found)

    def get(self, name: str, version: str) -> WorkflowDefinition[Any, Any] | None:
        """The definition for a run's pinned (name, version), or None."""
        return self._by_key.get((name, version))

    @property
    def keys(self) -> list[tuple[str, str]]:
        """Every registered ``(name, version)``."""
        return sorted(self._by_key)

    def __len__(self) -> int:
        return len(self._by_key)

    async def register(self, conn: AsyncConnection) -> None:
        """Upsert every definition: name, version, kind, access, schemas, states, queues."""
        for d in self._by_key.values():
            await q.upsert_definition(
                conn,
                name=d.name,
                version=d.version,
                kind=d.kind,
                access=d.access,
                input_schema=json.dumps(d.input_schema),
                output_schema=json.dumps(d.output_schema),
                states=None if d.states is None else json.dumps(d.states),
                queue_controls=json.dumps(d.queue.to_json()),
            )
