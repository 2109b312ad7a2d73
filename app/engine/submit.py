"""Submitting runs: definition lookup, input validation, idempotency, wake-up."""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import jsonschema
from sqlalchemy import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core import json
from app.core.errors import (
    ConcurrencyKeyBusy,
    IdempotencyConflict,
    InvalidInput,
    TreadleError,
    WorkflowNotFound,
)
from app.core.ids import new_run_id
from app.core.settings import Settings
from app.core.status import STATE_MACHINE_KIND, EventKind, RunStatus
from app.core.tracing import TraceContext
from app.db.database import Database
from app.db.queries import definitions as defs_q
from app.db.queries import events as events_q
from app.db.queries import run_labels as labels_q
from app.db.queries import runs as runs_q
from app.db.queries import submits as submits_q
from app.engine import slots
from app.engine.wakeup import notify
from app.sdk.queue import QueueControls


@dataclass(frozen=True, slots=True)
class SubmitRequest:
    """A validated-shape submission (types already checked by the API layer).

    Attributes:
        workflow: workflow name.
        input: the JSON input (any JSON value; usually an object).
        version: pinned version, or None for the latest registered one.
        idempotency_key: retries with the same key return the same run.
        concurrency_key: at most ``key_limit`` active runs of the workflow per key (per
            tenant); beyond it refused or queued per the definition's ``on_limit``.
        delay: seconds before the run becomes claimable (DB time).
        priority: claim priority, -100..100 (higher first among due runs).
        labels: the run's labels, already checked by :func:`app.core.labels.validate_labels`.
    """

    workflow: str
    input: Any
    version: str | None = None
    idempotency_key: str | None = None
    concurrency_key: str | None = None
    delay: float | None = None
    priority: int = 0
    labels: dict[str, str] = field(default_factory=dict)

    def _fingerprint_fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "workflow": self.workflow,
            "version": self.version,
            "input": self.input,
            "concurrency_key": self.concurrency_key,
            "delay": self.delay,
        }
        # Only when set, so runs submitted before priorities existed keep their hash.
        if self.priority:
            fields["priority"] = self.priority
        if self.labels:
            # Likewise only when set: runs submitted before labels keep their hash.
            fields["labels"] = self.labels
        return fields

    def fingerprint(self, *, plain_input: bool = False) -> str:
        """SHA-256 (hex) of the request's canonical JSON: what an idempotent retry matches.

        Every field that decides the run enters it (workflow, version, input, concurrency
        key, delay, priority), encoded by :func:`app.core.json.canonical_dumps`: the same
        JSON in another key order or number spelling (``1``, ``1.0``, ``1e0``) is the same
        request, while strings compare exactly (docs/api.md, idempotency keys).

        ``plain_input``: :func:`app.core.json.check_depth` found the input plain (as
        :func:`app.core.json.encode_limited` reports it), so its canonical form needs no
        copy; the fingerprint is the same either way.
        """
        text = json.canonical_dumps(
            self._fingerprint_fields(), plain_members=("input",) if plain_input else ()
        )
        return hashlib.sha256(text.encode()).hexdigest()

    def legacy_fingerprint(self) -> str:
        """The fingerprint runs stored before it was canonical (docs/adr/0012).

        SHA-256 of the request as given (key order and number spelling included). A retry
        of such a run matches when it repeats the original request byte for byte, as it
        did then; new runs store :meth:`fingerprint` only.
        """
        return hashlib.sha256(json.dumps(self._fingerprint_fields()).encode()).hexdigest()

    def matches(self, stored: str | None) -> bool:
        """Whether a run's stored ``request_hash`` is this request's (either algorithm)."""
        return stored is not None and stored in (self.fingerprint(), self.legacy_fingerprint())


@dataclass(frozen=True, slots=True)
class BatchResult:
    """One item's outcome in :meth:`Submitter.submit_batch` (results keep request order).

    Exactly one of ``row`` and ``error`` is set. ``created`` is True for a new run (201),
    False for an idempotent replay (200, the existing run); ``error`` is the domain error
    the item would have raised from ``POST /runs`` (its problem status and code).
    """

    row: RowMapping | None = None
    created: bool = False
    error: TreadleError | None = None


