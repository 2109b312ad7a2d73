"""Submit the example orders to a running Treadle API and check how each run ended.

Every order in the orders file becomes one run of the ``orders`` workflow
(``POST /runs`` with ``idempotency_key = "order-<order_id>"``, so running the script again
finds the same runs instead of creating new ones). The script then long-polls
``GET /runs/{run_id}/result`` until each run is done, prints the outcome mix, wall time and
throughput, and compares every outcome with ``orders.expected.json``.

Usage::

    uv run treadle dev                    # in another terminal: API + in-process worker
    export TREADLE_TOKEN=$(uv run treadle token)
    uv run python examples/client.py --url http://127.0.0.1:8000 --token $TREADLE_TOKEN
    uv run python examples/client.py --limit 20 --concurrency 4     # a quick smoke test

    options: [--orders examples/data/orders.json] [--expected PATH]
             [--concurrency 16] [--timeout 300] [--limit N]

``--url`` and ``--token`` default to ``TREADLE_URL`` and ``TREADLE_TOKEN``. ``--expected``
defaults to ``<orders stem>.expected.json`` next to the orders file; when that file does
not exist the comparison is skipped. ``--timeout`` is the budget in seconds for the whole
batch: runs not finished (or not yet submitted) by then are reported as unfinished.

Exit codes:
    0  every run finished with its expected outcome;
    1  some outcome differs from the expectation, or some run did not finish in time;
    2  usage error, unreadable orders file, or the API cannot be reached;
    3  the API answered with an error (problem+json) or an unexpected status.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

WORKFLOW = "orders"
DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_ORDERS = Path(__file__).resolve().parent / "data" / "orders.json"
LONG_POLL_SECONDS = 30.0

EXIT_OK = 0
EXIT_MISMATCH = 1
EXIT_USAGE = 2
EXIT_API_ERROR = 3


class ApiError(Exception):
    """The API answered with an error or a status this client does not expect."""

    def __init__(self, action: str, response: httpx.Response) -> None:
        self.action = action
        self.status_code = response.status_code
        self.body = _json_or_none(response)
        self.text = response.text
        super().__init__(f"{action}: HTTP {response.status_code}")

    def describe(self) -> str:
        """Render the error for a human: the RFC 9457 fields when present, else the body."""
        lines = [f"{self.action} failed: HTTP {self.status_code}"]
        body = self.body
        if isinstance(body, dict) and ("title" in body or "detail" in body):
            head = str(body.get("title", "Error"))
            if body.get("code"):
                head += f" [{body['code']}]"
            lines.append(f"  {head}: {body.get('detail', '')}")
            for key in ("type", "instance"):
                if body.get(key):
                    lines.append(f"  {key}: {body[key]}")
            for err in body.get("errors") or []:
                if isinstance(err, dict):
                    lines.append(f"  - {err.get('path', '?')}: {err.get('message', err)}")
            extra = {
                k: v
                for k, v in body.items()
                if k not in {"type", "title", "status", "detail", "code", "instance", "errors"}
            }
            if extra:
                lines.append(f"  {json.dumps(extra, ensure_ascii=False)[:500]}")
        else:
            text = self.text.strip()
            lines.append(f"  {text[:500] if text else '(empty body)'}")
        if self.status_code == 401:
            lines.append("  hint: mint a token with `uv run treadle token` (same data dir).")
        elif self.status_code == 404 and isinstance(body, dict):
            if body.get("code") == "workflow_not_found":
                lines.append("  hint: start the server/worker with --handlers examples.orders.")
        elif self.status_code == 409:
            lines.append("  hint: the orders changed since these idempotency keys were used.")
        return "\n".join(lines)


class UnreachableError(Exception):
    """The API could not be reached (connection refused, DNS, read timeout...)."""


@dataclass
class Outcome:
    """What happened to one order."""

    order_id: str
    run_id: str | None = None
    created: bool | None = None
    done: bool = False
    status: str | None = None
    reason: str | None = None
    error: Any = None


@dataclass
class Batch:
    """Shared state of one batch: the deadline and progress counters."""

    deadline: float
    total: int
    finished: int = 0
    outcomes: dict[str, Outcome] = field(default_factory=dict)

    def remaining(self) -> float:
        """Return the seconds left before the batch deadline (never negative)."""
        return max(self.deadline - time.monotonic(), 0.0)


def _json_or_none(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


async def _request(
    client: httpx.AsyncClient, method: str, url: str, *, action: str, **kwargs: Any
) -> httpx.Response:
    try:
        return await client.request(method, url, **kwargs)
    except httpx.ConnectError as exc:
        raise UnreachableError(
            f"{action}: cannot connect to {client.base_url} "
            f"(connection refused or host unreachable: {exc})"
        ) from exc
    except httpx.TimeoutException as exc:
        raise UnreachableError(
            f"{action}: {client.base_url} did not answer in time ({type(exc).__name__})"
        ) from exc
    except httpx.TransportError as exc:
        detail = str(exc) or type(exc).__name__
        raise UnreachableError(f"{action}: cannot reach {client.base_url}: {detail}") from exc


async def submit(client: httpx.AsyncClient, order: dict[str, Any]) -> tuple[str, bool]:
    """Submit one order as a run; return ``(run_id, created)``.

    ``created`` is False when the idempotency key matched an existing run (HTTP 200).

    Raises:
        ApiError: any status other than 201 or 200.
        UnreachableError: the API cannot be reached.
    """
    order_id = order["order_id"]
    action = f"submit order {order_id}"
    body = {"workflow": WORKFLOW, "input": order, "idempotency_key": f"order-{order_id}"}
    response = await _request(client, "POST", "/runs", json=body, action=action)
    if response.status_code not in (200, 201):
        raise ApiError(action, response)
    data = _json_or_none(response)
    if not isinstance(data, dict) or "run_id" not in data:
        raise ApiError(f"{action} (no run_id in the response)", response)
    return str(data["run_id"]), response.status_code == 201


async def wait_for_result(
    client: httpx.AsyncClient, run_id: str, batch: Batch, outcome: Outcome
) -> None:
    """Long-poll the run's result until it is done or the batch deadline passes.

    Fills ``outcome`` with the last ``status``/``reason``/``error`` seen.

    Raises:
        ApiError: any status other than 200 or 202.
        UnreachableError: the API cannot be reached.
    """
    action = f"wait for run {run_id} (order {outcome.order_id})"
    while True:
        wait = min(LONG_POLL_SECONDS, batch.remaining())
        response = await _request(
            client,
            "GET",
            f"/runs/{run_id}/result",
            params={"wait": f"{wait:.1f}"},
            timeout=httpx.Timeout(10.0, read=wait + 30.0),
            action=action,
        )
        if response.status_code not in (200, 202):
            raise ApiError(action, response)
        data = _json_or_none(response)
        if not isinstance(data, dict) or "done" not in data:
            raise ApiError(f"{action} (malformed result)", response)
        outcome.status = data.get("status")
        outcome.reason = data.get("reason")
        outcome.error = data.get("error")
        if data["done"] is True:
            outcome.done = True
            return
        if batch.remaining() <= 0:
            return


async def process(
    client: httpx.AsyncClient, order: dict[str, Any], batch: Batch, gate: asyncio.Semaphore
) -> None:
    """Submit one order and wait for its run, holding one of the concurrency slots."""
    outcome = batch.outcomes[order["order_id"]]
    async with gate:
        if batch.remaining() <= 0:
            return  # out of time before this order's turn came: left unsubmitted
        outcome.run_id, outcome.created = await submit(client, order)
        await wait_for_result(client, outcome.run_id, batch, outcome)
    if outcome.done:
        batch.finished += 1
        step = max(batch.total // 10, 1)
        if batch.finished % step == 0 or batch.finished == batch.total:
            print(f"  {batch.finished}/{batch.total} runs finished", file=sys.stderr)


async def run_batch(
    url: str, token: str, orders: Sequence[dict[str, Any]], concurrency: int, timeout: float
) -> Batch:
    """Submit ``orders`` with at most ``concurrency`` runs in flight; wait up to ``timeout``.

    Raises:
        ApiError: the API rejected a request (the remaining work is cancelled).
        UnreachableError: the API cannot be reached.
    """
    batch = Batch(deadline=time.monotonic() + timeout, total=len(orders))
    for order in orders:
        batch.outcomes[order["order_id"]] = Outcome(order_id=order["order_id"])
    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(
        base_url=url,
        headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
        timeout=httpx.Timeout(30.0),
        limits=limits,
    ) as client:
        # A TaskGroup cancels the other orders as soon as one raises.
        try:
            async with asyncio.TaskGroup() as group:
                for order in orders:
                    group.create_task(process(client, order, batch, gate))
        except BaseExceptionGroup as eg:
            # Surface one representative error: connectivity first, then API errors.
            for kind in (UnreachableError, ApiError):
                match = eg.subgroup(kind)
                if match is not None:
                    raise _first_leaf(match) from None
            raise
    return batch


def _first_leaf(group: BaseExceptionGroup[BaseException]) -> BaseException:
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc


def load_orders(path: Path) -> list[dict[str, Any]]:
    """Read the orders file: a JSON list of objects, each with a string ``order_id``.

    Raises:
        ValueError: the file is missing, not JSON, or not shaped like a list of orders.
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(data, list):
        raise ValueError(f"{path} must hold a JSON list of orders")
    seen: set[str] = set()
    for i, order in enumerate(data):
        if not isinstance(order, dict) or not isinstance(order.get("order_id"), str):
            raise ValueError(f"{path}: item {i} is not an object with a string order_id")
        if order["order_id"] in seen:
            raise ValueError(f"{path}: duplicate order_id {order['order_id']!r}")
        seen.add(order["order_id"])
    return data


