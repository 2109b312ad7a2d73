"""Workflows for tests/acceptance/test_event_stream.py (imported by worker subprocesses).

The model step emits tokens, then waits for ``<name>.release`` in ``$TREADLE_TEST_DIR``
so the test can kill its worker mid-step; the next attempt emits its tokens again.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from pydantic import BaseModel

from app.sdk import RetryPolicy, WorkflowContext, current_step, workflow


class Chat(BaseModel):
    """Input: a name for the coordination files and how many tokens to emit."""

    name: str
    tokens: int = 5


def _dir() -> Path:
    return Path(os.environ["TREADLE_TEST_DIR"])


async def model(chat: Chat, ctx: WorkflowContext) -> str:
    """Emit ``chat.tokens`` tokens, mark the attempt started, wait for the release."""
    attempt = current_step().attempt
    words = [f"w{i}" for i in range(chat.tokens)]
    for word in words:
        ctx.emit("token", {"text": word})
    (_dir() / f"{chat.name}.started.{attempt}.{os.getpid()}").touch()
    while not (_dir() / f"{chat.name}.release").exists():
        await asyncio.sleep(0.02)
    return " ".join(words)


@workflow("acc-stream")
async def stream_flow(ctx: WorkflowContext, chat: Chat) -> str:
    """Emit a stage, run the model step, emit the answer's length."""
    ctx.emit("stage", "thinking")
    answer = await ctx.step(model, chat, ctx, retry=RetryPolicy(max_attempts=1))
    ctx.emit("stage", {"done": len(answer)})
    return answer
