"""An agent loop: the model call and each tool call are steps, tokens stream live.

The ``agent`` workflow asks a model what to do, runs the tool it names, feeds the result
back, and repeats until the model answers (or ``max_turns`` is reached). Every model call
and every tool call is a journaled step: after a crash the loop replays the turns it
already took from the journal (no model call is paid twice) and goes on from there.

The model step streams its answer with ``ctx.emit("token", …)`` while it "generates":
each token is an ``emitted`` event of the run, written as it is made, so a client sees
the answer appear (``treadle runs events RUN_ID --follow``, or
``GET /runs/{id}/events?follow=true``). A retried model call streams again: its tokens
carry the new ``attempt``. The workflow itself emits one ``turn`` event per turn, once
(replays do not repeat it).

The model is a deterministic fake so the example runs anywhere, without network or
keys: it reads the conversation and either calls ``calculator`` / ``weather`` or answers.
Replace :func:`call_model` with a real client (pass ``current_step().idempotency_key``
as the provider's idempotency key) and the loop stays the same.

Try it with ``treadle dev`` and::

    treadle runs start agent --input '{"question": "What is 17 * 23, and is it warm in Oslo?"}'
    treadle runs events RUN_ID --follow
"""

from __future__ import annotations

import asyncio
import re
from typing import Literal

from pydantic import BaseModel, Field

from app.sdk import Permanent, RetryPolicy, WorkflowContext, workflow

# Pause between two streamed tokens: long enough to watch the answer arrive.
TOKEN_DELAY_SECONDS = 0.05

CITY_WEATHER_C = {"oslo": 4, "lisbon": 19, "cairo": 27, "toronto": -2}


class Question(BaseModel):
    """Input of the ``agent`` workflow."""

    question: str = Field(min_length=1, max_length=2000)
    max_turns: int = Field(default=6, ge=1, le=20)


class Message(BaseModel):
    """One entry of the conversation the model sees."""

    role: Literal["user", "assistant", "tool"]
    content: str
    tool: str | None = None


class ModelReply(BaseModel):
    """What one model call returns: a tool call, or the final answer."""

    tool: str | None = None
    argument: str | None = None
    answer: str | None = None


class AgentResult(BaseModel):
    """Output of the ``agent`` workflow."""

    answer: str
    turns: int
    tools_used: list[str]


def _plan(messages: list[Message]) -> ModelReply:
    """The fake model's decision: the next tool the question needs, else the answer."""
    question = messages[0].content.lower()
    used = {m.tool for m in messages if m.role == "tool"}
    product = re.search(r"(\d+)\s*[*x×]\s*(\d+)", question)
    if product and "calculator" not in used:
        return ModelReply(tool="calculator", argument=f"{product[1]}*{product[2]}")
    city = next((c for c in CITY_WEATHER_C if c in question), None)
    if city and "weather" not in used:
        return ModelReply(tool="weather", argument=city)
    facts = [m.content for m in messages if m.role == "tool"]
    answer = (
        " ".join(facts)
        if facts
        else "I have no tool for that; I can multiply and tell you the weather."
    )
    return ModelReply(answer=answer)


async def call_model(messages: list[Message], ctx: WorkflowContext) -> ModelReply:
    """One model call (a step): stream the reply token by token, then return it."""
    reply = _plan(messages)
    text = reply.answer or f"calling {reply.tool}({reply.argument})"
    for token in re.findall(r"\S+\s*", text):
        ctx.emit("token", {"text": token})
        await asyncio.sleep(TOKEN_DELAY_SECONDS)
    return reply


def calculator(expression: str) -> str:
    """Multiply two integers written ``a*b`` (a tool step)."""
    left, _, right = expression.partition("*")
    if not (left.isdigit() and right.isdigit()):
        raise Permanent(ValueError(f"calculator takes a*b, got {expression!r}"))
    return f"{left} * {right} = {int(left) * int(right)}."


def weather(city: str) -> str:
    """Today's temperature in ``city`` (a tool step; a fixed table stands in for a service)."""
    celsius = CITY_WEATHER_C.get(city)
    if celsius is None:
        raise Permanent(LookupError(f"no weather for {city!r}"))
    feel = "warm" if celsius >= 18 else "not warm"
    return f"It is {celsius} °C in {city.title()}, {feel}."


TOOLS = {"calculator": calculator, "weather": weather}


@workflow("agent", version="1")
async def agent(ctx: WorkflowContext, question: Question) -> AgentResult:
    """Ask the model, run the tool it picks, repeat until it answers."""
    messages = [Message(role="user", content=question.question)]
    used: list[str] = []
    for turn in range(1, question.max_turns + 1):
        ctx.emit("turn", {"turn": turn})
        reply = await ctx.step(
            call_model, messages, ctx, name="model", retry=RetryPolicy(max_attempts=3, delay=1)
        )
        if reply.tool is None:
            return AgentResult(answer=reply.answer or "", turns=turn, tools_used=used)
        tool = TOOLS.get(reply.tool)
        if tool is None:
            raise Permanent(LookupError(f"the model asked for an unknown tool {reply.tool!r}"))
        result = await ctx.step(tool, reply.argument or "", name=f"tool:{reply.tool}")
        used.append(reply.tool)
        messages += [
            Message(role="assistant", content=f"{reply.tool}({reply.argument})"),
            Message(role="tool", content=result, tool=reply.tool),
        ]
    return AgentResult(
        answer="(no answer within max_turns)", turns=question.max_turns, tools_used=used
    )
