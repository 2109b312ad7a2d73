"""Property tests (hypothesis): state-machine manifests against an independent oracle.

Hypothesis builds a machine (one to five variants, each with or without fields) and a
manifest (initial, terminal, timers, max_attempts, max_transitions, concurrency) from
valid and invalid parts: variant classes, variant names, names of no variant, variants of
another machine, numbers in and out of range, booleans, NaN, strings. The oracle below
restates DESIGN §1c without reading ``app.sdk.state_machine``:

- the initial state is a variant of the machine and has no fields;
- terminal states are variants; at least one; the initial state is not one of them (a run
  must make a transition);
- timer states are variants, not terminal; each waits 1..86,400 s (a real number, not a
  boolean);
- max_attempts is an integer in 1..8, max_transitions an integer in 1..256;
- concurrency is ``"parent"``.

Registration must accept exactly the manifests the oracle accepts (and keep what they
say), and reject every other one with ``StateMachineDefinitionError`` naming one of the
offending fields. Derandomized with a fixed budget like ``test_properties.py``.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from app.sdk import StateMachine, StateMachineDefinitionError, state_machine

EXAMPLES = int(os.environ.get("TREADLE_HYPOTHESIS_EXAMPLES", "300"))
PROPERTY = settings(
    max_examples=EXAMPLES,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

NAMES = ["Queued", "Working", "Waiting", "Done", "Failed"]


class In(BaseModel):
    """Input of every generated machine."""

    n: int = 0


class Foreign(StateMachine):
    """Another machine: its variant is never a variant of a generated one."""


class Elsewhere(Foreign):
    """A variant of Foreign."""


@dataclass(frozen=True)
class Ref:
    """How a manifest names a state: a variant (by class or name) or something else."""

    kind: str  # "class", "name", "unknown", "foreign", "junk"
    variant: str = ""

    def resolve(self, variants: dict[str, type[StateMachine]]) -> object:
        if self.kind == "class":
            return variants[self.variant]
        if self.kind == "name":
            return self.variant
        if self.kind == "unknown":
            return "Nowhere"
        if self.kind == "foreign":
            return Elsewhere
        return 42

    @property
    def known(self) -> bool:
        return self.kind in ("class", "name")


@dataclass(frozen=True)
class Case:
    fields: dict[str, bool]  # variant name -> has fields, in declaration order
    initial: Ref
    terminal: list[Ref]
    timers: list[tuple[Ref, Any]]
    max_attempts: Any
    max_transitions: Any
    concurrency: str


def refs(names: list[str]) -> st.SearchStrategy[Ref]:
    known = st.builds(Ref, st.sampled_from(["class", "name"]), st.sampled_from(names))
    other = st.builds(Ref, st.sampled_from(["unknown", "foreign", "junk"]))
    return st.one_of(known, known, known, other)


BOUNDARY_SECONDS = [0, 1, 86_400, 86_401, 0.5, 0.999, 1.0, 86_400.0, 86_400.5, True, False, "5"]


def seconds() -> st.SearchStrategy[Any]:
    # Boundaries first: a rule is wrong at its edges (0 < s instead of 1 <= s, True as 1).
    boundary = st.sampled_from(BOUNDARY_SECONDS)
    return st.one_of(
        boundary,
        boundary,
        st.integers(-10, 90_000),
        st.floats(allow_nan=True, allow_infinity=True),
    )


def bound(top: int) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.integers(-3, top + 3),
        st.sampled_from([0, 1, top, top + 1, True, 2.0, "3", None]),
    )


# One fault at a rule's edge, each value of which a single-edge case picks uniformly.
EDGES: list[tuple[str, Any]] = [
    *(("max_attempts", v) for v in [0, 1, 8, 9, -1, True, False, 2.0, "3", None]),
    *(("max_transitions", v) for v in [0, 1, 256, 257, -1, True, 2.0, None]),
    *(("timer_value", v) for v in [*BOUNDARY_SECONDS, math.nan, math.inf, -math.inf]),
    *(("initial", v) for v in ["unknown", "foreign", "junk", "with_fields"]),
    *(("terminal", v) for v in ["empty", "unknown", "foreign", "junk", "initial"]),
    *(("timer_state", v) for v in ["terminal", "unknown", "foreign", "junk", "initial"]),
    ("concurrency", "global"),
]


@st.composite
def cases(draw: st.DrawFn, *, single_edge: bool = False) -> Case:
    """A valid manifest, then broken.

    Default: each of its six fields broken with probability 1/5, by any generated part, so
    valid manifests, single faults and several faults at once are all common (purely
    random parts would almost never make a valid one). ``single_edge``: exactly one
    change from :data:`EDGES` (which may keep it valid, e.g. ``max_attempts=8``).
    """
    names = draw(st.lists(st.sampled_from(NAMES), min_size=2, max_size=5, unique=True))
    fields = {name: draw(st.booleans()) for name in names}
    start = draw(st.sampled_from(names))
    fields[start] = False
    others = [n for n in names if n != start]
    ends = draw(st.lists(st.sampled_from(others), min_size=1, max_size=3))
    known = st.sampled_from(["class", "name"])
    initial = Ref(draw(known), start)
    terminal = [Ref(draw(known), n) for n in ends]
    waits = [n for n in names if n not in ends]  # never empty: the initial state may wait
    timers: list[tuple[Ref, Any]] = [
        (Ref(draw(known), n), draw(st.one_of(st.integers(1, 86_400), st.floats(1, 86_400))))
        for n in draw(st.lists(st.sampled_from(waits), max_size=3))
    ]
    attempts: Any = draw(st.integers(1, 8))
    transitions: Any = draw(st.integers(1, 256))
    concurrency = "parent"
    if single_edge:
        field, value = draw(st.sampled_from(EDGES))
        other = {"unknown": Ref("unknown"), "foreign": Ref("foreign"), "junk": Ref("junk")}
        if field == "max_attempts":
            attempts = value
        elif field == "max_transitions":
            transitions = value
        elif field == "timer_value":
            timers = [*timers, (Ref(draw(known), draw(st.sampled_from(waits))), value)]
        elif field == "initial" and value == "with_fields":
            fields[start] = True
        elif field == "initial":
            initial = other[value]
        elif field == "terminal" and value == "empty":
            terminal = []
        elif field == "terminal":
            terminal = [*terminal, other.get(value, Ref(draw(known), start))]
        elif field == "timer_state":
            state = {"terminal": Ref("class", ends[0]), "initial": Ref("name", start)}
            timers = [*timers, ({**other, **state}[value], 60)]
        else:
            concurrency = value
        return Case(fields, initial, terminal, timers, attempts, transitions, concurrency)
    ref = refs(names)
    broken = [draw(st.integers(0, 4)) == 0 for _ in range(6)]
    if broken[0]:
        if draw(st.booleans()):
            initial = draw(ref)
        else:
            fields[start] = True
    if broken[1]:
        terminal = draw(
            st.one_of(st.lists(ref, max_size=3), st.just([*terminal, Ref("name", start)]))
        )
    if broken[2]:
        timers = draw(
            st.one_of(
                st.lists(st.tuples(ref, seconds()), max_size=3),
                st.just([*timers, (Ref("class", ends[0]), 60)]),
                seconds().map(lambda v: [*timers, (Ref("name", waits[0]), v)]),
            )
        )
    if broken[3]:
        attempts = draw(bound(8))
    if broken[4]:
        transitions = draw(bound(256))
    if broken[5]:
        concurrency = "global"
    return Case(fields, initial, terminal, timers, attempts, transitions, concurrency)


def offending(case: Case) -> set[str]:
    """The oracle: every manifest field that breaks a rule of DESIGN §1c."""
    bad: set[str] = set()
    if not case.initial.known or case.fields[case.initial.variant]:
        bad.add("initial")
    ends = {r.variant for r in case.terminal if r.known}
    if not case.terminal or any(not r.known for r in case.terminal):
        bad.add("terminal")
    if case.initial.known and case.initial.variant in ends:
        bad.add("terminal")
    for ref, value in case.timers:
        in_range = (
            isinstance(value, int | float)
            and not isinstance(value, bool)
            and not math.isnan(value)
            and 1 <= value <= 86_400
        )
        if not ref.known or ref.variant in ends or not in_range:
            bad.add("timers")
    for field, value, top in (
        ("max_attempts", case.max_attempts, 8),
        ("max_transitions", case.max_transitions, 256),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
            bad.add(field)
    if case.concurrency != "parent":
        bad.add("concurrency")
    return bad


def machine_for(case: Case) -> tuple[type[StateMachine], dict[str, type[StateMachine]]]:
    machine = type("Generated", (StateMachine,), {"__doc__": "A generated machine."})
    variants: dict[str, type[StateMachine]] = {}
    for name, has_fields in case.fields.items():
        namespace: dict[str, Any] = {"__doc__": f"Variant {name}."}
        if has_fields:
            namespace["__annotations__"] = {"detail": str}
        variants[name] = type(name, (machine,), namespace)
    return machine, variants


@PROPERTY
@given(cases())
def test_registration_accepts_exactly_the_valid_manifests(case: Case) -> None:
    check_registration(case)


@PROPERTY
@given(cases(single_edge=True))
def test_each_rule_holds_at_its_edges(case: Case) -> None:
    """One change at a rule's edge (1 and 8 attempts, 86,400 and 86,400.5 s, True, NaN…)."""
    check_registration(case)


