"""``treadle runs bulk-<action> …`` and ``treadle batches …``: bulk actions as batches.

A bulk verb takes run ids or the ``runs list`` filters, creates a batch (or, with
``--dry-run``, only counts) and prints it; ``--wait`` polls it until it finishes
(docs/adr/0023-durable-batches.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer

from app.cli.common import (
    DEFAULT_URL,
    OUTPUT,
    TOKEN,
    URL,
    ExitCode,
    Output,
    api_client,
    emit,
    emit_page,
    note,
    parse_time,
    read_json_option,
)
from app.cli.runs import _LABEL, _labels, runs_app

if TYPE_CHECKING:  # imported where used (app.cli.common says why)
    from app.client import Batch

batches_app = typer.Typer(help="Bulk-action batches: show, list, cancel.", no_args_is_help=True)

BATCH_COLUMNS = [
    "batch_id",
    "action",
    "state",
    "matched",
    "done",
    "skipped",
    "failed",
    "created_by",
    "created_at",
]

_IDS = Annotated[list[str] | None, typer.Argument(help="Run ids (or give filters instead)")]
_WF = Annotated[str | None, typer.Option("--workflow", help="Only this workflow")]
_STATUS = Annotated[str | None, typer.Option("--status", help="Only this status")]
_VERSION = Annotated[str | None, typer.Option("--version", help="Only this version")]
_ENDED = Annotated[
    str | None, typer.Option("--ended-reason", help="Only runs that ended this way (`reason`)")
]
_WAITING = Annotated[
    str | None, typer.Option("--waiting-on", help="kind or kind:name, e.g. signal:payment")
]
_TIME = "ISO 8601 date/time; without an offset, UTC"
_CA = Annotated[str | None, typer.Option("--created-after", help=_TIME)]
_CB = Annotated[str | None, typer.Option("--created-before", help=_TIME)]
_FA = Annotated[str | None, typer.Option("--finished-after", help=_TIME)]
_FB = Annotated[str | None, typer.Option("--finished-before", help=_TIME)]
_DRY = Annotated[bool, typer.Option("--dry-run", help="Only count and sample; change nothing")]
_REASON = Annotated[str | None, typer.Option("--reason", help="Recorded with each run's action")]
_WAIT = Annotated[bool, typer.Option("--wait", help="Poll the batch until it finishes")]


def _filter(
    *,
    workflow: str | None,
    status: str | None,
    version: str | None,
    ended_reason: str | None,
    waiting_on: str | None,
    created_after: str | None,
    created_before: str | None,
    finished_after: str | None,
    finished_before: str | None,
    label: list[str] | None,
) -> dict[str, Any]:
    times = {
        "created_after": parse_time(created_after, "--created-after"),
        "created_before": parse_time(created_before, "--created-before"),
        "finished_after": parse_time(finished_after, "--finished-after"),
        "finished_before": parse_time(finished_before, "--finished-before"),
    }
    found: dict[str, Any] = {
        "workflow": workflow,
        "status": status,
        "version": version,
        "reason": ended_reason,
        "waiting_on": waiting_on,
        **{k: v.isoformat() for k, v in times.items() if v is not None},
        "labels": _labels(label),
    }
    return {k: v for k, v in found.items() if v is not None}


def _wait(c: Any, batch: Batch) -> Batch:
    # A deadline-free poll is what an operator asked for with --wait; Ctrl-C stops it.
    while batch.state == "running":
        time.sleep(0.5)
        batch = c.batch(batch.batch_id)
    return batch


def _bulk_command(action: str, summary: str) -> Callable[..., None]:
    def command(
        run_ids: _IDS = None,
        workflow: _WF = None,
        status: _STATUS = None,
        version: _VERSION = None,
        ended_reason: _ENDED = None,
        waiting_on: _WAITING = None,
        created_after: _CA = None,
        created_before: _CB = None,
        finished_after: _FA = None,
        finished_before: _FB = None,
        label: _LABEL = None,
        name: Annotated[
            str | None, typer.Option("--name", help="Signal name (bulk-signal only)")
        ] = None,
        payload: Annotated[
            str | None, typer.Option("--payload", help="Signal payload: JSON or @file.json")
        ] = None,
        dry_run: _DRY = False,
        reason: _REASON = None,
        wait: _WAIT = False,
        output: OUTPUT = Output.TABLE,
        url: URL = DEFAULT_URL,
        tok: TOKEN = None,
    ) -> None:
        flt = _filter(
            workflow=workflow,
            status=status,
            version=version,
            ended_reason=ended_reason,
            waiting_on=waiting_on,
            created_after=created_after,
            created_before=created_before,
            finished_after=finished_after,
            finished_before=finished_before,
            label=label,
        )
        if bool(run_ids) == bool(flt):
            raise typer.BadParameter("give run ids or filters (--label, --workflow, …), not both")
        if action == "signal" and not name:
            raise typer.BadParameter("bulk-signal needs --name")
        if action != "signal" and (name or payload):
            raise typer.BadParameter("--name and --payload are for bulk-signal only")
        from app.client import Batch

        with api_client(url, tok) as c:
            result = c.bulk(
                action,
                run_ids=run_ids or None,
                filter=flt or None,
                dry_run=dry_run,
                reason=reason,
                name=name,
                payload=read_json_option(payload, "--payload") if payload else None,
            )
            if isinstance(result, Batch) and wait:
                result = _wait(c, result)
        emit(result, output)
        if isinstance(result, Batch) and result.failed:
            note(f"{result.failed} runs failed; see `treadle batches show {result.batch_id}`")
            raise typer.Exit(ExitCode.FAILED)

    command.__doc__ = summary
    command.__name__ = f"runs_bulk_{action}"
    return command


for _action, _summary in (
    ("cancel", "Cancel many runs (by ids or filters) as a durable batch."),
    ("retry", "Retry many failed runs from their failed point."),
    ("resume", "Make many waiting runs due now."),
    ("signal", "Send a signal (--name, --payload) to many runs."),
    ("pause", "Pause many live runs."),
    ("unpause", "Unpause many paused runs."),
):
    runs_app.command(f"bulk-{_action}")(_bulk_command(_action, _summary))


@batches_app.command("show")
def batches_show(
    batch_id: str, output: OUTPUT = Output.TABLE, url: URL = DEFAULT_URL, tok: TOKEN = None
) -> None:
    """Show one batch and its progress (counts, skipped reasons, failures)."""
    with api_client(url, tok) as c:
        emit(c.batch(batch_id), output)


@batches_app.command("list")
def batches_list(
    page_token: Annotated[str | None, typer.Option(help="Continue from a previous page")] = None,
    limit: Annotated[int, typer.Option(min=1, max=200, help="Batches per page")] = 20,
    output: OUTPUT = Output.TABLE,
    url: URL = DEFAULT_URL,
    tok: TOKEN = None,
) -> None:
    """List the tenant's batches, newest first."""
    with api_client(url, tok) as c:
        page = c.batches(page_token=page_token, limit=limit).model_dump(mode="json")
    emit_page(page, output, columns=BATCH_COLUMNS)


@batches_app.command("cancel")
def batches_cancel(
    batch_id: str, output: OUTPUT = Output.TABLE, url: URL = DEFAULT_URL, tok: TOKEN = None
) -> None:
    """Stop a running batch; runs already acted on stay so."""
    with api_client(url, tok) as c:
        emit(c.cancel_batch(batch_id), output)
