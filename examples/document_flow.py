"""Document review as a bounded state machine: Queued → Waiting (60 s) → Completed | Cancelled.

One run drives one document, its *parent* (the run's ``concurrency_key``, so at most one
review per document is active). Each transition reads and writes the ``documents`` table
through :func:`app.sdk.current_session`, in the same transaction that journals the new
state: a document row never says ``waiting`` unless the run is in ``Waiting``.

- ``Queued`` (initial): file the document as ``waiting`` (creating ``documents`` if
  missing) → ``Waiting``.
- ``Waiting``: after 60 s of database time, read the row: withdrawn meanwhile (an
  ``UPDATE documents SET status = 'withdrawn'`` by anyone) → ``Cancelled``; otherwise
  mark it ``completed`` → ``Completed(message)``.
- Cancelling the run marks the document ``cancelled`` (the compensation), committed
  before the run reports ``cancelled``.

Try it with ``treadle dev`` and::

    treadle runs start document-flow --input '{"title": "Q3 report"}' --concurrency-key doc-42
"""

from __future__ import annotations

from pydantic import BaseModel, Field
from sqlalchemy import text

from app.sdk import StateMachine, current_session, state_machine

REVIEW_SECONDS = 60

# Portable DDL (PostgreSQL and SQLite); the table lives in Treadle's database, which is
# what lets a transition commit its row and its state together.
CREATE_DOCUMENTS = """
CREATE TABLE IF NOT EXISTS documents (
    document_id VARCHAR(255) PRIMARY KEY,
    title VARCHAR(500) NOT NULL,
    status VARCHAR(32) NOT NULL,
    message TEXT,
    transitions INTEGER NOT NULL
)
"""


class DocumentInput(BaseModel):
    """Input of ``document-flow``: the document's title (its id is the run's parent)."""

    title: str = Field(min_length=1, max_length=500)


class Document(StateMachine):
    """States of one document under review."""


class Queued(Document):
    """Submitted; nothing written yet."""


class Waiting(Document):
    """Filed; waits ``REVIEW_SECONDS`` before the decision."""


class Completed(Document):
    """Reviewed (terminal)."""

    message: str


class Cancelled(Document):
    """Withdrawn before review ended (terminal)."""


async def _status(document_id: str) -> str | None:
    tx = current_session()
    row = await tx.execute(
        text("SELECT status FROM documents WHERE document_id = :id"), {"id": document_id}
    )
    status = row.scalar()
    return None if status is None else str(status)


async def _set_status(document_id: str, status: str, message: str | None = None) -> None:
    await current_session().execute(
        text(
            "UPDATE documents SET status = :status, message = :message, "
            "transitions = transitions + 1 WHERE document_id = :id"
        ),
        {"id": document_id, "status": status, "message": message},
    )


async def withdraw_review(document_id: str, doc: DocumentInput, state: Document) -> None:
    """Compensation on cancel: the document is cancelled, whatever state the run was in."""
    await _set_status(document_id, "cancelled")


@state_machine(
    "document-flow",
    initial=Queued,
    terminal=[Completed, Cancelled],
    timers={Waiting: REVIEW_SECONDS},
    compensation=withdraw_review,
    max_attempts=3,
    max_transitions=8,
    concurrency="parent",
)
async def document_flow(document_id: str, doc: DocumentInput, state: Document) -> Document:
    """One transition of a document's review (see the module docstring)."""
    match state:
        case Queued():
            tx = current_session()
            await tx.execute(text(CREATE_DOCUMENTS))
            if await _status(document_id) is None:
                await tx.execute(
                    text(
                        "INSERT INTO documents (document_id, title, status, transitions) "
                        "VALUES (:id, :title, 'waiting', 1)"
                    ),
                    {"id": document_id, "title": doc.title},
                )
            else:  # filed by an earlier review of the same document
                await _set_status(document_id, "waiting")
            return Waiting()
        case Waiting():
            if await _status(document_id) == "withdrawn":
                await _set_status(document_id, "cancelled")
                return Cancelled()
            message = f"{doc.title!r} reviewed after {REVIEW_SECONDS} s"
            await _set_status(document_id, "completed", message)
            return Completed(message=message)
    raise ValueError(f"no transition from terminal state {state.state_name}")
