"""The ``subagent`` tool: one plugin row binds one provider to one tool name (contract §4).

The tool exists only while its provider is registered (TOOL-1): it is registered when the
provider is there at mount or arrives later (``subagent/provider-added``), removed on
``subagent/provider-removed``, and its wording is derived again each time from the provider's
``inherits_parent_context`` (TOOL-2/3). A call is one of three routes: foreground (start, wait,
always dispose; TOOL-7), a one-shot background job in ``ctx.jobs`` (TOOL-8), or a continuable
child through ``start_continuable`` (TOOL-9). Every call form is concurrency-safe (TOOL-10).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import attrs

from dsh_core import (
    Agent,
    AgentOptions,
    ContentBlock,
    Context,
    DshError,
    PromptContext,
    PromptSection,
    TextBlock,
    ToolDefinition,
    ToolError,
    ToolOutput,
    ToolRestriction,
    ToolRunContext,
    blocks_text,
    invalid_arguments_text,
    text_blocks,
    unknown_fields_text,
    unstructure,
)
from dsh_subagent import (
    SUBAGENTS,
    ContinuableStartSpec,
    SubagentError,
    SubagentProvider,
    SubagentResult,
    SubagentStartRequest,
    delegation_depth_of,
    settle_run,
)

from ._config import PROVIDER_MANAGED, SubagentToolConfig, check_max_depth

__all__ = [
    "DEPTH_CONTEXT_ORDER",
    "HEADLINES",
    "NO_AGENT",
    "NO_JOBS",
    "OUTPUT_SCHEMA",
    "SECTION_ORDER",
    "SubagentTool",
    "depth_statement",
    "description_for",
    "guidance_for",
    "install_subagent_tool",
    "render_output",
]

NO_AGENT = "subagent tool requires a calling agent (exec.agent was undefined)"
NO_JOBS = "background jobs unavailable: load dsh-core's jobs plugin"
BACKGROUND_DISABLED = (
    "run_in_background is disabled for this tool instance (enable_run_in_background: false)"
)
#: A provider cancelled a start itself (not the caller's task being cancelled).
START_CANCELLED = "subagent start was cancelled; no subagent was started"
#: TOOL-7: the headline of a foreground run that did not complete, by stop reason.
HEADLINES = {
    "aborted": "subagent run was cancelled",
    "error": "subagent run failed",
    "max-tokens": "subagent run hit its token limit before finishing",
    "max-steps": "subagent run hit its step limit before finishing",
    "refusal": "subagent declined the task",
}
#: TOOL-11: where the ``tool:<name>`` guidance section sits.
SECTION_ORDER = 116.5
#: Where a child's delegation-depth statement sits among the runtime-context statements (after
#: the seam's ``subagent:delegation`` at 120).
DEPTH_CONTEXT_ORDER = 121

#: Every field a call may carry (``run_in_background`` also when background is disabled:
#: a forced ``true`` is refused by TOOL-4's own text).
_FIELDS = frozenset({"description", "prompt", "run_in_background"})

_SEES_NOTHING = (
    "The subagent does not see this conversation: write a self-contained prompt that gives it "
    "everything it needs to know."
)
_SEES_COMPLETED = (
    "The subagent sees the completed turns of this conversation, but not the turn in "
    "progress: put anything from this turn that it needs into the prompt."
)


def description_for(config: SubagentToolConfig, inherits_parent_context: bool) -> str:
    """TOOL-2/3: the tool's description for a provider that does or does not share context."""
    head = "Delegate a task to a subagent, which works on it on its own and answers. "
    sees = _SEES_COMPLETED if inherits_parent_context else _SEES_NOTHING
    if not config.enable_run_in_background:
        tail = "The call waits for the subagent and returns its result."
    elif config.continuable:
        tail = (
            "The subagent runs in the background by default: the call returns a durable "
            "subagent id at once, and when the subagent settles the runtime sends you a notice "
            "with its outcome and any final message. Use send_message with that id to continue "
            "the subagent's work. Pass run_in_background: false to wait for the result instead."
        )
    else:
        tail = (
            "By default the call waits for the subagent and returns its result. With "
            "run_in_background: true it returns a job id at once: collect the result with "
            "job_output and stop the job with job_kill."
        )
    return f"{head}{sees} {tail}"


