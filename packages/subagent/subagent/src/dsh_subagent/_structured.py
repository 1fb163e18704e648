"""Structured output by a child-scoped ``structured_output`` capture tool (STR-1..3).

The child reports its result by calling ``structured_output`` with arguments that match the
requested schema (validated like any tool input: a mismatch is an ``INVALID_ARGS`` result and
the model may retry in the same turn). A valid call *stages* the value and concludes the
turn; the value is committed only when that exact execution's final ``tools/result``
succeeds. After a commit, later calls in the same response are denied by a guard, which no
listener can re-allow. A turn that ends without a capture is an ``error``: no re-prompt.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dsh_core import (
    Context,
    JsonValue,
    PromptSection,
    TextBlock,
    ToolDefinition,
    ToolExecutionInput,
    ToolExecutionResult,
    ToolOutput,
    ToolRunContext,
)

__all__ = ["STRUCTURED_OUTPUT_TOOL", "StructuredCapture"]

STRUCTURED_OUTPUT_TOOL = "structured_output"
_SECTION = f"tool:{STRUCTURED_OUTPUT_TOOL}"
_GUIDANCE = (
    "When the task is done, call the structured_output tool exactly once. Its arguments are "
    "your final result and must match its schema. That call ends your turn; do not also "
    "answer in text."
)
_RECORDED = (TextBlock(text="Structured output recorded."),)
_MISSING: Any = object()


class StructuredCapture:
    """The capture state of one child (one schema, at most one committed value)."""

    __slots__ = ("_removers", "_staged", "captured", "schema", "value")

    def __init__(self, schema: JsonValue) -> None:
        self.schema = schema
        self._staged: dict[int, tuple[ToolExecutionInput, JsonValue]] = {}
        self._removers: list[Callable[[], object]] = []
        self.captured = False
        self.value: JsonValue = None

    def install(self, ctx: Context) -> list[Callable[[], object]]:
        """Register the tool, its guidance section, the guard and the commit listener on the
        child's own scope; returns their removers (:meth:`remove` calls them too)."""
        self._removers = removers = [
            ctx.tools.register(
                ToolDefinition(
                    name=STRUCTURED_OUTPUT_TOOL,
                    description=(
                        "Record your final structured result. Call exactly once, when done; "
                        "the call ends your turn."
                    ),
                    parameters=self.schema,
                    execute=self._execute,
                    output=ToolOutput(
                        schema={
                            "type": "object",
                            "properties": {"recorded": {"const": True}},
                            "required": ["recorded"],
                        },
                        render=lambda value, run: _RECORDED,
                    ),
                )
            ),
            ctx.system_prompt.section(PromptSection(name=_SECTION, order=190, text=_GUIDANCE)),
            ctx.tools.guard(self._guard),
            ctx.on("tools/result", self._on_result),
        ]
        return list(removers)

    def remove(self) -> None:
        """Unregister everything :meth:`install` added (idempotent): the run settled, so its
        capture is over (DRV-9, STR-1). The captured value stays."""
        removers, self._removers = self._removers, []
        for remover in removers:
            remover()
        self._staged.clear()

    async def _execute(self, arguments: JsonValue, run: ToolRunContext) -> dict[str, bool]:
        if run.call is not None:
            self._staged[id(run.call)] = (run.call, arguments)
        run.conclude_turn()
        return {"recorded": True}

    def _guard(self, call: ToolExecutionInput) -> str | None:
        if self.captured:
            return "structured output was already recorded; this call was not executed"
        return None

    def _on_result(self, call: ToolExecutionInput, result: ToolExecutionResult) -> None:
        staged = self._staged.pop(id(call), None)
        if staged is None or staged[0] is not call:
            return
        if result.ok and not self.captured:
            self.captured = True
            self.value = staged[1]
