"""What handler authors import: ``from app.sdk import workflow, flow, join, RetryPolicy``."""

from app.sdk.context import ApprovalDecision, StepInfo, WorkflowContext, current_step
from app.sdk.dag import DagDefinitionError, Flow, flow, join
from app.sdk.errors import (
    ApprovalRejected,
    EmitRefused,
    NondeterminismError,
    NonRetryable,
    Permanent,
    StepFailed,
    WaitTimedOut,
)
from app.sdk.events import ReceivedEvent
from app.sdk.logger import RunLogger
from app.sdk.queue import QueueControls, RateLimit
from app.sdk.retry import RetryPolicy
from app.sdk.state_machine import (
    StateMachine,
    StateMachineDefinitionError,
    StateMachineWorkflow,
    current_session,
    state_machine,
)
from app.sdk.workflow import WorkflowDefinition, workflow

__all__ = [
    "ApprovalDecision",
    "ApprovalRejected",
    "DagDefinitionError",
    "EmitRefused",
    "Flow",
    "NonRetryable",
    "NondeterminismError",
    "Permanent",
    "QueueControls",
    "RateLimit",
    "ReceivedEvent",
    "RetryPolicy",
    "RunLogger",
    "StateMachine",
    "StateMachineDefinitionError",
    "StateMachineWorkflow",
    "StepFailed",
    "StepInfo",
    "WaitTimedOut",
    "WorkflowContext",
    "WorkflowDefinition",
    "current_session",
    "current_step",
    "flow",
    "join",
    "state_machine",
    "workflow",
]
