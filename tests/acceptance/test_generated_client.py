"""An SDK generated from openapi/openapi.json drives a run against a live server.

openapi-python-client generates a client package into a temp dir; the test imports it and
submits a run, waits for its result and reads a problem, all through generated code.
"""

from __future__ import annotations

import importlib
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openapi_python_client import generate
from openapi_python_client.config import Config, ConfigFile, MetaType

from tests.acceptance.conftest import ROOT, Stack, token

SPEC = ROOT / "openapi" / "openapi.json"
PACKAGE = "treadle_client"


@pytest.fixture
def client_package(tmp_path: Path) -> Iterator[str]:
    """Generate the client from the committed spec and make it importable."""
    out = tmp_path / "generated"
    config = Config.from_sources(
        # No post hooks: the generator's default runs ruff over the output, which we do
        # not need to import it.
        ConfigFile(post_hooks=[]),
        MetaType.NONE,
        SPEC,
        "utf-8",
        overwrite=True,
        output_path=out / PACKAGE,
    )
    problems = generate(config=config)
    # Any warning means the spec reads badly to generators (unsupported or ambiguous).
    assert list(problems) == [], [f"{p.header}: {p.detail}" for p in problems]
    sys.path.insert(0, str(out))
    try:
        yield PACKAGE
    finally:
        sys.path.remove(str(out))
        for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
            del sys.modules[name]


def _module(name: str) -> Any:
    return importlib.import_module(f"{PACKAGE}.{name}")


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_generated_client_completes_a_run(stack: Stack, client_package: str) -> None:
    stack.start_worker()
    client_mod = _module("client")
    models = _module("models")
    submit_run = _module("api.runs.submit_run")
    get_run_result = _module("api.runs.get_run_result")
    get_run = _module("api.runs.get_run")
    list_workflows = _module("api.workflows.list_workflows")
    get_run_report = _module("api.runs.get_run_report")
    get_run_report_text = _module("api.runs.get_run_report_text")

    with client_mod.AuthenticatedClient(base_url=stack.url, token=token()) as api:
        names = [w.name for w in list_workflows.sync(client=api).items]
        assert "acc-echo" in names

        value = {"greeting": "héllo", "n": [1, 2, 3]}
        body = models.SubmitRunRequest(
            workflow="acc-echo", input_={"value": value}, idempotency_key="sdk-1"
        )
        created = submit_run.sync_detailed(client=api, body=body)
        assert created.status_code == 201
        run = created.parsed
        assert isinstance(run, models.Run)
        assert run.status == "queued"

        result = get_run_result.sync(str(run.run_id), client=api, wait=30)
        assert isinstance(result, models.RunResult)
        assert (result.done, result.status, result.reason) == (True, "completed", "succeeded")
        assert result.output == value

        # The identical retry answers 200 with the same run, through the same call.
        again = submit_run.sync_detailed(client=api, body=body)
        assert again.status_code == 200
        assert again.parsed.run_id == run.run_id

        # The report in both forms: JSON as a typed model, text as a string.
        report = get_run_report.sync(str(run.run_id), client=api)
        assert isinstance(report, models.RunReport)
        assert report.run.run_id == run.run_id and report.steps
        text = get_run_report_text.sync(str(run.run_id), client=api)
        assert isinstance(text, str) and str(run.run_id) in text and "acc-echo" in text
        gone = get_run_report_text.sync(str(uuid.uuid4()), client=api)
        assert isinstance(gone, models.Problem) and gone.code == "run_not_found"

        missing = get_run.sync(str(uuid.uuid4()), client=api)
        assert isinstance(missing, models.Problem)
        assert (missing.status, missing.code) == (404, "run_not_found")


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_generated_client_submits_a_batch(stack: Stack, client_package: str) -> None:
    stack.start_worker()
    client_mod = _module("client")
    models = _module("models")
    submit_runs_batch = _module("api.runs.submit_runs_batch")
    get_run_result = _module("api.runs.get_run_result")

    with client_mod.AuthenticatedClient(base_url=stack.url, token=token()) as api:
        body = models.SubmitBatchRequest(
            runs=[
                models.SubmitRunRequest(
                    workflow="acc-echo", input_={"value": 1}, idempotency_key="sdk-b1"
                ),
                models.SubmitRunRequest(
                    workflow="acc-echo", input_={"value": 1}, idempotency_key="sdk-b1"
                ),
                models.SubmitRunRequest(workflow="acc-nope", input_={}),
            ]
        )
        answer = submit_runs_batch.sync_detailed(client=api, body=body)
        assert answer.status_code == 207
        parsed = answer.parsed
        assert isinstance(parsed, models.SubmitBatchResponse)
        assert [r.status for r in parsed.results] == [201, 200, 404]
        assert (parsed.created, parsed.failed) == (1, 1)
        first, second, third = parsed.results
        assert isinstance(first.run, models.Run)
        assert second.run.run_id == first.run.run_id
        assert isinstance(third.problem, models.Problem)
        assert third.problem.code == "workflow_not_found"

        result = get_run_result.sync(str(first.run.run_id), client=api, wait=30)
        assert isinstance(result, models.RunResult)
        assert (result.done, result.output) == (True, 1)