@dataclass(frozen=True, slots=True)
class _Prepared:
    index: int
    request: SubmitRequest
    input_text: str
    version: str
    definition: _Definition
    fingerprint: str


@dataclass(frozen=True, slots=True)
class _Definition:
    version: str
    validator: jsonschema.protocols.Validator
    access: str
    kind: str
    queue: QueueControls


def _version_order(row: RowMapping) -> tuple[int, int, str]:
    version = str(row["version"])
    # Numeric versions compare as numbers ("10" > "9"); others by registration time.
    if version.isdigit():
        return (1, int(version), "")
    return (0, 0, row["first_registered_at"].isoformat())


def _check_input(request: SubmitRequest, definition: _Definition) -> None:
    # The definition's rules for one submission (Submitter.prepare; each item of a batch).
    if definition.kind == STATE_MACHINE_KIND and request.concurrency_key is None:
        raise InvalidInput(
            f"workflow {request.workflow!r} is a state machine: concurrency_key (the "
            "parent entity it drives) is required",
            errors=[{"path": "concurrency_key", "message": "required for a state machine"}],
        )
    if definition.validator.is_valid(request.input):
        # The common case: one pass that stops at nothing to report. The errors (every
        # one, sorted) are only collected for an input that fails.
        return
    errors = sorted(definition.validator.iter_errors(request.input), key=lambda e: list(e.path))
    if errors:
        raise InvalidInput(
            f"input is not valid for workflow {request.workflow!r} version {definition.version!r}",
            errors=[
                {
                    "path": ".".join(str(p) for p in e.absolute_path) or "$",
                    "message": e.message[:500],
                }
                for e in errors[:20]
            ],
        )


