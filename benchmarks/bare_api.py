"""The HTTP baseline: a bare FastAPI endpoint doing one INSERT (no auth, no validation).

``POST /runs`` with a JSON body ``{"workflow": str, "input": object}`` inserts one row
into ``bare_runs`` through an asyncpg pool and answers 201 with the new id, which is the
least any durable submit endpoint must do. Served by uvicorn exactly as ``treadle serve``
serves the real API (one process, no access log)::

    BARE_DATABASE_URL=postgresql://… uv run uvicorn benchmarks.bare_api:app --port 8100
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
from fastapi import FastAPI
from pydantic import BaseModel

CREATE = """
CREATE TABLE IF NOT EXISTS bare_runs (
    id uuid PRIMARY KEY,
    workflow text NOT NULL,
    input text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
)
"""


class Submit(BaseModel):
    """The request body."""

    workflow: str
    input: dict[str, Any] = {}


class Created(BaseModel):
    """The response body."""

    id: uuid.UUID


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    pool = await asyncpg.create_pool(os.environ["BARE_DATABASE_URL"], min_size=1, max_size=10)
    async with pool.acquire() as conn:
        await conn.execute(CREATE)
    app.state.pool = pool
    try:
        yield
    finally:
        await pool.close()


app = FastAPI(lifespan=_lifespan)


@app.post("/runs", status_code=201)
async def submit(body: Submit) -> Created:
    """Insert one row; 201 with its id."""
    run_id = uuid.uuid4()
    async with app.state.pool.acquire() as conn:
        await conn.execute(
            "INSERT INTO bare_runs (id, workflow, input) VALUES ($1, $2, $3)",
            run_id,
            body.workflow,
            json.dumps(body.input),
        )
    return Created(id=run_id)
