"""The console's in-process API client turns an API bug into the API's 500 answer.

An error the API does not handle is answered 500 (problem+json, logged) by the API's
handler (app/api/problems.py); through the console's client it must arrive as that
answer, a ``TreadleAPIError`` the console renders as its error page, not as the raw
exception escaping the page request (uvicorn then drops the browser's connection).
"""

from __future__ import annotations

import uuid

import pytest
from fastapi import FastAPI

from app.api import problems
from app.client.errors import TreadleAPIError
from app.console.client import in_process_client


async def test_an_unhandled_api_error_arrives_as_its_500_answer() -> None:
    app = FastAPI()
    problems.install(app)

    @app.get("/runs/{run_id}")
    async def broken(run_id: str) -> None:
        raise RuntimeError(f"a bug reading {run_id}")

    async with in_process_client(app, "token") as api:
        with pytest.raises(TreadleAPIError) as caught:
            await api.get(str(uuid.uuid4()))
    assert caught.value.status == 500
    assert caught.value.code == "internal_error"
