"""The chaos harness's workflow (loaded by its worker processes).

One workflow mixes every durable operation; the input chooses which. Its output is a
pure function of the input (see :func:`expected_output`), so the harness can check every
run's outcome whatever was killed while it ran.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

from pydantic import BaseModel, Field

from app.sdk import Permanent, RetryPolicy, WorkflowContext, current_step, workflow

KINDS = ("retry", "parallel", "sleep", "approval", "signal", "fail")


class Chaos(BaseModel):
    """Input: which mix to run, and a number that varies the work."""

    kind: str = Field(pattern="^(retry|parallel|sleep|approval|signal|fail)$")
    n: int = Field(ge=0)


def _busy_seconds(n: int, salt: str) -> float:
    # 20..220 ms: long enough that random kills land mid-step.
    digest = hashlib.blake2b(f"{n}:{salt}".encode(), digest_size=2).digest()
    return 0.02 + int.from_bytes(digest, "big") % 200 / 1000


async def work(n: int, label: str) -> str:
    """A step: some time passes, then a deterministic result."""
    await asyncio.sleep(_busy_seconds(n, label))
    return f"{label}-{n}"


async def flaky(n: int) -> int:
    """Fails on attempts 1 and 2 (a transient error), succeeds on attempt 3."""
    await asyncio.sleep(_busy_seconds(n, "flaky"))
    if current_step().attempt < 3:
        raise ConnectionError("transient")
    return n * 3


def refuse(n: int) -> None:
    """Fails for good."""
    raise Permanent(ValueError(f"order {n} refused"))


@workflow("chaos-mix")
async def chaos_mix(ctx: WorkflowContext, job: Chaos) -> Any:
    """Start with a step, then the kind's durable operation, then a final step."""
    first = await ctx.step(work, job.n, "first")
    middle: Any
    if job.kind == "retry":
        policy = RetryPolicy(max_attempts=5, backoff="fixed", delay=0.05)
        middle = await ctx.step(flaky, job.n, retry=policy)
    elif job.kind == "parallel":
        middle = list(
            await asyncio.gather(
                *(ctx.step(work, job.n, f"branch{i}", name=f"branch{i}") for i in range(3))
            )
        )
    elif job.kind == "sleep":
        await ctx.sleep(0.2 + job.n % 5 / 10)
        middle = "slept"
    elif job.kind == "approval":
        decision = await ctx.approval("ok", payload={"n": job.n}, timeout=3600)
        middle = decision.approved
    elif job.kind == "signal":
        middle = await ctx.signal("go", timeout=3600)
    else:
        await ctx.step(refuse, job.n, retry=RetryPolicy(max_attempts=1))
        middle = None
    last = await ctx.step(work, job.n, "last")
    return {"first": first, "middle": middle, "last": last}


def expected_output(kind: str, n: int) -> tuple[str, Any]:
    """The (status, output) every run of this input must end with."""
    if kind == "fail":
        return "failed", None
    middle: Any = {
        "retry": n * 3,
        "parallel": [f"branch{i}-{n}" for i in range(3)],
        "sleep": "slept",
        "approval": True,
        "signal": {"n": n},
    }[kind]
    return "completed", {"first": f"first-{n}", "middle": middle, "last": f"last-{n}"}
