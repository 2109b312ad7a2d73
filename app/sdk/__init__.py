"""What handler authors import: ``from app.sdk import workflow, RetryPolicy, Permanent``."""

from app.sdk.context import StepInfo, WorkflowContext, current_step
from app.sdk.errors import NondeterminismError, NonRetryable, Permanent, StepFailed
from app.sdk.retry import RetryPolicy
from app.sdk.workflow import WorkflowDefinition, workflow

__all__ = [
    "NonRetryable",
    "NondeterminismError",
    "Permanent",
    "RetryPolicy",
    "StepFailed",
    "StepInfo",
    "WorkflowContext",
    "WorkflowDefinition",
    "current_step",
    "workflow",
]
