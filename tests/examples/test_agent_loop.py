"""examples/agent_loop.py with the test kit: tool steps, streamed tokens, once per replay."""

from __future__ import annotations

import pytest

from app.sdk.testing import WorkflowTestEnv
from examples import agent_loop
from examples.agent_loop import AgentResult, Question, agent


async def test_the_agent_calls_both_tools_then_answers_and_streams_its_tokens(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(agent_loop, "TOKEN_DELAY_SECONDS", 0.0)
    async with WorkflowTestEnv([agent]) as env:
        run = await env.start(agent, Question(question="What is 17 * 23, and is it warm in Oslo?"))
        result = await env.result(run)
        emits = await env.emits(run)
        steps = [s.step_id for s in await env.steps(run)]
    assert result == AgentResult(
        answer="17 * 23 = 391. It is 4 °C in Oslo, not warm.",
        turns=3,
        tools_used=["calculator", "weather"],
    )
    assert steps == ["model", "tool:calculator", "model#2", "tool:weather", "model#3"]
    # One turn event per turn (the workflow's), tokens tagged with their model step.
    assert [e.data for e in emits if e.name == "turn"] == [{"turn": 1}, {"turn": 2}, {"turn": 3}]
    final = "".join(e.data["text"] for e in emits if e.step_id == "model#3")
    assert final == result.answer
    assert {e.attempt for e in emits if e.name == "token"} == {1}


async def test_a_question_without_tools_is_answered_in_one_turn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(agent_loop, "TOKEN_DELAY_SECONDS", 0.0)
    async with WorkflowTestEnv([agent]) as env:
        run = await env.start(agent, Question(question="Tell me a joke"))
        result = await env.result(run)
    assert result.turns == 1 and result.tools_used == []