def check_registration(case: Case) -> None:
    """Declare the case's manifest; compare the outcome with the oracle's."""
    machine, variants = machine_for(case)

    async def advance(parent: str, inp: In, state: Any) -> Any:
        return state

    # Real annotations (not strings): the machine exists only inside this example.
    advance.__annotations__ = {"parent": str, "inp": In, "state": machine, "return": machine}
    # The dict passed is what counts: a later entry for the same key replaces an earlier
    # one, while a variant named once by class and once by name is two entries.
    timers: dict[object, Any] = {}
    for ref, value in case.timers:
        timers[ref.resolve(variants)] = value
    by_key: dict[object, Ref] = {r.resolve(variants): r for r, _ in case.timers}
    entries = [(by_key[key], value) for key, value in timers.items()]
    expected = offending(
        Case(
            fields=case.fields,
            initial=case.initial,
            terminal=case.terminal,
            timers=entries,
            max_attempts=case.max_attempts,
            max_transitions=case.max_transitions,
            concurrency=case.concurrency,
        )
    )
    event(f"offending fields: {len(expected)}")  # --hypothesis-show-statistics
    try:
        declared = state_machine(
            "generated",
            initial=case.initial.resolve(variants),  # type: ignore[arg-type]
            terminal=[r.resolve(variants) for r in case.terminal],  # type: ignore[misc]
            timers=timers,  # type: ignore[arg-type]
            max_attempts=case.max_attempts,
            max_transitions=case.max_transitions,
            concurrency=case.concurrency,
        )(advance)
    except StateMachineDefinitionError as exc:
        message = str(exc)
        prefix = "state_machine('generated'): "
        assert message.startswith(prefix), message
        field = message.removeprefix(prefix).split(":", 1)[0]
        assert expected, f"valid manifest rejected: {message}"
        assert field in expected, (field, expected, message)
        return
    assert not expected, f"invalid manifest accepted (offending: {sorted(expected)})"
    spec = declared.spec
    assert spec.initial is variants[case.initial.variant]
    assert spec.terminal == {r.variant for r in case.terminal}
    assert dict(spec.timers) == {r.variant: float(v) for r, v in entries}
    assert (spec.max_attempts, spec.max_transitions) == (case.max_attempts, case.max_transitions)
    states = {s["name"]: s for s in declared.definition.states or []}
    assert list(states) == list(case.fields)
    assert [n for n, s in states.items() if s["terminal"]] == [
        n for n in case.fields if n in spec.terminal
    ]