def load_expected(path: Path) -> dict[str, tuple[str, str]] | None:
    """Read ``{order_id: {"status", "reason"}}``; None when the file does not exist.

    Raises:
        ValueError: the file exists but cannot be read or is malformed.
    """
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read expectations from {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object keyed by order_id")
    expected: dict[str, tuple[str, str]] = {}
    for order_id, value in data.items():
        if not isinstance(value, dict):
            raise ValueError(f"{path}: entry {order_id!r} is not an object")
        expected[order_id] = (str(value.get("status")), str(value.get("reason")))
    return expected


def _error_message(error: Any) -> str:
    if isinstance(error, dict):
        return f"{error.get('type', 'error')}: {error.get('message', '')}"[:200]
    return "" if error is None else str(error)[:200]


def report(
    outcomes: Sequence[Outcome],
    expected: dict[str, tuple[str, str]] | None,
    expected_path: Path,
    wall: float,
) -> int:
    """Print the summary table and the comparison; return the exit code."""
    finished = [o for o in outcomes if o.done]
    unfinished = [o for o in outcomes if not o.done]
    mix = Counter((o.status or "?", o.reason or "-") for o in finished)
    created = sum(1 for o in outcomes if o.created)
    reused = sum(1 for o in outcomes if o.created is False)

    print()
    print(f"{'status':<12} {'reason':<30} {'runs':>6}")
    print(f"{'-' * 12} {'-' * 30} {'-' * 6}")
    for (status, reason), n in sorted(mix.items()):
        print(f"{status:<12} {reason:<30} {n:>6}")
    print(f"{'-' * 12} {'-' * 30} {'-' * 6}")
    print(f"{'finished':<43} {len(finished):>6}")
    if unfinished:
        print(f"{'unfinished':<43} {len(unfinished):>6}")
    print(f"{'total':<43} {len(outcomes):>6}")
    print()
    rate = len(finished) / wall if wall > 0 else 0.0
    print(f"submitted: {created} new runs, {reused} already existed (same idempotency key)")
    print(f"wall time: {wall:.2f} s   throughput: {rate:.1f} runs/s")

    code = EXIT_OK
    if unfinished:
        code = EXIT_MISMATCH
        print(f"\nnot finished before --timeout ({len(unfinished)}):")
        for o in unfinished[:50]:
            where = f"run {o.run_id} status {o.status}" if o.run_id else "not submitted"
            print(f"  {o.order_id}: {where}")
        if len(unfinished) > 50:
            print(f"  ... and {len(unfinished) - 50} more")

    if expected is None:
        print(f"\nno expectations file at {expected_path}: comparison skipped")
        return code
    mismatches = [o for o in finished if expected.get(o.order_id) != (o.status, o.reason)]
    print(
        f"\nexpected ({expected_path.name}): {len(finished) - len(mismatches)}/{len(finished)}"
        " finished runs match"
    )
    if mismatches:
        code = EXIT_MISMATCH
        print(f"mismatches ({len(mismatches)}):")
        for o in mismatches:
            want = expected.get(o.order_id)
            want_text = "/".join(want) if want else "no expectation"
            line = f"  {o.order_id}: got {o.status}/{o.reason}, expected {want_text}"
            message = _error_message(o.error)
            print(line + (f" ({message})" if message else ""))
    return code


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError("must be greater than 0")
    return value


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the command line (``TREADLE_URL`` / ``TREADLE_TOKEN`` give the defaults)."""
    parser = argparse.ArgumentParser(
        description="Submit example orders to a Treadle API and check the outcomes.",
        epilog="Exit codes: 0 all as expected; 1 mismatch or unfinished; 2 usage or "
        "connection error; 3 API error.",
    )
    parser.add_argument(
        "--url",
        default=os.environ.get("TREADLE_URL") or DEFAULT_URL,
        help="API base URL (default: $TREADLE_URL or %(default)s)",
    )
    parser.add_argument(
        "--token",
        default=os.environ.get("TREADLE_TOKEN"),
        help="bearer token (default: $TREADLE_TOKEN; dev: `uv run treadle token`)",
    )
    parser.add_argument(
        "--orders", type=Path, default=DEFAULT_ORDERS, help="orders JSON file (%(default)s)"
    )
    parser.add_argument(
        "--expected",
        type=Path,
        default=None,
        help="expected outcomes JSON (default: <orders stem>.expected.json beside --orders)",
    )
    parser.add_argument(
        "--concurrency", type=_positive_int, default=16, help="runs in flight (%(default)s)"
    )
    parser.add_argument(
        "--timeout",
        type=_positive_float,
        default=300.0,
        help="seconds for the whole batch to finish (%(default)s)",
    )
    parser.add_argument(
        "--limit", type=_positive_int, default=None, help="submit only the first N orders"
    )
    args = parser.parse_args(argv)
    if not args.token:
        parser.error("no token: pass --token or set TREADLE_TOKEN (dev: `uv run treadle token`)")
    if not args.url.startswith(("http://", "https://")):
        parser.error(f"--url must start with http:// or https:// (got {args.url!r})")
    if args.expected is None:
        args.expected = args.orders.with_name(args.orders.stem + ".expected.json")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the client; return the process exit code."""
    args = parse_args(argv)
    try:
        orders = load_orders(args.orders)
        expected = load_expected(args.expected)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.limit is not None:
        orders = orders[: args.limit]
    if not orders:
        print(f"error: no orders in {args.orders}", file=sys.stderr)
        return EXIT_USAGE

    print(
        f"submitting {len(orders)} orders to {args.url} "
        f"(concurrency {args.concurrency}, timeout {args.timeout:g} s)",
        file=sys.stderr,
    )
    started = time.perf_counter()
    try:
        batch = asyncio.run(run_batch(args.url, args.token, orders, args.concurrency, args.timeout))
    except UnreachableError as exc:
        print(f"error: {exc}", file=sys.stderr)
        print("is the server running? (dev: `uv run treadle dev`)", file=sys.stderr)
        return EXIT_USAGE
    except ApiError as exc:
        print(f"error: {exc.describe()}", file=sys.stderr)
        return EXIT_API_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    wall = time.perf_counter() - started
    return report(list(batch.outcomes.values()), expected, args.expected, wall)


if __name__ == "__main__":
    sys.exit(main())
