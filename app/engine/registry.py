"""Workflow definitions a worker can run, loaded from ``--handlers`` modules."""

from __future__ import annotations

import importlib
import os
import traceback
from collections.abc import Iterable, Sequence
from types import ModuleType
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from app.core import json
from app.core.errors import HandlersNotLoaded
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
            HandlersNotLoaded: a module cannot be imported, or defines no workflow.
            ValueError: a duplicate exists.
        """
        found: list[WorkflowDefinition[Any, Any]] = []
        for name in module_names:
            module = import_handler_module(name)
            defs = definitions_in(module)
            if not defs:
                raise no_workflows(name)
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
        """Upsert every definition: kind, access, schemas, states, queues, event trigger."""
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
                graph=None if d.graph is None else json.dumps(d.graph),
                queue_controls=json.dumps(d.queue.to_json()),
                on_event=d.on_event,
                event_filter=None if d.on_event is None else json.dumps(d.event_filter or {}),
            )


# Treadle's own top-level package (docs/adr/0015-the-app-package-name.md).
TREADLE_PACKAGE = __name__.split(".", 1)[0]


def no_workflows(name: str) -> HandlersNotLoaded:
    """The refusal of a ``--handlers`` module that imports but registers no workflow.

    One line saying what was wrong and what to do. A module of Treadle's own package
    (``app.sdk``: what handlers import, not handlers) says so; any other module is told
    to be the one whose top level binds the ``@workflow`` functions (or imports them).
    """
    if name.split(".", 1)[0] == TREADLE_PACKAGE:
        return HandlersNotLoaded(
            f"handler module {name!r} registers no workflows: it is part of Treadle itself "
            f"(package {TREADLE_PACKAGE!r}); pass the module that defines your @workflow "
            "handlers, e.g. --handlers myproject.workflows (docs/your-project.md)",
            module=name,
        )
    return HandlersNotLoaded(
        f"handler module {name!r} registers no workflows (no @workflow, state machine or "
        "DAG at its top level): pass the module that defines your @workflow handlers, or "
        "import them into this one",
        module=name,
    )


def import_handler_module(name: str) -> ModuleType:
    """Import one ``--handlers`` module, turning any failure into one line naming it.

    A worker that cannot load its handlers must say which module and why, not print a
    traceback from deep inside importlib: the usual causes are a typo, a package not
    installed, the wrong working directory, or a team package named like Treadle's own.

    Args:
        name: dotted module name, e.g. ``theirpkg.flows``.

    Returns:
        The imported module.

    Raises:
        HandlersNotLoaded: the module (or a package on its path) does not exist, or
            importing it raised; ``detail`` is one line with the module, the cause and,
            for an exception raised by the module's code, the file and line.
    """
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (name == missing or name.startswith(missing + ".")):
            if name.split(".", 1)[0] == TREADLE_PACKAGE:
                raise HandlersNotLoaded(
                    f"handler module {name!r} not found: {TREADLE_PACKAGE!r} is Treadle's own "
                    f"package, so a package of yours named {TREADLE_PACKAGE!r} cannot be "
                    "imported beside it; give yours another name (docs/your-project.md)",
                    module=name,
                ) from None
            raise HandlersNotLoaded(
                f"handler module {name!r} not found (no module named {missing!r} in the "
                f"working directory {os.getcwd()} or the installed packages): check the "
                "name, install your package, or run from the directory that holds it",
                module=name,
            ) from None
        raise HandlersNotLoaded(
            f"cannot import handler module {name!r}: {exc}{_raised_at(exc)}", module=name
        ) from None
    except Exception as exc:  # noqa: BLE001 - any error of the module's own code, one line
        raise HandlersNotLoaded(
            f"cannot import handler module {name!r}: {type(exc).__name__}: {exc}{_raised_at(exc)}",
            module=name,
        ) from None


def _raised_at(exc: BaseException) -> str:
    """`` (file:line)`` of the innermost frame that raised ``exc``, or ``""``."""
    # importlib's own frames (``<frozen importlib._bootstrap>``) say nothing to the author.
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<")]
    if isinstance(exc, SyntaxError) or not frames:
        return ""  # a SyntaxError's message already names its file and line
    return f" ({frames[-1].filename}:{frames[-1].lineno})"
