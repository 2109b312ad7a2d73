"""The context a workflow body receives: its only door to durable operations."""

from __future__ import annotations

import abc
import uuid
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar, overload

from app.sdk.retry import RetryPolicy

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class StepInfo:
    """What a running step may know about itself (read with :func:`current_step`).

    Attributes:
        run_id: the run.
        step_id: the journaled step id (unique within the run).
        attempt: 1-based attempt number.
        idempotency_key: ``"<run_id>:<step_id>"``, stable across attempts and replays;
            pass it to external APIs so a retried attempt is not applied twice.
        workflow: workflow name.
    """

    run_id: uuid.UUID
    step_id: str
    attempt: int
    idempotency_key: str
    workflow: str


_current_step: ContextVar[StepInfo | None] = ContextVar("treadle_current_step", default=None)


def current_step() -> StepInfo:
    """Return the :class:`StepInfo` of the step executing in this task or thread.

    Raises:
        RuntimeError: called outside a step.
    """
    info = _current_step.get()
    if info is None:
        raise RuntimeError("current_step() is only available while a step executes")
    return info


class WorkflowContext(abc.ABC):
    """Durable operations for workflow code (DESIGN §1a).

    Workflow bodies must be deterministic: anything that reads the clock, randomness or the
    outside world belongs in a step. The engine replays the body from the start after every
    suspension or crash, returning journaled results instead of re-running steps.
    """

    run_id: uuid.UUID
    workflow: str

    @overload
    def step(
        self,
        fn: Callable[..., Awaitable[T]],
        *args: Any,
        name: str | None = None,
        retry: RetryPolicy | None = None,
        timeout: float | None = None,
    ) -> Awaitable[T]: ...

    @overload
    def step(
        self,
        fn: Callable[..., T],
        *args: Any,
        name: str | None = None,
        retry: RetryPolicy | None = None,
        timeout: float | None = None,
    ) -> Awaitable[T]: ...

    def step(
        self,
        fn: Callable[..., Any],
        *args: Any,
        name: str | None = None,
        retry: RetryPolicy | None = None,
        timeout: float | None = None,
    ) -> Awaitable[Any]:
        """Run ``fn(*args)`` as a journaled step, at least once.

        The step id is assigned when this method is *called* (call order, not completion
        order), so ``asyncio.gather(ctx.step(a), ctx.step(b))`` replays identically.

        Args:
            fn: a sync or async function; sync functions run in a worker thread.
            *args: positional arguments (not journaled; keep them derived from the input
                and earlier step results so replays pass the same values).
            name: step name; default the function's ``__qualname__``. A name used again in
                one run gets ``#2``, ``#3`` … appended.
            retry: retry policy (default :data:`app.sdk.retry.DEFAULT_RETRY`).
            timeout: seconds per attempt; an attempt that outruns it is ``timed_out``.

        Returns:
            An awaitable of the step's result, validated against ``fn``'s return annotation
            (so the first execution and every replay return the same type).

        Raises:
            StepFailed: the step gave up (``Permanent``, attempts exhausted, timed out).
            ValueError: ``timeout`` is not positive.
        """
        return self._step(fn, args, name=name, retry=retry, timeout=timeout)

    @abc.abstractmethod
    def _step(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        *,
        name: str | None,
        retry: RetryPolicy | None,
        timeout: float | None,
    ) -> Awaitable[Any]:
        """Engine hook behind :meth:`step`."""

    @property
    def idempotency_key(self) -> str:
        """``"<run_id>:<step_id>"`` of the step executing now (inside a step only)."""
        return current_step().idempotency_key
