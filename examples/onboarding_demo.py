"""Drive the onboarding example over HTTP through its three main paths and print reports.

Usage (against ``treadle dev`` or any deployment running ``examples.onboarding``)::

    export TREADLE_URL=http://127.0.0.1:8000
    export TREADLE_TOKEN=$(uv run treadle token --subject alice)
    export TREADLE_APPROVER_TOKEN=$(uv run treadle token --subject maria --groups sales-manager)
    uv run python examples/onboarding_demo.py

Three applicants: one approved with complete documents (completed), one approved whose
documents lack a tax id (billing fails, the account is deleted again: compensated), one
rejected (on_reject notifies sales). Prints each outcome and the text report of the
compensated run.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from typing import Any

import httpx


def _wait_status(c: httpx.Client, run_id: str, wanted: set[str], timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        run: dict[str, Any] = c.get(f"/runs/{run_id}").raise_for_status().json()
        if run["status"] in wanted:
            return run
        if time.monotonic() > deadline:
            raise SystemExit(f"run {run_id} stuck in {run['status']} (wanted {sorted(wanted)})")
        time.sleep(0.1)


def main() -> int:
    """Run the demo; exit 1 if an outcome is not the expected one."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("TREADLE_URL", "http://127.0.0.1:8000"))
    parser.add_argument("--token", default=os.environ.get("TREADLE_TOKEN"))
    parser.add_argument("--approver-token", default=os.environ.get("TREADLE_APPROVER_TOKEN"))
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args()
    if not args.token or not args.approver_token:
        parser.error("set TREADLE_TOKEN and TREADLE_APPROVER_TOKEN (see the module docstring)")
    submitter = httpx.Client(base_url=args.url, headers={"Authorization": f"Bearer {args.token}"})
    approver = httpx.Client(
        base_url=args.url, headers={"Authorization": f"Bearer {args.approver_token}"}
    )
    cases = {
        "complete": ("approve", {"files": ["kbis.pdf"], "tax_id": "FR-4411"}, "completed"),
        "no-tax-id": ("approve", {"files": ["scan.pdf"], "tax_id": ""}, "compensated"),
        "rejected": ("reject", None, "completed"),
    }
    runs: dict[str, str] = {}
    for label in cases:
        body = {
            "workflow": "onboarding",
            "input": {
                "customer_id": f"{label}-{uuid.uuid4().hex[:6]}",
                "company": f"Demo {label} Ltd",
                "email": "finance@demo.example",
                "plan": "growth",
            },
        }
        runs[label] = submitter.post("/runs", json=body).raise_for_status().json()["run_id"]
    for label, (decision, docs, _) in cases.items():
        run_id = runs[label]
        _wait_status(submitter, run_id, {"waiting_approval"}, args.timeout)
        approver.post(
            f"/runs/{run_id}/approvals/manager",
            json={"decision": decision, "comment": f"demo: {decision}"},
        ).raise_for_status()
        if docs is not None:
            submitter.post(
                f"/runs/{run_id}/signals/docs_uploaded", json={"payload": docs}
            ).raise_for_status()
    failures = 0
    for label, (_, _, expected) in cases.items():
        run = _wait_status(
            submitter,
            runs[label],
            {"completed", "failed", "compensated", "cancelled"},
            args.timeout,
        )
        ok = run["status"] == expected
        failures += not ok
        print(
            f"{label:<10} {run['run_id']}  {run['status']:<12} {run['reason']:<24} "
            f"{'ok' if ok else 'UNEXPECTED'}"
        )
    report = submitter.get(f"/runs/{runs['no-tax-id']}/report", params={"format": "text"})
    print()
    print(report.raise_for_status().text)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