class Submitter:
    """Submits runs; caches compiled input validators per definition.

    Args:
        db: the database.
        settings: payload ceiling.
        cache_seconds: how long a definition lookup is reused (new versions registered
            by workers become the default within this time).
    """

    def __init__(self, db: Database, settings: Settings, cache_seconds: float = 2.0) -> None:
        self.db = db
        self.settings = settings
        self.cache_seconds = cache_seconds
        self._cache: dict[tuple[str, str | None], tuple[float, _Definition]] = {}
        self._validators: dict[str, jsonschema.protocols.Validator] = {}

    async def _definition(self, workflow: str, version: str | None) -> _Definition:
        key = (workflow, version)
        hit = self._cache.get(key)
        if hit is not None and hit[0] > time.monotonic():
            return hit[1]
        async with self.db.read() as conn:
            rows = await defs_q.get_definitions(conn, workflow)
        if not rows:
            raise WorkflowNotFound(
                f"no worker has registered workflow {workflow!r}", workflow=workflow
            )
        if version is None:
            row = max(rows, key=_version_order)
        else:
            matches = [r for r in rows if r["version"] == version]
            if not matches:
                raise WorkflowNotFound(
                    f"workflow {workflow!r} has no registered version {version!r}",
                    workflow=workflow,
                    version=version,
                    registered_versions=sorted(r["version"] for r in rows),
                )
            row = matches[0]
        schema_text = row["input_schema"]
        validator = self._validators.get(schema_text)
        if validator is None:
            schema = json.loads(schema_text)
            cls = jsonschema.validators.validator_for(
                schema, default=jsonschema.Draft202012Validator
            )
            validator = cls(schema)
            self._validators[schema_text] = validator
        found = _Definition(
            version=str(row["version"]),
            validator=validator,
            access=row["access"],
            kind=str(row["kind"]),
            queue=QueueControls.from_json(json.loads(row["queue_controls"])),
        )
        self._cache[key] = (time.monotonic() + self.cache_seconds, found)
        return found

    async def prepare(self, request: SubmitRequest) -> tuple[str, str]:
        """Check a submission without writing: returns ``(input JSON text, version)``.

        Raises:
            WorkflowNotFound: unknown workflow or version (404).
            InvalidInput: input fails the registered JSON Schema (422, with field paths),
                or holds NaN, a lone surrogate or nesting over 200 levels.
            PayloadTooLarge: encoded input over ``TREADLE_MAX_PAYLOAD_BYTES`` (413).
            InvalidInput: a state machine submitted without ``concurrency_key`` (422): the
                key names the parent entity the run drives (DESIGN §1c).
        """
        input_text = json.dumps_limited(request.input, self.settings.max_payload_bytes, "input")
        definition = await self._definition(request.workflow, request.version)
        _check_input(request, definition)
        return input_text, definition.version

    async def access(self, workflow: str, version: str) -> str:
        """The access policy (``tenant`` or ``owner``) registered for a definition version.

        Raises:
            WorkflowNotFound: unknown workflow or version.
        """
        return (await self._definition(workflow, version)).access

    async def queue(self, workflow: str, version: str) -> QueueControls:
        """The queue controls registered for a definition version (reruns admit with them).

        Raises:
            WorkflowNotFound: unknown workflow or version.
        """
        return (await self._definition(workflow, version)).queue

    async def submit(
        self,
        request: SubmitRequest,
        *,
        tenant_id: str,
        subject: str,
        api_key_id: uuid.UUID | None = None,
        trace: TraceContext | None = None,
    ) -> tuple[RowMapping, bool]:
        """Create a run, or return the existing one for an identical idempotent retry.

        Args:
            request: the submission.
            tenant_id: the caller's tenant.
            subject: the caller (``created_by``; the owner under ``access="owner"``).
            api_key_id: the API key the caller used, re-checked on every attempt.
            trace: the W3C trace context the run is submitted under, stored with it
                (:func:`app.core.tracing.submit_context`); not part of the request's
                fingerprint, so a retry under another trace is still the same request.

        Returns:
            ``(run row, created)``: created is False for an idempotent replay.

        Raises:
            WorkflowNotFound, InvalidInput, PayloadTooLarge: see :meth:`prepare`.
            IdempotencyConflict: the key was used for a different request (409).
            ConcurrencyKeyBusy: the concurrency key's ``key_limit`` runs are active and the
                workflow declares ``on_limit="reject"`` (409). With ``on_limit="queue"`` the
                run is created waiting for a slot instead (``blocked_reason`` says so).
        """
        input_text, version = await self.prepare(request)
        definition = await self._definition(request.workflow, version)
        if (
            self.db.dialect == "postgresql"
            and request.concurrency_key is None
            and not request.labels
        ):
            # The one-statement path writes only the run row and its event; labels need
            # their index rows too, so a labelled run takes the transactional path.
            return await self._submit_one_statement(
                request,
                input_text,
                version,
                tenant_id=tenant_id,
                subject=subject,
                api_key_id=api_key_id,
                access=definition.access,
                trace=trace,
            )

        async def insert(conn: AsyncConnection) -> tuple[RowMapping, bool]:
            return await insert_prepared(
                conn,
                request,
                input_text,
                version,
                tenant_id=tenant_id,
                subject=subject,
                api_key_id=api_key_id,
                access=definition.access,
                queue=definition.queue,
                trace=trace,
                notify_in_transaction=False,
            )

        row, created = await self.db.write_retrying(insert, what="submit")
        if created:
            # After commit, coalesced: no submit commit takes the NOTIFY lock.
            self.db.wake_workers()
        return row, created

    async def submit_batch(
        self,
        items: Sequence[SubmitRequest | TreadleError],
        *,
        tenant_id: str,
        subject: str,
        api_key_id: uuid.UUID | None = None,
        trace: TraceContext | None = None,
    ) -> list[BatchResult]:
        """Submit many runs in one transaction; one :class:`BatchResult` per item, in order.

        Each item follows :meth:`submit`'s rules (validation, idempotency, concurrency-key
        admission); an item given as a :class:`TreadleError` (its body failed the API's
        schema) is reported as it is. Items that fail (unknown workflow, invalid input,
        idempotency key reused differently, busy concurrency key) are reported and do
        not abort the others; the accepted items commit together or not at all
        (docs/api.md, "POST /runs:batch"). An idempotency key repeated inside the
        batch is one request: the same body again returns the first item's run
        (``created`` False), a different body is :class:`IdempotencyConflict`.

        Runs without a concurrency key are written as multi-row INSERTs (runs, labels,
        ``run_submitted`` events) that skip idempotency keys the tenant already holds
        (those items get the twin or 409, as ``POST /runs`` answers a concurrent
        duplicate); keyed runs are admitted one by one under their key's lock, each in a
        savepoint. Workers are woken by one coalesced NOTIFY after commit.

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database failed, or a constraint other than
                the idempotency key was violated (nothing was written; not retried, except
                the conflicts ``Database.write_retrying`` retries).
        """
        results: list[BatchResult | None] = [None] * len(items)
        prepared: list[_Prepared] = []
        leaders: dict[str, _Prepared] = {}
        followers: list[tuple[_Prepared, _Prepared]] = []
        # Each (workflow, version) asked for is resolved once per batch, and its items are
        # checked against that one compiled validator: per item only what depends on the
        # item itself (encoding, schema check, fingerprint) is left.
        definitions: dict[tuple[str, str | None], _Definition | TreadleError] = {}
        limit = self.settings.max_payload_bytes
        for index, item in enumerate(items):
            if isinstance(item, TreadleError):
                results[index] = BatchResult(error=item)
                continue
            try:
                # Encoded first, as prepare() does: an oversized item is 413 whatever else.
                encoded = json.encode_limited(item.input, limit, "input")
                asked = (item.workflow, item.version)
                definition = definitions.get(asked)
                if definition is None:
                    try:
                        definition = await self._definition(item.workflow, item.version)
                    except TreadleError as exc:
                        definition = exc
                    definitions[asked] = definition
                if isinstance(definition, TreadleError):
                    raise definition
                _check_input(item, definition)
            except TreadleError as exc:
                results[index] = BatchResult(error=exc)
                continue
            # The walk that checked the input also told whether its canonical form (for
            # the fingerprint) needs a copy: one walk of the input, not two.
            entry = _Prepared(
                index,
                item,
                encoded.text,
                definition.version,
                definition,
                item.fingerprint(plain_input=encoded.plain),
            )
            key = item.idempotency_key
            if key is not None and key in leaders:
                followers.append((entry, leaders[key]))
                continue
            if key is not None:
                leaders[key] = entry
            prepared.append(entry)

        async def write(conn: AsyncConnection) -> dict[int, BatchResult]:
            return await self._write_batch(
                conn,
                prepared,
                tenant_id=tenant_id,
                subject=subject,
                api_key_id=api_key_id,
                trace=trace,
            )

        # No retry of our own for integrity errors: a key taken by a concurrent submit is
        # skipped by the INSERT and answered with its twin (insert_runs), so any
        # IntegrityError left is another constraint and surfaces as it would for POST
        # /runs (a 500, nothing written). write_retrying still retries what
        # app/db/faults.py classifies as a conflict (serialization failure, deadlock).
        written: dict[int, BatchResult] = {}
        if prepared:
            written = await self.db.write_retrying(write, what="submit batch")
        for index, result in written.items():
            results[index] = result
        if any(r.created for r in written.values()):
            self.db.wake_workers()
        for entry, leader in followers:
            lead = results[leader.index]
            assert lead is not None
            if entry.fingerprint != leader.fingerprint:
                run_id = None if lead.row is None else str(lead.row["run_id"])
                results[entry.index] = BatchResult(
                    error=IdempotencyConflict(
                        f"idempotency key {entry.request.idempotency_key!r} was already used "
                        f"for a different request (item {leader.index} of this batch)",
                        **({} if run_id is None else {"run_id": run_id}),
                    )
                )
            elif lead.row is not None:
                results[entry.index] = BatchResult(row=lead.row, created=False)
            else:
                results[entry.index] = BatchResult(error=lead.error)
        return [r if r is not None else BatchResult(error=TreadleError("lost")) for r in results]

    async def _write_batch(
        self,
        conn: AsyncConnection,
        prepared: Sequence[_Prepared],
        *,
        tenant_id: str,
        subject: str,
        api_key_id: uuid.UUID | None,
        trace: TraceContext | None,
    ) -> dict[int, BatchResult]:
        # One transaction: runs with a concurrency key one by one in savepoints (their
        # stored twins read first, so an identical retry is answered before admission, as
        # insert_prepared does), the rest as multi-row INSERTs grouped by delay that skip
        # taken idempotency keys (ON CONFLICT DO NOTHING; only those twins are read after,
        # where a read of every key first was the batch's slowest statement once ``runs``
        # grew: benchmarks/submit_batch.py). Workers are woken once, after commit
        # (docs/adr/0037-coalesced-wake-ups.md).
        out: dict[int, BatchResult] = {}
        keys = [
            p.request.idempotency_key
            for p in prepared
            if p.request.idempotency_key and p.request.concurrency_key is not None
        ]
        existing = await submits_q.get_by_idempotency_keys(conn, tenant_id, keys)
        groups: dict[float | None, list[_Prepared]] = {}
        for p in prepared:
            key = p.request.idempotency_key
            if key is not None and key in existing:
                try:
                    twin = _twin(existing[key], p.request, p.fingerprint, subject=subject)
                    out[p.index] = BatchResult(row=twin, created=False)
                except IdempotencyConflict as exc:
                    out[p.index] = BatchResult(error=exc)
                continue
            if p.request.concurrency_key is None:
                groups.setdefault(p.request.delay or None, []).append(p)
                continue
            try:
                async with conn.begin_nested():
                    row, created = await insert_prepared(
                        conn,
                        p.request,
                        p.input_text,
                        p.version,
                        tenant_id=tenant_id,
                        subject=subject,
                        api_key_id=api_key_id,
                        access=p.definition.access,
                        queue=p.definition.queue,
                        trace=trace,
                        notify_in_transaction=False,
                    )
            except TreadleError as exc:
                out[p.index] = BatchResult(error=exc)
                continue
            out[p.index] = BatchResult(row=row, created=created)
        label_rows: list[dict[str, Any]] = []
        event_rows: list[dict[str, Any]] = []
        # What every row of the batch shares, built once; per row only its own values.
        shared = {
            "tenant_id": tenant_id,
            "status": RunStatus.QUEUED.value,
            "concurrency_key": None,
            "created_by": subject,
            "api_key_id": api_key_id,
            "parent_run_id": None,
            "trace_parent": None if trace is None else trace.traceparent,
            "trace_state": None if trace is None else trace.tracestate,
        }
        # The run_submitted data depends only on (workflow, version) for these unkeyed
        # runs: encoded once per pair, not once per run.
        event_data: dict[tuple[str, str], str] = {}
        taken: list[_Prepared] = []
        for delay, group in groups.items():
            rows = await submits_q.insert_runs(
                conn,
                [
                    {
                        **shared,
                        "run_id": new_run_id(),
                        "workflow": p.request.workflow,
                        "version": p.version,
                        "input": p.input_text,
                        "idempotency_key": p.request.idempotency_key,
                        "request_hash": p.fingerprint,
                        "access": p.definition.access,
                        "priority": p.request.priority,
                        "labels": labels_q.encode(p.request.labels),
                    }
                    for p in group
                ],
                delay=delay,
            )
            for p, new in zip(group, rows, strict=True):
                if new is None:
                    taken.append(p)
                    continue
                out[p.index] = BatchResult(row=new, created=True)
                if p.request.labels:
                    label_rows.extend(
                        {"run_id": new["run_id"], "tenant_id": tenant_id, "key": k, "value": v}
                        for k, v in p.request.labels.items()
                    )
                pair = (p.request.workflow, p.version)
                data = event_data.get(pair)
                if data is None:
                    data = json.dumps(
                        _submitted_data(p.request, p.version, parent_run_id=None, slot=None)
                    )
                    event_data[pair] = data
                event_rows.append(
                    {
                        "run_id": new["run_id"],
                        "tenant_id": tenant_id,
                        "actor": subject,
                        "data": data,
                    }
                )
        if taken:
            # Keys the tenant already held: the twin for an identical request, else 409.
            twins = await submits_q.get_by_idempotency_keys(
                conn, tenant_id, [str(p.request.idempotency_key) for p in taken]
            )
            for p in taken:
                stored = twins.get(str(p.request.idempotency_key))
                try:
                    if stored is None:  # pragma: no cover - the conflicting row cannot vanish
                        raise IdempotencyConflict("idempotency key conflict; retry the request")
                    twin = _twin(stored, p.request, p.fingerprint, subject=subject)
                    out[p.index] = BatchResult(row=twin, created=False)
                except IdempotencyConflict as exc:
                    out[p.index] = BatchResult(error=exc)
        await submits_q.insert_labels_many(conn, label_rows)
        await submits_q.append_submitted(conn, event_rows)
        return out

    async def _submit_one_statement(
        self,
        request: SubmitRequest,
        input_text: str,
        version: str,
        *,
        tenant_id: str,
        subject: str,
        api_key_id: uuid.UUID | None,
        access: str,
        trace: TraceContext | None = None,
    ) -> tuple[RowMapping, bool]:
        # No slot to admit: run row and event as one autocommit statement
        # (app/db/queries/submits.py), the same writes insert_prepared makes; the
        # wake-up follows the commit, coalesced (docs/adr/0037-coalesced-wake-ups.md).
        fingerprint = request.fingerprint()
        event_data = json.dumps(_submitted_data(request, version, parent_run_id=None, slot=None))

        async def insert(conn: AsyncConnection) -> tuple[RowMapping, bool]:
            row = await submits_q.submit_run(
                conn,
                run_id=new_run_id(),
                tenant_id=tenant_id,
                workflow=request.workflow,
                version=version,
                input_text=input_text,
                idempotency_key=request.idempotency_key,
                request_hash=fingerprint,
                created_by=subject,
                api_key_id=api_key_id,
                access=access,
                priority=request.priority,
                delay_seconds=request.delay,
                event_data=event_data,
                trace_parent=None if trace is None else trace.traceparent,
                trace_state=None if trace is None else trace.tracestate,
            )
            if row is None:
                return await _replay(
                    conn, request, fingerprint, tenant_id=tenant_id, subject=subject
                )
            return row, True

        row, created = await self.db.autocommit_retrying(insert, what="submit")
        if created:
            self.db.wake_workers()
        return row, created


