"""A workflow whose input schema exercises the start form (imported by the worker).

Every kind of field the generator covers, the ones it does not (nested object, list,
free JSON), and hostile text in the schema's titles and descriptions.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field

from app.sdk import WorkflowContext, workflow

HOSTILE_DESCRIPTION = "Shown as text: <script>alert('schema')</script> \u202eevil"


class Color(StrEnum):
    """An enum field (Pydantic writes it as a ``$ref`` to ``$defs``)."""

    RED = "red"
    GREEN = "green"


class Address(BaseModel):
    """A nested object: the form falls back to a JSON textarea for it."""

    street: str
    zip_code: str = Field(max_length=10)


class FormInput(BaseModel):
    """The start form's test input."""

    title: str = Field(min_length=1, description=HOSTILE_DESCRIPTION)
    count: int = Field(ge=0)
    ratio: float = 0.5
    urgent: bool = False
    color: Color = Color.GREEN
    tags: list[str] = Field(default_factory=list)
    address: Address
    note: str | None = None


@workflow("console-form")
async def form_flow(ctx: WorkflowContext, data: FormInput) -> dict[str, Any]:
    """Return the input it was given (so a test can compare it with the form)."""
    return data.model_dump(mode="json")


class NoFields(BaseModel):
    """An input without properties: the form is one JSON textarea for the whole input."""


@workflow("console-empty")
async def empty_flow(ctx: WorkflowContext, data: NoFields) -> str:
    """Nothing to do: it completes."""
    return "done"
