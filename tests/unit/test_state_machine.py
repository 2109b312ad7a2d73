"""State-machine manifests: one case per rule and boundary, with the exact message."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import BaseModel

import examples.document_flow as document_example
from app.core.status import STATE_MACHINE_KIND
from app.sdk import StateMachine, StateMachineDefinitionError, state_machine
from app.sdk.state_machine import StateDecodeError
from app.sdk.workflow import definitions_in


class Light(StateMachine):
    """A traffic light."""


class Off(Light):
    """Initial, no fields."""


class Red(Light):
    """Stop."""


class Green(Light):
    """Go, for a while."""

    seconds: int


class Broken(Light):
    """Terminal."""

    reason: str


class Other(StateMachine):
    """Another machine: its variants are not Light's."""


class Elsewhere(Other):
    """A variant of Other."""


class In(BaseModel):
    """Input."""

    n: int = 0


async def advance(parent: str, inp: In, state: Light) -> Light:
    """A valid advance."""
    return Red()


async def undo(parent: str, inp: In, state: Light) -> None:
    """A valid compensation."""


def declare(**overrides: Any) -> Any:
    manifest: dict[str, Any] = {
        "initial": Off,
        "terminal": [Broken],
        "timers": {Red: 30},
        "compensation": undo,
        "max_attempts": 3,
        "max_transitions": 16,
    }
    manifest.update(overrides)
    return state_machine("lights", **manifest)(advance)


VARIANTS = "(variants: Off, Red, Green, Broken)"
P = "state_machine('lights'): "