def _parameters(config: SubagentToolConfig) -> dict[str, Any]:
    properties: dict[str, Any] = {
        "description": {
            "type": "string",
            "description": "A short display label for the task, 3 to 5 words.",
        },
        "prompt": {"type": "string", "description": "The task for the subagent."},
    }
    if config.enable_run_in_background:
        properties["run_in_background"] = {
            "type": "boolean",
            "description": (
                "Run the subagent in the background and return its id at once; the runtime "
                "sends you a notice when it settles. Defaults to true."
                if config.continuable
                else "Run the subagent as a background job and return its job id at once. "
                "Defaults to false."
            ),
        }
    return {"type": "object", "properties": properties, "required": ["description", "prompt"]}


def guidance_for(tool_name: str) -> str:
    """TOOL-11: the ``tool:<name>`` section's text in continuable mode."""
    return (
        f"Use {tool_name} in the background by default. Start independent delegations "
        "together, in one response, so that they run at the same time. Wait for a result "
        "(run_in_background: false) only when your next action depends on it. When a "
        "background subagent settles, the runtime sends you a notice containing its outcome "
        "and any closing message: there is no need to poll."
    )


def depth_statement(tool_name: str, depth: int, max_depth: int) -> str:
    """ROB-84: what a child at ``depth`` reads about calling ``tool_name`` under ``max_depth``
    (the released reference's wording; at the limit it is told to do the work itself)."""
    remaining = max(max_depth - depth, 0)
    text = (
        f"Delegation depth for `{tool_name}`: current {depth}, maximum {max_depth}, remaining "
        f"levels {remaining}."
    )
    if remaining == 0:
        text += f" Do not call `{tool_name}` at this depth; carry out the work directly."
    return text


#: TOOL-7/8/9: the tool's value, one of three shapes (hosts and UIs read it from
#: ``tools/result``; the model reads what :func:`render_output` makes of it).
OUTPUT_SCHEMA: dict[str, Any] = {
    "oneOf": [
        {
            "type": "object",
            "properties": {
                "kind": {"const": "foreground"},
                "runId": {"type": "string"},
                "output": {"type": "array", "items": {"type": "object"}},
            },
            "required": ["kind", "runId", "output"],
            "additionalProperties": False,
        },
        {
            "type": "object",
            "properties": {"kind": {"const": "background"}, "jobId": {"type": "string"}},
            "required": ["kind", "jobId"],
            "additionalProperties": False,
        },
        {
            "type": "object",
            "properties": {"kind": {"const": "continuable"}, "subagentId": {"type": "string"}},
            "required": ["kind", "subagentId"],
            "additionalProperties": False,
        },
    ]
}


def render_output(value: Any, run: ToolRunContext) -> tuple[ContentBlock, ...]:
    """What the model reads of the tool's value (TOOL-7/8/9): a foreground run's text blocks
    concatenated, ``started background subagent job <id>``, or ``started subagent <id>``."""
    kind = value["kind"]
    if kind == "foreground":
        return text_blocks("".join(b["text"] for b in value["output"] if b.get("type") == "text"))
    if kind == "background":
        return text_blocks(f"started background subagent job {value['jobId']}")
    return text_blocks(f"started subagent {value['subagentId']}")


_T = TypeVar("_T")


async def _started(start: Awaitable[_T]) -> _T:
    """``start`` (a provider's start or preparation), awaited: the provider's own
    cancellation of it is an errored result (``CANCELLED``), not the end of the parent's
    turn; the cancellation of this task itself propagates."""
    try:
        return await start
    except asyncio.CancelledError:
        if _cancelled_here():
            raise
        raise ToolError(START_CANCELLED, code="CANCELLED") from None


def _cancelled_here() -> bool:
    """Whether the running task is being cancelled: a ``CancelledError`` that is ours to
    propagate, rather than a provider's own cancellation (of its start, or of the result
    future it settled by cancelling), which must not end the parent's turn."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _output_data(output: tuple[ContentBlock, ...]) -> list[Any]:
    """``unstructure(output)``; an answer of text blocks (the usual one) built directly, the
    same dicts without the converter's dispatch per block."""
    for block in output:
        if block.__class__ is not TextBlock:
            return unstructure(output)  # type: ignore[no-any-return]
    return [{"text": block.text, "type": "text"} for block in output]  # type: ignore[attr-defined]