async def insert_prepared(
    conn: AsyncConnection,
    request: SubmitRequest,
    input_text: str,
    version: str,
    *,
    tenant_id: str,
    subject: str,
    parent_run_id: uuid.UUID | None = None,
    api_key_id: uuid.UUID | None = None,
    access: str = "tenant",
    queue: QueueControls | None = None,
    trace: TraceContext | None = None,
    notify_in_transaction: bool = True,
) -> tuple[RowMapping, bool]:
    """Insert a prepared run inside the caller's transaction (idempotency included).

    ``notify_in_transaction`` False leaves the wake-up to the caller, who asks
    :meth:`app.db.database.Database.wake_workers` after commit (the API's submit path:
    docs/adr/0037-coalesced-wake-ups.md); True (child runs, reruns, triggers, schedules)
    issues NOTIFY inside the caller's transaction.

    ``trace`` is the W3C trace context stored with the run (its executions are traced
    as its children: :func:`app.core.tracing.execution_span`).

    A run with a concurrency key is admitted to one of the key's slots under the key's
    lock (:func:`app.engine.slots.acquire`, ``queue`` = the definition's controls,
    defaults if None). When none is free, ``on_limit="queue"`` inserts it waiting for one
    (``queued``, not claimable, with a ``blocked_reason``); ``"reject"`` raises.

    Raises:
        IdempotencyConflict: the key was used for a different request (409), or by
            another subject for an owner-policy run (which must stay invisible to it).
        ConcurrencyKeyBusy: every slot of the concurrency key is held (or runs wait for
            one) and ``on_limit`` is ``"reject"`` (409, ``active_run_id`` names the key's
            oldest active run). An identical idempotent retry is answered first.
    """
    fingerprint = request.fingerprint()
    controls = queue or QueueControls()
    key = request.concurrency_key
    slot: int | None = None
    waiting: str | None = None
    twin: RowMapping | None = None
    if key is not None:
        admission = await slots.acquire(
            conn,
            tenant_id=tenant_id,
            workflow=request.workflow,
            key=key,
            limit=controls.key_limit,
        )
        slot = admission.slot
        if slot is None and controls.on_limit == "queue":
            waiting = slots.waiting_reason(key, admission.limit)
        elif slot is None:
            if request.idempotency_key is not None:
                twin = await runs_q.get_by_idempotency_key(conn, tenant_id, request.idempotency_key)
            if twin is None:
                active = admission.active_run_id
                raise ConcurrencyKeyBusy(
                    f"concurrency key {key!r} of workflow {request.workflow!r} is busy "
                    f"(key_limit {admission.limit}): held by active run {active} (the "
                    "oldest of its active runs)",
                    active_run_id=None if active is None else str(active),
                    concurrency_key=key,
                    key_limit=admission.limit,
                )
    if twin is not None:
        # The busy key is held by this very request's run: an identical retry (200).
        return await _replay(conn, request, fingerprint, tenant_id=tenant_id, subject=subject)
    row = await runs_q.insert_run(
        conn,
        {
            "run_id": new_run_id(),
            "tenant_id": tenant_id,
            "workflow": request.workflow,
            "version": version,
            "status": RunStatus.QUEUED.value,
            "input": input_text,
            "idempotency_key": request.idempotency_key,
            "request_hash": fingerprint,
            "concurrency_key": request.concurrency_key,
            "created_by": subject,
            "api_key_id": api_key_id,
            "access": access,
            "parent_run_id": parent_run_id,
            "delay": request.delay,
            "priority": request.priority,
            "concurrency_slot": slot,
            "blocked_reason": waiting,
            "labels": labels_q.encode(request.labels),
            "trace_parent": None if trace is None else trace.traceparent,
            "trace_state": None if trace is None else trace.tracestate,
        },
        wait_for_slot=waiting is not None,
    )
    if row is None:
        return await _replay(conn, request, fingerprint, tenant_id=tenant_id, subject=subject)
    await labels_q.insert_labels(
        conn, run_id=row["run_id"], tenant_id=tenant_id, labels=request.labels
    )
    await events_q.append(
        conn,
        run_id=row["run_id"],
        tenant_id=tenant_id,
        kind=EventKind.RUN_SUBMITTED,
        actor=subject,
        data=_submitted_data(request, version, parent_run_id=parent_run_id, slot=slot),
    )
    if notify_in_transaction:
        await notify(conn)
    return row, True


