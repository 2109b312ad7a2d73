"""Prometheus metrics from the API and from a worker's own port, in valid exposition form."""

from __future__ import annotations

import shutil
import subprocess

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.acceptance.conftest import Stack, free_port
from tests.helpers import wait_for_sync


def _families(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return found


def _promtool_ok(text: str) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        return  # the parser above already validated the format
    check = subprocess.run(
        [promtool, "check", "metrics"], input=text.encode(), capture_output=True, check=False
    )
    assert check.returncode == 0, check.stdout.decode() + check.stderr.decode()


def test_api_and_worker_metrics(stack: Stack) -> None:
    port = free_port()
    worker = stack._spawn(
        ["worker", "--handlers", "tests.acceptance.handlers", "--metrics-port", str(port)],
        "worker",
    )
    stack.workers.append(worker)
    with stack.client() as c:

        def registered() -> bool:
            items = c.get("/workflows").json()["items"]
            return any(v["live_workers"] for w in items for v in w["versions"])

        wait_for_sync(registered, what="worker registered")
        run_id = c.post("/runs", json={"workflow": "acc-echo", "input": {"value": 7}}).json()[
            "run_id"
        ]
        wait_for_sync(
            lambda: c.get(f"/runs/{run_id}/result", params={"wait": 5}).json()["done"],
            what="run finished",
        )
        c.get("/runs/00000000-0000-0000-0000-000000000000")  # a 404, to see its label
    api_text = httpx.get(stack.url + "/metrics").text
    api = _families(api_text)
    assert ({"workflow": "acc-echo"}, 1.0) in api["treadle_runs_submitted_total"]
    statuses = {labels["status"]: value for labels, value in api["treadle_runs"]}
    assert statuses["completed"] == 1.0
    assert "queued" in statuses  # every status is exported, zeros included
    routes = {
        (labels["route"], labels["status"]) for labels, _ in api["treadle_http_requests_total"]
    }
    assert ("/runs", "201") in routes
    assert ("/runs/{run_id}", "404") in routes  # the template, never the raw id
    assert not any("0000" in route for route, _ in routes)
    _promtool_ok(api_text)

    def worker_metrics() -> str | None:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
        return text if "treadle_runs_finished_total{" in text else None

    worker_text = wait_for_sync(worker_metrics, what="worker metrics")
    mine = _families(worker_text)
    finished = {
        (labels["workflow"], labels["status"], labels["reason"]): value
        for labels, value in mine["treadle_runs_finished_total"]
    }
    assert finished[("acc-echo", "completed", "succeeded")] == 1.0
    assert mine["treadle_step_attempts_total"] == [({"workflow": "acc-echo"}, 1.0)]
    assert any(name == "treadle_schedule_to_start_seconds_count" for name in mine)
    slots = {labels["state"]: value for labels, value in mine["treadle_worker_slots"]}
    assert slots["busy"] + slots["free"] == 16.0  # the default concurrency
    _promtool_ok(worker_text)


def test_request_ids_are_echoed_or_minted(stack: Stack) -> None:
    echoed = httpx.get(stack.url + "/healthz", headers={"X-Request-ID": "req-42"})
    assert echoed.headers["x-request-id"] == "req-42"
    minted = httpx.get(stack.url + "/healthz")
    assert len(minted.headers["x-request-id"]) == 32
    too_long = httpx.get(stack.url + "/healthz", headers={"X-Request-ID": "x" * 500})
    assert too_long.headers["x-request-id"] != "x" * 500
