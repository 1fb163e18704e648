"""The child-scoped ``report`` tool and its ``tool:report`` section (contract §6, RPT-1..6).

:func:`report_setup` is the continuable setup contribution the plugin registers: every fresh or
resumed continuable child gets its own ``report`` tool and ``tool:report`` section in its scope
(never the parent's, a sibling's or the global layer), installed after the child's tool filter,
which only hides inherited tools. Calling the tool is ``report_from(agent, [text output])``:
the report goes exactly one edge up, and never ends the child's turn.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from dsh_core import (
    AbortedError,
    ContentBlock,
    Context,
    PromptSection,
    SessionError,
    TextBlock,
    ToolDefinition,
    ToolError,
    ToolOutput,
    ToolRunContext,
    invalid_arguments_text,
)
from dsh_subagent import SubagentError, SubagentReportOptions, SubagentService

from ._config import ReportDelivery, as_delivery

__all__ = [
    "REPORT_DESCRIPTION",
    "REPORT_PARAMETERS",
    "REPORT_SECTION",
    "REPORT_SECTION_ORDER",
    "REPORT_SECTION_TEXT",
    "REPORT_TOOL",
    "ReportSetupError",
    "report_setup",
]

REPORT_TOOL = "report"
REPORT_SECTION = "tool:report"
#: RPT-2: after the delegation tool's guidance (116.5).
REPORT_SECTION_ORDER = 117

REPORT_DESCRIPTION = (
    "Report to the agent that started you. Call it once before you finish, with a "
    "self-contained answer: what you found or did, with the details that agent needs, since it "
    "has not seen your work. Reporting does not end your turn; keep working afterwards if "
    "anything is left to do."
)

REPORT_SECTION_TEXT = (
    "You are a subagent started by another agent. Before you finish, you must call report "
    "once with a self-contained answer: everything the agent that started you needs, without "
    "relying on anything else you said. Reporting never ends your turn: after it you may keep "
    "working, and you end by giving your final reply as usual."
)

REPORT_PARAMETERS: Mapping[str, Any] = {
    "type": "object",
    "properties": {
        "output": {
            "type": "string",
            "description": "Your report: a self-contained answer for the agent that started you.",
        }
    },
    "required": ["output"],
    "additionalProperties": False,
}

_OUTPUT_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "properties": {"messageId": {"type": "string"}},
    "required": ["messageId"],
}

#: What the model is told to do after each refusal of the seam (its message comes first).
_ADVICE = {
    "PARENT_UNAVAILABLE": "The agent that started you is gone; finish without reporting.",
    "DRAINING": "Your work is being stopped; finish without reporting.",
    "ACTIVATION_CLOSING": "You are being stopped; finish without reporting.",
    "UNAUTHORIZED": "Only a running continuable subagent can report; put your answer in your "
    "reply instead.",
    "SESSION_IO": "The report was not accepted: the session store could not write it.",
}


class ReportSetupError(SubagentError):
    """Installing or releasing one child's ``report`` failed (RPT-2): ``REPORT_SETUP_FAILED``
    (the tool's registration and then the section's rollback) or ``REPORT_RELEASE_FAILED``
    (one or both revocations); its ``__cause__`` is an ``ExceptionGroup`` of every failure."""

    code = "REPORT_SETUP_FAILED"


def _render(value: Any, run: ToolRunContext) -> tuple[ContentBlock, ...]:
    return (
        TextBlock(
            text=f"report accepted by the agent that started you as message {value['messageId']}"
        ),
    )


def _refused(message: str, code: str) -> ToolError:
    advice = _ADVICE.get(code)
    return ToolError(f"{message}. {advice}" if advice else message, code=code)


def _definition(subagents: SubagentService, delivery: ReportDelivery) -> ToolDefinition:
    async def execute(arguments: Any, run: ToolRunContext) -> dict[str, str]:
        agent = run.agent
        if agent is None:
            raise _refused(
                "report needs a calling agent; the report was not delivered", "UNAUTHORIZED"
            )
        output = arguments.get("output") if isinstance(arguments, Mapping) else None
        if not isinstance(output, str):  # validated by the schema already: a direct call
            raise ToolError(
                invalid_arguments_text("report", '"output" must be a string'),
                code="INVALID_ARGS",
            )
        options = SubagentReportOptions(delivery=delivery, signal=run.signal)
        try:
            message_id = await subagents.report_from(agent, (TextBlock(text=output),), options)
        except AbortedError:
            raise ToolError(
                "the report was cancelled; it was not delivered", code="ABORTED"
            ) from None
        except (SubagentError, SessionError) as exc:  # SESSION_IO: not written (DUR-32)
            raise _refused(str(exc), exc.code) from exc
        return {"messageId": message_id}

    return ToolDefinition(
        name=REPORT_TOOL,
        description=REPORT_DESCRIPTION,
        parameters=REPORT_PARAMETERS,
        execute=execute,
        output=ToolOutput(schema=_OUTPUT_SCHEMA, render=_render),
    )


def _aggregate(message: str, code: str, failures: list[Exception]) -> ReportSetupError:
    """One error with a stable code, caused by a group of every failure."""
    error = ReportSetupError(message, code=code)
    error.__cause__ = ExceptionGroup(message, failures)
    return error


def report_setup(
    subagents: SubagentService, delivery: str
) -> Callable[[Context], Callable[[], None]]:
    """The continuable setup: install ``tool:report`` then ``report`` into one child scope;
    ``delivery`` is ``quiet``, ``wakeup`` or ``next-step`` (``ValueError`` otherwise).

    If registering the tool fails (a name already taken in that scope), the section is removed
    again and the registration's error surfaces; if that removal fails too, both are raised
    together (``REPORT_SETUP_FAILED``). The returned disposer attempts both revocations, and
    aggregates what failed (``REPORT_RELEASE_FAILED``).
    """
    definition = _definition(subagents, as_delivery(delivery))
    section = PromptSection(
        name=REPORT_SECTION, order=REPORT_SECTION_ORDER, text=REPORT_SECTION_TEXT
    )

    def setup(child_ctx: Context) -> Callable[[], None]:
        remove_section = child_ctx.system_prompt.section(section)
        try:
            remove_tool = child_ctx.tools.register(definition)
        except Exception as exc:
            try:
                remove_section()
            except Exception as rollback:
                error = _aggregate(
                    "registering the report tool failed, and removing its section failed too",
                    "REPORT_SETUP_FAILED",
                    [exc, rollback],
                )
                raise error from error.__cause__
            raise

        def release() -> None:
            failures: list[Exception] = []
            for revoke in (remove_tool, remove_section):
                try:
                    revoke()
                except Exception as exc:  # both are attempted
                    failures.append(exc)
            if failures:
                raise _aggregate(
                    f"failed to revoke {len(failures)} of the report tool's registrations",
                    "REPORT_RELEASE_FAILED",
                    failures,
                )

        return release

    return setup