def _foreground_failure(result: SubagentResult) -> str:
    """TOOL-7: headline, then ``\\nDiagnostic: <d>``, then the partial output when any."""
    reason = result.stop_reason
    text = HEADLINES.get(reason) or f"subagent run ended abnormally ({reason})"
    if result.diagnostic:
        text += f"\nDiagnostic: {result.diagnostic}"
    partial = blocks_text(result.output)
    if partial:
        text += f"\nPartial output before the run ended:\n{partial}"
    return text


class SubagentTool:
    """One mounted row: its config, its provider's lifecycle, and the call routes."""

    def __init__(self, ctx: Context, config: SubagentToolConfig) -> None:
        self.ctx = ctx
        self.config = config
        self.provider = config.provider
        depth = config.max_depth
        self.max_depth: int | None = None if depth == PROVIDER_MANAGED else int(depth)
        self.agent_options: AgentOptions | None = (
            config.agent_options.to_options() if config.agent_options is not None else None
        )
        self.tool_filter: ToolRestriction | None = (
            config.tool_filter.to_restriction() if config.tool_filter is not None else None
        )
        self.persona = config.persona
        self.background_default = config.enable_run_in_background and config.continuable
        self._removers: list[Callable[[], object]] = []
        self._definition: ToolDefinition | None = None
        #: The empty section shadowing the guidance where the tool is hidden, and by agent id
        #: the shadows registered (each also goes with its agent).
        self._section: PromptSection | None = None
        self._shadows: dict[str, Callable[[], object]] = {}
        #: By agent id, the depth statements registered in children's scopes (ROB-84).
        self._depths: dict[str, Callable[[], object]] = {}

    # -- lifecycle (TOOL-1, TOOL-5) ---------------------------------------------------------------

    def check(self, provider: SubagentProvider) -> None:
        """TOOL-5: refuse a provider this row cannot drive (fails the mount, or vetoes the
        provider's registration when it arrives later)."""
        name = self.provider
        if self.max_depth is not None and not provider.capabilities.depth_limit:
            raise SubagentError(
                f'subagent tool "{self.config.tool_name}": provider "{name}" cannot enforce '
                "max_depth (no depth_limit capability) — set max_depth: 'provider-managed' to "
                "let the provider manage depth",
                code="UNSUPPORTED_CAPABILITY",
            )
        if self.config.continuable and not callable(getattr(provider, "prepare_continuable", None)):
            raise SubagentError(
                f'provider "{name}" does not support `background_mode: continuable`',
                code="UNSUPPORTED_CAPABILITY",
            )

    def mount(self, provider: SubagentProvider) -> None:
        """Register the tool (and its guidance section) worded for ``provider``."""
        self.check(provider)
        self.unmount()
        config = self.config
        definition = ToolDefinition(
            name=config.tool_name,
            description=description_for(config, bool(provider.inherits_parent_context)),
            parameters=_parameters(config),
            execute=self.execute,
            output=ToolOutput(schema=OUTPUT_SCHEMA, render=render_output),
            concurrency_safe=True,
            starts_jobs=config.enable_run_in_background and not config.continuable,
        )
        self._removers.append(self.ctx.tools.register(definition))
        self._definition = definition
        prompt = self.ctx.get("system_prompt")
        if prompt is not None and self.background_default:
            # A fixed text, so every agent's prompt stays cached; an agent whose scope hides
            # the tool gets an empty section of the same name in its own scope instead.
            section = PromptSection(
                name=f"tool:{config.tool_name}",
                order=SECTION_ORDER,
                text=guidance_for(config.tool_name),
            )
            self._removers.append(prompt.section(section))
            self._section = attrs.evolve(section, text="")
            agents = self.ctx.get("agents")
            for agent in agents.list() if agents is not None else ():
                self.shadow(agent)
        if self.max_depth is not None:
            agents = self.ctx.get("agents")
            for agent in agents.list() if agents is not None else ():
                self.state_depth(agent)

    def unmount(self) -> None:
        """Remove the tool and its section (nothing when absent)."""
        removers, self._removers = self._removers, []
        shadows, self._shadows = self._shadows, {}
        depths, self._depths = self._depths, {}
        self._definition = None
        self._section = None
        for remove in (*shadows.values(), *depths.values(), *reversed(removers)):
            remove()

    def state_depth(self, agent: Agent) -> None:
        """ROB-84: tell a child (delegation depth 1 or more) that sees this tool, under a
        numeric ``max_depth``, its current and maximum depth and the levels left, as a
        runtime-context statement in its own scope (a fixed text: every prompt stays cached).

        Listened to only when this row has a depth limit, so a row without one costs nothing
        per agent; contained, never vetoing a creation."""
        max_depth = self.max_depth
        if max_depth is None or self._definition is None or agent.id in self._depths:
            return
        try:
            depth = delegation_depth_of(agent)
            if depth < 1 or agent.ctx.tools.get(self.config.tool_name) is not self._definition:
                return
            name = self.config.tool_name
            statement = PromptContext(
                name=f"{name}:depth",
                order=DEPTH_CONTEXT_ORDER,
                text=depth_statement(name, depth, max_depth),
            )
            self._depths[agent.id] = agent.ctx.system_prompt.context(statement)
        except (DshError, TypeError, ValueError):  # torn down, a clash, or an invalid depth
            return

    def shadow(self, agent: Agent) -> None:
        """TOOL-11: an empty ``tool:<name>`` section in the scope of ``agent`` when the tool
        is hidden there (a restriction), so the guidance never names a tool it cannot call.

        Checked when the tool is mounted and when an agent is published (restrictions are
        put in place inside the creation window, DEP-5); contained, never vetoing a creation.
        """
        section = self._section
        if section is None or agent.id in self._shadows:
            return
        try:
            if agent.ctx.tools.get(self.config.tool_name) is self._definition:
                return
            self._shadows[agent.id] = agent.ctx.system_prompt.section(section)
        except DshError:  # an agent already torn down, or a section of its own by that name
            return

    def on_agent_disposed(self, agent: Agent) -> None:
        self._shadows.pop(agent.id, None)
        self._depths.pop(agent.id, None)

    def on_provider_added(self, provider: SubagentProvider) -> None:
        if provider.name == self.provider:
            self.mount(provider)

    def on_provider_removed(self, name: str) -> None:
        if name == self.provider:
            self.unmount()

    # -- calls (TOOL-4, TOOL-6..9) ----------------------------------------------------------------

    async def execute(self, args: Any, run: ToolRunContext) -> dict[str, Any]:
        """One call: resolve the route, then run it; its value is one of the three shapes of
        :data:`OUTPUT_SCHEMA`. Failures raise (an errored result)."""
        parent = run.agent
        if parent is None:
            raise ToolError(NO_AGENT, code="NO_AGENT")
        unknown = [key for key in args if key not in _FIELDS]
        if unknown:
            raise ToolError(self._unknown_fields(unknown), code="INVALID_ARGS")
        forced = args.get("run_in_background")
        if forced is True and not self.config.enable_run_in_background:
            raise ToolError(BACKGROUND_DISABLED, code="BACKGROUND_DISABLED")
        background = self.background_default if forced is None else forced is True
        prompt = (TextBlock(text=args["prompt"]),)
        label: str = args["description"]
        if background and self.config.continuable:
            spec = ContinuableStartSpec(
                provider=self.provider,
                label=label,
                prompt=prompt,
                parent=parent,
                signal=run.signal,
                agent_options=self.agent_options,
                max_depth=self.max_depth,
                tool_filter=self.tool_filter,
                persona=self.persona,
            )
            started = await _started(run.ctx[SUBAGENTS].start_continuable(spec))
            return {"kind": "continuable", "subagentId": started.child_id}
        if background:
            return self._start_job(run, parent, label, prompt)
        return await self._foreground(run, parent, label, prompt)

    def _unknown_fields(self, unknown: list[str]) -> str:
        """Extra fields are bad input, not ignored: a model passing a subagent type or a
        model would otherwise believe it chose one (the schema stays open, so that
        ``run_in_background`` reaches TOOL-4's own refusal when background is disabled). The
        words are the schema check's own for an unknown property (ROB-90)."""
        takes = (
            ("description", "prompt", "run_in_background")
            if self.config.enable_run_in_background
            else ("description", "prompt")
        )
        return invalid_arguments_text(self.config.tool_name, unknown_fields_text(unknown, takes))

    def _request(
        self, parent: Any, label: str, prompt: tuple[TextBlock, ...], signal: Any
    ) -> SubagentStartRequest:
        """TOOL-6: ``{label, prompt, parent, signal, agent_options?, persona?, tool_filter?,
        max_depth?}``."""
        return SubagentStartRequest(
            label=label,
            prompt=prompt,
            parent=parent,
            signal=signal,
            agent_options=self.agent_options,
            max_depth=self.max_depth,
            tool_filter=self.tool_filter,
            persona=self.persona,
        )

    async def _foreground(
        self, run: ToolRunContext, parent: Any, label: str, prompt: tuple[TextBlock, ...]
    ) -> dict[str, Any]:
        """TOOL-7: start with the call's signal, await the result, then ALWAYS dispose."""
        request = self._request(parent, label, prompt, run.signal)
        child = await _started(run.ctx[SUBAGENTS].start(self.provider, request))
        failed: str | None = None
        try:
            result = await child.result
        except asyncio.CancelledError:
            if _cancelled_here():
                await asyncio.shield(child.dispose())
                raise
            failed = HEADLINES["aborted"]  # the provider settled the run by cancelling it
        except Exception as exc:
            failed = f"subagent run failed: {str(exc) or type(exc).__name__}"
        else:
            if result.stop_reason != "completed":
                failed = _foreground_failure(result)
        try:
            await child.dispose()
        except Exception as exc:
            what = failed if failed is not None else "subagent run completed"
            raise ToolError(
                f"{what}\nDisposing the subagent run also failed: {str(exc) or type(exc).__name__}",
                code="SUBAGENT_DISPOSE_FAILED",
            ) from exc
        if failed is not None:
            raise ToolError(failed, code="SUBAGENT_RUN_FAILED")
        return {"kind": "foreground", "runId": child.id, "output": _output_data(result.output)}

    def _start_job(
        self, run: ToolRunContext, parent: Any, label: str, prompt: tuple[TextBlock, ...]
    ) -> dict[str, Any]:
        """TOOL-8: a ``subagent`` job of the parent; its producer's own signal owns the child
        (the call's does not). Counts towards the per-owner cap (BUG-7)."""
        jobs = run.ctx.get("jobs")
        if jobs is None:
            raise ToolError(NO_JOBS, code="JOBS_UNAVAILABLE")
        subagents = run.ctx[SUBAGENTS]
        # ROB-67: a full run tree refuses the call now, not later in the job's output (a job
        # admitted meanwhile past the cap still fails there, with the same text).
        subagents.check_tree_capacity(parent)
        provider = self.provider
        request = self._request

        async def producer(signal: Any) -> Any:
            child = await subagents.start(provider, request(parent, label, prompt, signal))
            return await settle_run(child)

        job = jobs.start(kind="subagent", label=label, owner=parent, producer=producer)
        return {"kind": "background", "jobId": job.id}


def install_subagent_tool(ctx: Context, config: SubagentToolConfig) -> SubagentTool | None:
    """Mount one row: follow the provider's lifecycle for as long as ``ctx`` lives.

    Without ``ctx.subagents`` no tool exists (``None``). An invalid ``max_depth`` given here
    directly raises ``TypeError`` (TOOL-5).
    """
    check_max_depth(config.max_depth)
    if ctx.get("subagents") is None:
        return None
    tool = SubagentTool(ctx, config)
    ctx.on("subagent/provider-added", tool.on_provider_added, global_=True)
    ctx.on("subagent/provider-removed", tool.on_provider_removed, global_=True)
    if tool.background_default:
        ctx.on("agent/created", tool.shadow, global_=True)
    if tool.max_depth is not None:
        ctx.on("agent/created", tool.state_depth, global_=True)
    if tool.background_default or tool.max_depth is not None:
        ctx.on("agent/disposed", tool.on_agent_disposed, global_=True)
    provider = ctx[SUBAGENTS].get_provider(config.provider)
    if provider is not None:
        tool.mount(provider)
    return tool
