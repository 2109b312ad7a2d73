"""Bounded state machines (DESIGN §1c), compiled onto the replay engine.

A machine is a sealed family of pydantic models: subclass :class:`StateMachine` once for
the machine, then once per variant. Variants are frozen models and may carry typed fields::

    class Doc(StateMachine):
        \"\"\"States of one document.\"\"\"

    class Queued(Doc):
        \"\"\"Submitted, nothing done yet.\"\"\"

    class Completed(Doc):
        \"\"\"Done.\"\"\"

        message: str

``Completed(message="ok")`` builds a state, ``match state: case Completed(message=m):``
reads one, ``Doc.variants()`` lists them in declaration order. Every variant *is* a
``Doc``, so ``advance(parent, input, state: Doc) -> Doc`` type-checks under mypy.

:func:`state_machine` turns ``advance`` into a workflow whose generated body (like a typed
DAG's) loops: wait the state's timer (``ctx.sleep``, database time), then run one
transition as ONE transactional step (``ctx.transaction``), so ``advance``'s database
writes, made through :func:`current_session`, commit exactly once with the new state in
the journal. The journal is the state's only store: ``GET /runs/{id}`` reads the latest
transition's output.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Awaitable, Callable, Iterable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError
from sqlalchemy.ext.asyncio import AsyncSession

from app.core.status import STATE_MACHINE_KIND, TRANSITION_STEP_PREFIX
from app.sdk.errors import Permanent, StepFailed
from app.sdk.queue import OnLimit, QueueControls, QueueControlsError, RateLimit
from app.sdk.retry import RetryPolicy
from app.sdk.workflow import Access, WorkflowDefinition, _check_name

if TYPE_CHECKING:
    from app.sdk.context import WorkflowContext

MachineT = TypeVar("MachineT", bound="StateMachine")
InT = TypeVar("InT", bound=BaseModel)

MAX_TIMER_SECONDS = 86_400
MAX_ATTEMPTS = 8
MAX_TRANSITIONS = 256


class StateMachineDefinitionError(ValueError):
    """A state machine whose manifest is invalid, raised when it is declared.

    The message starts with ``state_machine(<name>)`` and names the manifest field at
    fault (``initial``, ``terminal``, ``timers``, ``max_attempts``, ``max_transitions``,
    ``concurrency``, ``compensation``, or ``advance`` for the function itself).
    """


class StateDecodeError(ValueError):
    """A journaled state that is not (or no longer) a variant of its machine.

    The message names the variant and the failing field paths, never the values: states
    may hold personal data and this message ends up in the run's error and dead letter.
    """


class StateMachine(BaseModel):
    """Base of a state machine: subclass once for the machine, then once per variant.

    The direct subclass of ``StateMachine`` is the machine; its direct subclasses are its
    variants, named by their class name. Variants are frozen and reject unknown fields.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    _variants: ClassVar[dict[str, type[StateMachine]]]
    _machine: ClassVar[type[StateMachine] | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        parent = cls.__mro__[1]
        if parent is StateMachine:
            cls._variants = {}
            cls._machine = cls
        elif issubclass(parent, StateMachine) and parent._machine is parent:
            if cls.__name__ in parent._variants:
                raise StateMachineDefinitionError(
                    f"{parent.__name__}: two variants are named {cls.__name__!r}"
                )
            parent._variants[cls.__name__] = cls
            cls._machine = parent
        else:
            raise StateMachineDefinitionError(
                f"{cls.__name__}: a variant of a state machine cannot be subclassed again"
            )

    @classmethod
    def variants(cls) -> dict[str, type[StateMachine]]:
        """The machine's variants by name, in declaration order."""
        machine = cls._machine
        if machine is None:
            raise TypeError("StateMachine itself has no variants: subclass it")
        return dict(machine._variants)

    @property
    def state_name(self) -> str:
        """The variant's name (its class name)."""
        return type(self).__name__

    @classmethod
    def field_names(cls) -> list[str]:
        """Names of the variant's fields (empty for a plain state)."""
        return list(cls.model_fields)

    def encode(self) -> dict[str, Any]:
        """``{"name": <variant>, "fields": {…}}``: the journaled and API form."""
        return {"name": self.state_name, "fields": self.model_dump(mode="json")}

    @classmethod
    def decode(cls: type[MachineT], raw: object) -> MachineT:
        """Rebuild a state of this machine from :meth:`encode`'s form.

        Raises:
            StateDecodeError: not an object with a known variant name and valid fields.
        """
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
            raise StateDecodeError(
                f"journaled state is not a {{name, fields}} object of {cls.__name__}"
            )
        variant = cls.variants().get(raw["name"])
        if variant is None:
            raise StateDecodeError(f"{raw['name'][:100]!r} is not a variant of {cls.__name__}")
        try:
            state = variant.model_validate(raw.get("fields") or {})
        except ValidationError as exc:
            problems = ", ".join(
                f"{'.'.join(str(p) for p in e['loc']) or '$'}: {e['type']}"
                for e in exc.errors(include_url=False, include_input=False)[:10]
            )
            raise StateDecodeError(
                f"fields of {variant.__name__} no longer decode ({problems})"
            ) from None
        return typing.cast(MachineT, state)


_current_session: ContextVar[AsyncSession | None] = ContextVar(
    "treadle_current_session", default=None
)


def current_session() -> AsyncSession:
    """The ``AsyncSession`` of the transition (or compensation) executing now.

    Its writes commit in the very transaction that journals the new state: exactly once,
    and never if the worker lost the run (see ``WorkflowContext.transaction``). An
    accessor rather than a parameter keeps ``advance(parent, input, state)`` the signature
    DESIGN §1c gives, and mirrors :func:`app.sdk.current_step`.

    Raises:
        RuntimeError: called outside a transition or compensation.
    """
    session = _current_session.get()
    if session is None:
        raise RuntimeError("current_session() is only available inside advance or compensation")
    return session


Advance = Callable[[str, InT, MachineT], Awaitable[MachineT]]
Compensate = Callable[[str, InT, MachineT], Awaitable[None]]
StateRef = type[StateMachine] | str


@dataclass(frozen=True)
class StateMachineSpec:
    """A validated manifest (see :func:`state_machine` for the fields)."""

    name: str
    machine: type[StateMachine]
    initial: type[StateMachine]
    terminal: frozenset[str]
    timers: Mapping[str, float]
    max_attempts: int
    max_transitions: int

    def states(self) -> list[dict[str, Any]]:
        """What workers register with the definition: one entry per variant."""
        return [
            {
                "name": name,
                "fields": variant.model_json_schema(),
                "initial": variant is self.initial,
                "terminal": name in self.terminal,
                "timer_seconds": self.timers.get(name),
            }
            for name, variant in self.machine.variants().items()
        ]


@dataclass(frozen=True, eq=False)
class StateMachineWorkflow(Generic[InT, MachineT]):
    """What :func:`state_machine` returns: the manifest, ``advance`` and the definition.

    ``definition`` is the workflow workers register (kind ``state_machine``); a module's
    top-level ``StateMachineWorkflow`` is found like a ``@workflow``. Call ``advance`` /
    ``compensation`` directly in unit tests.
    """

    spec: StateMachineSpec
    advance: Advance[InT, MachineT]
    compensation: Compensate[InT, MachineT] | None
    definition: WorkflowDefinition[InT, dict[str, Any]]


def state_machine(
    name: str,
    *,
    initial: StateRef,
    terminal: Iterable[StateRef],
    timers: Mapping[StateRef, float] | None = None,
    compensation: Compensate[Any, Any] | None = None,
    max_attempts: int = 3,
    max_transitions: int = 64,
    concurrency: str = "parent",
    version: int | str = 1,
    access: Access = "tenant",
    on_limit: OnLimit = "reject",
    concurrency_limit: int | None = None,
    rate_limit: RateLimit | None = None,
) -> Callable[[Advance[InT, MachineT]], StateMachineWorkflow[InT, MachineT]]:
    """Declare ``async def advance(parent, input, state) -> state`` as a state machine.

    Each run drives one business entity, its ``parent``: the run's ``concurrency_key``,
    required at submission (422 without it), so at most one run per entity is active.
    Starting from ``initial``, every transition calls ``advance`` inside ONE transactional
    step: its writes through :func:`current_session` and the new state commit together.
    A state listed in ``timers`` first waits that many seconds of database time. The run
    completes when ``advance`` returns a ``terminal`` state (the output is that state's
    ``{"name", "fields"}``); it fails, with a dead letter, with reason
    ``failure_transitions_exhausted`` after ``max_transitions`` transitions without one,
    ``failure_attempts_exhausted`` when one transition failed ``max_attempts`` times, and
    ``failure_corrupt_state`` when a journaled state no longer decodes. Errors name
    states, never their fields or the input. ``Permanent`` raised by ``advance`` ends the
    run at once (``failure_non_retryable``).

    Cancelling the run (``POST /runs/{id}/cancel``) runs ``compensation(parent, input,
    state)`` with the last committed state, as a transactional step with ``max_attempts``
    attempts; the run is ``cancelled`` only once it committed (``failed`` if it gave up).
    A run cancelled before its first transition committed has nothing to compensate.

    Args:
        name: workflow name (as for ``@workflow``).
        initial: the start state: a variant without fields (class or name).
        terminal: states that complete the run (classes or names); at least one.
        timers: ``{state: seconds}`` waited in that state before the next transition;
            1..86,400 s; never a terminal state.
        compensation: ``async def (parent, input, state) -> None`` run on cancel.
        max_attempts: attempts per transition (and per compensation), 1..8.
        max_transitions: transitions per run, 1..256.
        concurrency: ``"parent"``, the only policy: one active run per parent.
        version: definition version.
        access: who may see and act on its runs, as for ``@workflow``: ``"tenant"``
            (default) or ``"owner"`` (only the submitting subject; others get 404).
        on_limit: a second run for a busy parent: ``"reject"`` (409) or ``"queue"`` (it
            starts when the active one ends, in submission order).
        concurrency_limit: at most this many runs executing at once across all workers.
        rate_limit: a :class:`app.sdk.queue.RateLimit` on run starts.
        (Queue controls as for ``@workflow``, app/sdk/queue.py.)

    Returns:
        A decorator producing a :class:`StateMachineWorkflow`.

    Raises:
        StateMachineDefinitionError: an invalid manifest; the message names the field.
    """
    _check_name(name)
    label = f"state_machine({name!r})"

    def fail(field: str, message: str) -> StateMachineDefinitionError:
        return StateMachineDefinitionError(f"{label}: {field}: {message}")

    if access not in ("tenant", "owner"):
        raise fail("access", f"must be 'tenant' or 'owner', not {access!r}")

    try:
        queue = QueueControls(
            on_limit=on_limit, concurrency_limit=concurrency_limit, rate_limit=rate_limit
        )
    except QueueControlsError as exc:
        raise StateMachineDefinitionError(f"{label}: {exc}") from None

    def decorate(advance: Advance[InT, MachineT]) -> StateMachineWorkflow[InT, MachineT]:
        machine, input_model = _signature(advance, fail)
        spec = _validate(
            name,
            machine,
            initial=initial,
            terminal=terminal,
            timers=timers or {},
            max_attempts=max_attempts,
            max_transitions=max_transitions,
            concurrency=concurrency,
            compensation=compensation,
            fail=fail,
        )
        definition = _definition(
            spec, advance, compensation, input_model, str(version), queue, access
        )
        return StateMachineWorkflow(
            spec=spec, advance=advance, compensation=compensation, definition=definition
        )

    return decorate


Fail = Callable[[str, str], StateMachineDefinitionError]


def _signature(fn: Callable[..., Any], fail: Fail) -> tuple[type[StateMachine], type[BaseModel]]:
    if not inspect.iscoroutinefunction(fn):
        raise fail("advance", "must be an async def function")
    params = list(inspect.signature(fn).parameters)
    if len(params) != 3:
        raise fail("advance", "must take (parent, input, state)")
    hints = typing.get_type_hints(fn)
    input_model = hints.get(params[1])
    if not (isinstance(input_model, type) and issubclass(input_model, BaseModel)):
        raise fail("advance", "annotate the input parameter with a pydantic BaseModel")
    machine = hints.get(params[2])
    if not (
        isinstance(machine, type)
        and issubclass(machine, StateMachine)
        and machine._machine is machine
    ):
        raise fail("advance", "annotate the state parameter with the StateMachine subclass")
    return machine, input_model


def _variant(machine: type[StateMachine], ref: object, field: str, fail: Fail) -> str:
    variants = machine.variants()
    if isinstance(ref, type) and issubclass(ref, StateMachine):
        found = ref.__name__ if variants.get(ref.__name__) is ref else None
        shown = ref.__name__
    else:
        found = ref if isinstance(ref, str) and ref in variants else None
        shown = repr(ref)
    if found is None:
        raise fail(
            field,
            f"{shown} is not a variant of {machine.__name__} "
            f"(variants: {', '.join(variants) or 'none'})",
        )
    return found


def _validate(
    name: str,
    machine: type[StateMachine],
    *,
    initial: StateRef,
    terminal: Iterable[StateRef],
    timers: Mapping[StateRef, float],
    max_attempts: int,
    max_transitions: int,
    concurrency: str,
    compensation: Compensate[Any, Any] | None,
    fail: Fail,
) -> StateMachineSpec:
    variants = machine.variants()
    if not variants:
        raise fail("advance", f"{machine.__name__} has no variants")
    start = _variant(machine, initial, "initial", fail)
    if variants[start].model_fields:
        raise fail(
            "initial",
            f"{start} has fields ({', '.join(variants[start].model_fields)}); "
            "the initial state must have none",
        )
    ends = [_variant(machine, ref, "terminal", fail) for ref in terminal]
    if not ends:
        raise fail("terminal", "at least one terminal state is required")
    if start in ends:
        raise fail("terminal", f"{start} is the initial state; a run must make a transition")
    waits: dict[str, float] = {}
    for ref, seconds in timers.items():
        state = _variant(machine, ref, "timers", fail)
        if state in ends:
            raise fail("timers", f"{state} is a terminal state; terminal states have no timer")
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, int | float)
            or not 1 <= seconds <= MAX_TIMER_SECONDS
        ):
            raise fail("timers", f"{state}: {seconds!r} s is outside 1..86,400 s")
        waits[state] = float(seconds)
    for field, value, top in (
        ("max_attempts", max_attempts, MAX_ATTEMPTS),
        ("max_transitions", max_transitions, MAX_TRANSITIONS),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
            raise fail(field, f"{value!r} is outside 1..{top}")
    if concurrency != "parent":
        raise fail("concurrency", f"{concurrency!r} is not supported; use 'parent'")
    if compensation is not None and not inspect.iscoroutinefunction(compensation):
        raise fail("compensation", "must be an async def (parent, input, state) function")
    return StateMachineSpec(
        name=name,
        machine=machine,
        initial=variants[start],
        terminal=frozenset(ends),
        timers=waits,
        max_attempts=max_attempts,
        max_transitions=max_transitions,
    )


def _corrupt(step_id: str, exc: StateDecodeError) -> StepFailed:
    return StepFailed(step_id, "failure_corrupt_state", "StateDecodeError", str(exc), 1)


def _definition(
    spec: StateMachineSpec,
    advance: Advance[Any, Any],
    compensation: Compensate[Any, Any] | None,
    input_model: type[BaseModel],
    version: str,
    queue: QueueControls,
    access: Access,
) -> WorkflowDefinition[Any, dict[str, Any]]:
    machine = spec.machine
    retry = RetryPolicy(max_attempts=spec.max_attempts, delay=1.0, max_delay=60.0)

    # One function object per machine (not per run): the engine caches per function.
    async def transition(tx: AsyncSession, parent: str, input_value: Any, raw: Any) -> Any:
        state = machine.decode(raw)
        token = _current_session.set(tx)
        try:
            new = await advance(parent, input_value, state)
        finally:
            _current_session.reset(token)
        if not (isinstance(new, StateMachine) and type(new) in machine.variants().values()):
            raise Permanent(
                TypeError(
                    f"advance returned {type(new).__name__}, not a variant of {machine.__name__}"
                )
            )
        return new.encode()

    transition.__qualname__ = f"state_machine[{spec.name}].advance"

    async def compensate(tx: AsyncSession, parent: str, input_value: Any, raw: Any) -> None:
        assert compensation is not None
        state = machine.decode(raw)
        token = _current_session.set(tx)
        try:
            await compensation(parent, input_value, state)
        finally:
            _current_session.reset(token)

    compensate.__qualname__ = f"state_machine[{spec.name}].compensation"

    async def body(ctx: WorkflowContext, input_value: BaseModel) -> dict[str, Any]:
        parent = ctx.concurrency_key
        if parent is None:
            raise StepFailed(
                "start",
                "failure_non_retryable",
                "MissingParent",
                "a state machine run needs a concurrency_key (its parent)",
                1,
            )
        state: StateMachine = spec.initial()
        step_id = "start"
        n = 0
        # Transitions of the current budget: a requeue or retry gives a fresh one, so the
        # transitions replayed from before it do not count (ctx._in_fresh_budget).
        counted = 0
        while counted < spec.max_transitions:
            n += 1
            seconds = spec.timers.get(state.state_name)
            if seconds is not None:
                await ctx.sleep(seconds)
            if ctx._in_fresh_budget():
                counted += 1
            step_id = f"{TRANSITION_STEP_PREFIX}{n}:{state.state_name}"
            raw = await ctx._transaction(
                transition,
                (parent, input_value, state.encode()),
                name=step_id,
                retry=retry,
                timeout=None,
                on_cancel=None if compensation is None else compensate,
                on_cancel_args=(parent, input_value),
                on_cancel_retry=retry,
            )
            try:
                state = machine.decode(raw)
            except StateDecodeError as exc:
                raise _corrupt(step_id, exc) from None
            if state.state_name in spec.terminal:
                return state.encode()
        raise StepFailed(
            step_id,
            "failure_transitions_exhausted",
            "TransitionsExhausted",
            f"no terminal state after max_transitions={spec.max_transitions} "
            f"(last state: {state.state_name})",
            spec.max_transitions,
        )

    body.__qualname__ = f"state_machine[{spec.name}]"
    return WorkflowDefinition(
        name=spec.name,
        version=version,
        fn=body,
        input_model=input_model,
        output_adapter=TypeAdapter(dict[str, Any]),
        kind=STATE_MACHINE_KIND,
        access=access,
        states=spec.states(),
        queue=queue,
    )