def _submitted_data(
    request: SubmitRequest, version: str, *, parent_run_id: uuid.UUID | None, slot: int | None
) -> dict[str, Any]:
    # The run_submitted event's data, for both submit paths (one statement or not).
    return {
        "workflow": request.workflow,
        "version": version,
        "parent_run_id": None if parent_run_id is None else str(parent_run_id),
        **({} if request.concurrency_key is None else {"concurrency_slot": slot}),
    }


async def _replay(
    conn: AsyncConnection, request: SubmitRequest, fingerprint: str, *, tenant_id: str, subject: str
) -> tuple[RowMapping, bool]:
    # The idempotency key is taken: the same run for an identical request, else 409.
    assert request.idempotency_key is not None
    existing = await runs_q.get_by_idempotency_key(conn, tenant_id, request.idempotency_key)
    if existing is None:  # pragma: no cover - the conflicting row cannot vanish
        raise IdempotencyConflict("idempotency key conflict; retry the request")
    return _twin(existing, request, fingerprint, subject=subject), False


def _twin(
    existing: RowMapping, request: SubmitRequest, fingerprint: str, *, subject: str
) -> RowMapping:
    # The run holding the request's idempotency key: itself for an identical request,
    # else IdempotencyConflict (also for another subject's owner-policy run).
    if existing["access"] == "owner" and existing["created_by"] != subject:
        # The key namespace is the tenant's, but the run is the owner's: refuse without
        # naming it, exactly as for a different request.
        raise IdempotencyConflict(
            f"idempotency key {request.idempotency_key!r} was already used for a different request"
        )
    if existing["request_hash"] != fingerprint and not request.matches(existing["request_hash"]):
        raise IdempotencyConflict(
            f"idempotency key {request.idempotency_key!r} was already used for a "
            "different request (workflow, version, input or options differ)",
            run_id=str(existing["run_id"]),
        )
    return existing