INVALID: list[tuple[str, dict[str, Any], str]] = [
    (
        "initial with fields",
        {"initial": Green},
        P + "initial: Green has fields (seconds); the initial state must have none",
    ),
    (
        "initial not a variant",
        {"initial": "Blue"},
        P + f"initial: 'Blue' is not a variant of Light {VARIANTS}",
    ),
    (
        "initial of another machine",
        {"initial": Elsewhere},
        P + f"initial: Elsewhere is not a variant of Light {VARIANTS}",
    ),
    (
        "terminal not a variant",
        {"terminal": [Broken, "Done"]},
        P + f"terminal: 'Done' is not a variant of Light {VARIANTS}",
    ),
    (
        "terminal of another machine",
        {"terminal": [Elsewhere]},
        P + f"terminal: Elsewhere is not a variant of Light {VARIANTS}",
    ),
    ("no terminal", {"terminal": []}, P + "terminal: at least one terminal state is required"),
    (
        "initial is terminal",
        {"terminal": [Off]},
        P + "terminal: Off is the initial state; a run must make a transition",
    ),
    (
        "timer not a variant",
        {"timers": {"Amber": 5}},
        P + f"timers: 'Amber' is not a variant of Light {VARIANTS}",
    ),
    (
        "terminal state with a timer",
        {"timers": {Broken: 5}},
        P + "timers: Broken is a terminal state; terminal states have no timer",
    ),
    ("timer 0 s", {"timers": {Red: 0}}, P + "timers: Red: 0 s is outside 1..86,400 s"),
    ("timer 0.5 s", {"timers": {Red: 0.5}}, P + "timers: Red: 0.5 s is outside 1..86,400 s"),
    (
        "timer 86,401 s",
        {"timers": {Red: 86_401}},
        P + "timers: Red: 86401 s is outside 1..86,400 s",
    ),
    ("timer not a number", {"timers": {Red: "5"}}, P + "timers: Red: '5' s is outside 1..86,400 s"),
    ("max_attempts 0", {"max_attempts": 0}, P + "max_attempts: 0 is outside 1..8"),
    ("max_attempts 9", {"max_attempts": 9}, P + "max_attempts: 9 is outside 1..8"),
    ("max_transitions 0", {"max_transitions": 0}, P + "max_transitions: 0 is outside 1..256"),
    ("max_transitions 257", {"max_transitions": 257}, P + "max_transitions: 257 is outside 1..256"),
    (
        "concurrency other than parent",
        {"concurrency": "global"},
        P + "concurrency: 'global' is not supported; use 'parent'",
    ),
]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [pytest.param(o, m, id=case) for case, o, m in INVALID],
)
def test_invalid_manifest_is_rejected_naming_the_field(
    overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(StateMachineDefinitionError) as info:
        declare(**overrides)
    assert str(info.value) == message


@pytest.mark.parametrize(
    "overrides",
    [
        {"timers": {Red: 1}},
        {"timers": {Red: 86_400, Green: 1.5}},
        {"timers": {}},
        {"max_attempts": 1},
        {"max_attempts": 8},
        {"max_transitions": 1},
        {"max_transitions": 256},
        {"initial": "Off", "terminal": ["Broken", Red], "timers": {"Green": 2}},
        {"compensation": None},
    ],
    ids=repr,
)
def test_boundaries_and_names_are_accepted(overrides: dict[str, Any]) -> None:
    machine = declare(**overrides)
    assert machine.definition.kind == STATE_MACHINE_KIND


def test_advance_signature_is_checked() -> None:
    def sync(parent: str, inp: In, state: Light) -> Light:
        return Red()

    async def untyped_state(parent: str, inp: In, state: Any) -> Light:
        return Red()

    async def two(parent: str, inp: In) -> Light:
        return Red()

    cases: list[tuple[Callable[..., Any], str]] = [
        (sync, "advance: must be an async def function"),
        (untyped_state, "advance: annotate the state parameter with the StateMachine subclass"),
        (two, "advance: must take (parent, input, state)"),
    ]
    for fn, message in cases:
        with pytest.raises(StateMachineDefinitionError) as info:
            state_machine("lights", initial=Off, terminal=[Broken])(fn)
        assert str(info.value) == P + message


def test_variants_encode_and_decode() -> None:
    assert list(Light.variants()) == ["Off", "Red", "Green", "Broken"]
    assert Green(seconds=3).encode() == {"name": "Green", "fields": {"seconds": 3}}
    assert Light.decode({"name": "Green", "fields": {"seconds": 3}}) == Green(seconds=3)
    assert isinstance(Green(seconds=1), Light)
    with pytest.raises(StateDecodeError, match="'Blue' is not a variant of Light"):
        Light.decode({"name": "Blue", "fields": {}})
    # The message names the field and the problem, never the value (states may hold PII).
    with pytest.raises(StateDecodeError) as info:
        Light.decode({"name": "Broken", "fields": {"reason": 12345, "extra": "secret"}})
    assert str(info.value) == (
        "fields of Broken no longer decode (reason: string_type, extra: extra_forbidden)"
    )
    with pytest.raises(StateDecodeError, match="not a"):
        Light.decode("Green")
    with pytest.raises(StateMachineDefinitionError, match="cannot be subclassed again"):
        types.new_class("Deeper", (Green,))


def test_definition_registers_its_states() -> None:
    module = types.ModuleType("m")
    module.flow = declare()  # type: ignore[attr-defined]
    (definition,) = definitions_in(module)
    assert definition.name == "lights"
    assert definition.states is not None
    assert [
        (s["name"], s["initial"], s["terminal"], s["timer_seconds"]) for s in definition.states
    ] == [
        ("Off", True, False, None),
        ("Red", False, False, 30.0),
        ("Green", False, False, None),
        ("Broken", False, True, None),
    ]
    assert definition.states[2]["fields"]["properties"]["seconds"]["type"] == "integer"


def test_document_flow_manifest() -> None:
    spec = document_example.document_flow.spec
    assert spec.initial is document_example.Queued
    assert spec.terminal == {"Completed", "Cancelled"}
    assert spec.timers == {"Waiting": 60.0}


def test_access_is_declared_like_a_workflows() -> None:
    assert declare().definition.access == "tenant"
    assert declare(access="owner").definition.access == "owner"
    with pytest.raises(StateMachineDefinitionError) as info:
        declare(access="public")
    assert str(info.value) == P + "access: must be 'tenant' or 'owner', not 'public'"
