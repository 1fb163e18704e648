"""The ``subagent`` tool: lifecycle, wording, routes and refusals (contract §4, TOOL-1..11)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import attrs
import pytest

import dsh_subagent.plugin
import dsh_tool_subagent.plugin
from dsh_core import (
    AbortController,
    AbortSignal,
    Agent,
    AgentOptions,
    AssembleContext,
    Context,
    PluginRow,
    ReasoningBlock,
    TextBlock,
    ToolDefinition,
    ToolExecutionInput,
    ToolExecutionResult,
    ToolRestriction,
    ToolRunContext,
    blocks_text,
    text_blocks,
    thaw_json,
)
from dsh_core.testing import (
    ScriptedReply,
    ScriptedRequest,
    ScriptedToolCall,
    TestHost,
    scripted_host,
)
from dsh_subagent import (
    SUBAGENTS,
    ContinuableCreateRequest,
    ContinuableCreateSpec,
    ContinuableStartSpec,
    CoordinatorMessageSource,
    ResolvedSubagentStartRequest,
    SubagentCapabilities,
    SubagentError,
    SubagentFollowupOptions,
    SubagentResult,
    SubagentRun,
    SubagentRunEndInfo,
    SubagentService,
)
from dsh_subagent.in_process import IN_PROCESS_CAPABILITIES, start_in_process_run
from dsh_tool_subagent import (
    NO_AGENT,
    NO_JOBS,
    OUTPUT_SCHEMA,
    SECTION_ORDER,
    SubagentToolConfig,
    install_subagent_tool,
    render_output,
)

MODULES = {"subagent": dsh_subagent.plugin, "tool-subagent": dsh_tool_subagent.plugin}
BOUND = 10  # seconds: the bound on every wait


# -- providers ------------------------------------------------------------------------------------


@attrs.define(eq=False)
class LocalProvider:
    """An in-process provider (the shared driver, like spawn) that records its requests."""

    name: str = "local"
    capabilities: SubagentCapabilities = IN_PROCESS_CAPABILITIES
    inherits_parent_context: bool = False
    requests: list[ResolvedSubagentStartRequest] = attrs.Factory(list)
    prepared: list[ContinuableCreateRequest] = attrs.Factory(list)
    prepare_gate: asyncio.Event | None = None
    changed: asyncio.Event = attrs.Factory(asyncio.Event)

    async def start(self, request: ResolvedSubagentStartRequest) -> SubagentRun:
        self.requests.append(request)
        self.changed.set()
        return await start_in_process_run(request)

    async def prepare_continuable(self, request: ContinuableCreateRequest) -> ContinuableCreateSpec:
        self.prepared.append(request)
        self.changed.set()
        if self.prepare_gate is not None:
            await self.prepare_gate.wait()
        return ContinuableCreateSpec()


@attrs.define(eq=False)
class OneShotProvider:
    """A provider with no ``prepare_continuable`` and configurable capabilities."""

    name: str = "oneshot"
    capabilities: SubagentCapabilities = IN_PROCESS_CAPABILITIES
    inherits_parent_context: bool = True

    async def start(self, request: ResolvedSubagentStartRequest) -> SubagentRun:
        return await start_in_process_run(request)


@attrs.define(eq=False)
class FakeProvider:
    """A provider whose run settles with a preset result (or fault); counts disposals."""

    name: str = "fake"
    capabilities: SubagentCapabilities = IN_PROCESS_CAPABILITIES
    inherits_parent_context: bool = False
    result: SubagentResult | BaseException = attrs.Factory(
        lambda: SubagentResult(output=(TextBlock(text="fake answer"),), stop_reason="completed")
    )
    dispose_error: Exception | None = None
    started: int = 0
    disposed: int = 0

    async def start(self, request: ResolvedSubagentStartRequest) -> SubagentRun:
        self.started += 1
        future: asyncio.Future[SubagentResult] = asyncio.get_running_loop().create_future()
        if isinstance(self.result, BaseException):
            future.set_exception(self.result)
        else:
            future.set_result(self.result)

        async def dispose() -> None:
            self.disposed += 1
            if self.dispose_error is not None:
                raise self.dispose_error

        return SubagentRun(
            id=f"fake-{self.started}", local_agent=None, result=future, dispose=dispose
        )


# -- the scripted model ---------------------------------------------------------------------------

Gates = dict[str, Callable[[], Awaitable[object]]]


def make_model(gates: Gates | None = None) -> Callable[[ScriptedRequest], ScriptedReply | str]:
    """``call <json list of args>`` makes the agent call ``subagent`` once per args object;
    ``chain N`` delegates ``chain N-1`` down to 0; ``hold <key>`` waits at gate ``key``;
    any other prompt is answered ``child says: <prompt>``; a tool result is echoed back."""
    gates = gates or {}

    def model(request: ScriptedRequest) -> ScriptedReply | str:
        last = request.messages[-1] if request.messages else None
        if last is not None and last.role == "tool":
            results = []
            for message in reversed(request.messages):
                if message.role != "tool":
                    break
                results.append(blocks_text(message.content[0].content))  # type: ignore[attr-defined]
            return "got: " + " | ".join(reversed(results))
        text = request.last_user_text
        if text.startswith("call "):
            calls = json.loads(text[5:])
            return ScriptedReply(
                tool_calls=tuple(
                    ScriptedToolCall(name=c.pop("tool", "subagent"), arguments=c, id=f"c{i}")
                    for i, c in enumerate(calls)
                )
            )
        if text.startswith("chain "):
            n = int(text.split()[1])
            if n == 0:
                return "bottom"
            args = {"description": f"level {n}", "prompt": f"chain {n - 1}"}
            return ScriptedReply(tool_calls=(ScriptedToolCall(name="subagent", arguments=args),))
        if text.startswith("hold "):
            gate = gates.get(text[5:])
            return ScriptedReply(text="working", wait=gate or asyncio.Event().wait)
        return f"child says: {text}"

    return model


def call_text(*calls: dict[str, Any]) -> str:
    return "call " + json.dumps(list(calls))


def row(**config: Any) -> PluginRow:
    return PluginRow(plugin="tool-subagent", config={"provider": "local", **config})


@attrs.define
class Booted:
    host: TestHost
    parent: Agent
    changed: asyncio.Event = attrs.Factory(asyncio.Event)

    async def until(self, check: Callable[[], bool]) -> None:
        """Wait (bounded) until ``check()`` holds; re-checked when an agent is created or a
        provider added through :meth:`add_provider` is asked for something."""
        async with asyncio.timeout(BOUND):
            while not check():
                self.changed.clear()
                await self.changed.wait()

    @property
    def svc(self) -> SubagentService:
        return self.host.ctx[SUBAGENTS]

    def add_provider(self, provider: Any) -> Context:
        owner = self.host.ctx.plugin(f"provider-{provider.name}")
        owner.subagents.register_provider(provider)
        if isinstance(provider, LocalProvider):
            provider.changed = self.changed
        return owner

    def tool_names(self, agent: Agent | None = None) -> list[str]:
        return [s.name for s in (agent or self.parent).ctx.tools.schemas()]

    def tool_context(self) -> Context:
        (ctx,) = [c for n, c in self.host.runtime.mounted if n == "tool-subagent"]
        return ctx

    async def execute(
        self, arguments: Any, *, name: str = "subagent", signal: AbortSignal | None = None
    ) -> ToolExecutionResult:
        async with asyncio.timeout(BOUND):
            return await self.parent.ctx.tools.execute(
                ToolExecutionInput(
                    call_id="call-1",
                    name=name,
                    arguments=arguments,
                    signal=signal or AbortSignal(),
                    agent=self.parent,
                )
            )

    async def run(self, text: str, agent: Agent | None = None) -> str:
        async with asyncio.timeout(BOUND):
            return await self.host.run(agent or self.parent, text)


@contextlib.asynccontextmanager
async def boot(
    *rows: PluginRow | str,
    provider: Any = None,
    gates: Gates | None = None,
    subagents: bool = True,
) -> AsyncIterator[Booted]:
    """A host with ``subagent`` (unless told not), the rows, and ``provider`` registered
    after them (so the tool always sees the provider arrive)."""
    plugins = ("subagent", *rows) if subagents else rows
    async with scripted_host(*plugins, model=make_model(gates), modules=MODULES) as host:
        parent = (await host.create_agent()).agent
        booted = Booted(host=host, parent=parent)
        host.ctx.on("agent/created", lambda *_: booted.changed.set(), global_=True)
        if provider is not None:
            booted.add_provider(provider)
        yield booted


def text(result: ToolExecutionResult) -> str:
    return blocks_text(result.content)


def args(prompt: str = "do it", **more: Any) -> dict[str, Any]:
    return {"description": "a small task", "prompt": prompt, **more}


# -- TOOL-1: lifecycle ----------------------------------------------------------------------------


async def test_tool_follows_its_provider() -> None:
    """TOOL-1: the tool appears when its provider is registered after the row, goes on
    provider-removed, comes back worded for the returning provider, ignores other providers."""
    async with boot(row()) as b:
        assert "subagent" not in b.tool_names()
        owner = b.add_provider(LocalProvider(inherits_parent_context=False))
        assert "subagent" in b.tool_names()
        first = b.parent.ctx.tools.get("subagent")
        assert first is not None and "does not see this conversation" in first.description
        other = b.add_provider(OneShotProvider())
        await other.dispose()
        assert b.parent.ctx.tools.get("subagent") is first
        await owner.dispose()
        assert "subagent" not in b.tool_names()
        assert (await b.execute(args())).error.code == "UNKNOWN_TOOL"  # type: ignore[union-attr]
        b.add_provider(LocalProvider(inherits_parent_context=True))
        again = b.parent.ctx.tools.get("subagent")
        assert again is not None and "sees the completed turns" in again.description


async def test_provider_present_at_mount_registers_the_tool_at_once() -> None:
    """TOOL-1: no load-order requirement: a provider already registered is used at mount."""
    async with boot() as b:
        b.add_provider(LocalProvider())
        install_subagent_tool(b.host.ctx.plugin("late"), SubagentToolConfig(provider="local"))
        assert "subagent" in b.tool_names()


async def test_disposed_row_removes_the_tool_and_never_registers_it_again() -> None:
    """TOOL-1: disposing the tool plugin removes the tool; a provider returning later does
    not bring it back."""
    async with boot(row()) as b:
        owner = b.add_provider(LocalProvider())
        assert "subagent" in b.tool_names()
        await b.tool_context().dispose()
        assert "subagent" not in b.tool_names()
        await owner.dispose()
        b.add_provider(LocalProvider())
        assert "subagent" not in b.tool_names()


async def test_without_subagents_no_tool_exists() -> None:
    """TOOL-1: a host without ctx.subagents mounts the row and has no tool."""
    async with boot(row(), subagents=False) as b:
        assert "subagent" not in b.tool_names()


async def test_several_rows_with_distinct_names_coexist() -> None:
    """TOOL-1: one row per provider; each tool name starts children of its own provider."""
    local, fake = LocalProvider(), FakeProvider()
    async with boot(row(), row(provider="fake", tool_name="fake_subagent")) as b:
        b.add_provider(local)
        b.add_provider(fake)
        assert {"subagent", "fake_subagent"} <= set(b.tool_names())
        assert text(await b.execute(args("hello"))) == "child says: hello"
        assert text(await b.execute(args(), name="fake_subagent")) == "fake answer"
        assert (len(local.requests), fake.started) == (1, 1)


# -- config ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "message"),
    [
        pytest.param({}, "key 'provider' (str): is required", id="no-provider"),
        pytest.param({"provider": 3}, "key 'provider' (str): expected a string", id="provider"),
        pytest.param(
            {"provider": "local", "enable_run_in_background": "yes"},
            "key 'enable_run_in_background' (bool): expected a boolean",
            id="background-flag",
        ),
        pytest.param(
            {"provider": "local", "background_mode": "later"},
            "key 'background_mode': must be 'one-shot' or 'continuable'",
            id="mode",
        ),
        pytest.param(
            {"provider": "local", "max_depth": -1},
            "key 'max_depth': must be a non-negative safe integer or 'provider-managed'",
            id="negative-depth",
        ),
        pytest.param(
            {"provider": "local", "max_depth": "3"},
            "key 'max_depth': must be a non-negative safe integer or 'provider-managed'",
            id="string-depth",
        ),
        pytest.param(
            {"provider": "local", "tool_filter": {}},
            "key 'tool_filter': needs allow and/or deny",
            id="empty-filter",
        ),
        pytest.param(
            {"provider": "local", "tool_filter": {"allow": "read"}},
            "key 'tool_filter.allow'",
            id="filter-type",
        ),
        pytest.param(
            {"provider": "local", "agent_options": {"max_tokens": 0}},
            "key 'agent_options': max_tokens must be at least 1",
            id="max-tokens",
        ),
        pytest.param(
            {"provider": "local", "agent_options": {"temperature": 1}},
            "key 'agent_options.temperature' is unknown",
            id="unknown-option",
        ),
        pytest.param(
            {"provider": "local", "toolName": "x"}, "key 'toolName' is unknown", id="camel-case"
        ),
    ],
)
async def test_config_errors_name_the_row_and_the_key(config: dict[str, Any], message: str) -> None:
    """TOOL-5, tools 15.1: a bad row fails the boot with PLUGIN_CONFIG naming the row and key;
    a tool_filter with neither key fails at load."""
    with pytest.raises(Exception) as err:
        async with boot(PluginRow(plugin="tool-subagent", config=config)):
            pass
    assert getattr(err.value, "code", None) == "PLUGIN_CONFIG"
    assert "(plugin 'tool-subagent')" in str(err.value) and "plugins[" in str(err.value)
    assert message in str(err.value)


async def test_optional_config_is_never_filled_in() -> None:
    """TOOL-6, §4 config: agent_options and tool_filter pass on only the keys given; absent
    ones stay absent (no {} options, no accidental deny-all); max_depth defaults to 3."""
    provider = LocalProvider()
    async with boot(row(), provider=provider) as b:
        await b.execute(args())
        request = provider.requests[-1]
        assert (request.agent_options, request.tool_filter, request.persona) == (None, None, None)
        assert request.max_depth == 3
    provider = LocalProvider()
    configured = row(
        agent_options={"model": "small"},
        tool_filter={"deny": ["job_output"]},
        persona="You are terse.",
        max_depth=5,
    )
    async with boot(configured, provider=provider) as b:
        await b.execute(args())
        request = provider.requests[-1]
        assert request.agent_options == AgentOptions(model="small")
        assert request.tool_filter == ToolRestriction(deny=("job_output",))
        assert (request.persona, request.max_depth) == ("You are terse.", 5)


# -- TOOL-2/3: wording ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "present", "absent"),
    [
        pytest.param(
            {}, ["job_output", "job_kill", "Defaults to false"], ["send_message"], id="one-shot"
        ),
        pytest.param(
            {"background_mode": "continuable"},
            ["send_message", "runs in the background by default", "Defaults to true"],
            ["job_output"],
            id="continuable",
        ),
        pytest.param(
            {"enable_run_in_background": False},
            ["waits for the subagent and returns its result"],
            ["job_output", "send_message", "run_in_background"],
            id="no-background",
        ),
    ],
)
async def test_description_fragments(
    config: dict[str, Any], present: list[str], absent: list[str]
) -> None:
    """TOOL-2/3: the description and the run_in_background text per mode (pinned fragments);
    the input schema is {description, prompt, run_in_background?} with no provider field."""
    async with boot(row(**config), provider=LocalProvider()) as b:
        definition = b.parent.ctx.tools.get("subagent")
        assert definition is not None
        whole = definition.description + json.dumps(thaw_json(definition.parameters))
        for fragment in present:
            assert fragment in whole
        for fragment in absent:
            assert fragment not in whole
        properties = set(definition.parameters["properties"])  # type: ignore[call-overload]
        expected = {"description", "prompt"}
        if config.get("enable_run_in_background", True):
            expected.add("run_in_background")
        assert properties == expected
        assert list(definition.parameters["required"]) == ["description", "prompt"]  # type: ignore[call-overload]


# -- TOOL-4: background resolution ----------------------------------------------------------------


async def test_forced_background_when_disabled_fails_without_calling_the_provider() -> None:
    """TOOL-4: run_in_background: true with background disabled is an errored result and the
    provider is never called; omitted, the call runs in the foreground."""
    provider = FakeProvider(name="local")
    async with boot(row(enable_run_in_background=False), provider=provider) as b:
        result = await b.execute(args(run_in_background=True))
        assert result.error is not None and result.error.code == "BACKGROUND_DISABLED"
        assert text(result) == (
            "Error: run_in_background is disabled for this tool instance "
            "(enable_run_in_background: false)"
        )
        assert provider.started == 0
        assert text(await b.execute(args())) == "fake answer"
        assert text(await b.execute(args(run_in_background=False))) == "fake answer"


@pytest.mark.parametrize(
    ("config", "fields"),
    [
        ({}, '"description", "prompt" and "run_in_background"'),
        ({"background_mode": "continuable"}, '"description", "prompt" and "run_in_background"'),
        ({"enable_run_in_background": False}, '"description" and "prompt"'),
    ],
)
async def test_an_unknown_field_is_an_errored_result_and_starts_nothing(
    config: dict[str, Any], fields: str
) -> None:
    """Input schema ("there is no provider or type parameter"), tools 15 (extra fields are
    bad input): a field the tool does not take, such as a subagent type, is INVALID_ARGS
    naming it and the fields there are, in the schema check's words (ROB-90); the provider is
    never called."""
    provider = LocalProvider()
    async with boot(row(**config), provider=provider) as b:
        result = await b.execute(args(subagent_type="Explore", model="big"))
        assert result.error is not None and result.error.code == "INVALID_ARGS"
        assert text(result) == (
            'Error: invalid arguments for subagent: unknown properties "subagent_type" and '
            f'"model"; the allowed properties are {fields}. Call subagent again with arguments '
            "that match its parameters."
        )
        assert provider.requests == [] and provider.prepared == []
        assert len(b.host.ctx.agents.list()) == 1


async def test_omitted_background_defaults_per_mode() -> None:
    """TOOL-4: omitted, run_in_background is false in one-shot mode and true in continuable."""
    async with boot(row(), provider=LocalProvider()) as b:
        assert text(await b.execute(args("x"))) == "child says: x"
    async with boot(row(background_mode="continuable"), provider=LocalProvider()) as b:
        assert text(await b.execute(args("x"))).startswith("started subagent ")


# -- TOOL-5: mount-time refusals ------------------------------------------------------------------


async def test_numeric_max_depth_needs_the_depth_limit_capability() -> None:
    """TOOL-5: a numeric max_depth with a provider lacking depth_limit fails the mount (or the
    provider's later registration); 'provider-managed' sends no cap."""
    no_depth = OneShotProvider(capabilities=SubagentCapabilities())
    async with boot() as b:
        b.add_provider(no_depth)
        with pytest.raises(SubagentError) as err:
            install_subagent_tool(b.host.ctx.plugin("t"), SubagentToolConfig(provider="oneshot"))
        assert err.value.code == "UNSUPPORTED_CAPABILITY"
        assert "cannot enforce max_depth (no depth_limit capability)" in str(err.value)
        assert "set max_depth: 'provider-managed'" in str(err.value)
    async with boot(row(provider="oneshot")) as b:
        with pytest.raises(SubagentError):
            b.add_provider(OneShotProvider(capabilities=SubagentCapabilities()))
        assert b.svc.list() == []
    recording = LocalProvider(capabilities=SubagentCapabilities())
    async with boot(row(max_depth="provider-managed"), provider=recording) as b:
        assert text(await b.execute(args("y"))) == "child says: y"
        assert recording.requests[-1].max_depth is None


async def test_continuable_mode_needs_prepare_continuable() -> None:
    """TOOL-5: continuable mode with a provider lacking prepare_continuable is refused."""
    async with boot() as b:
        b.add_provider(OneShotProvider())
        with pytest.raises(SubagentError) as err:
            install_subagent_tool(
                b.host.ctx.plugin("t"),
                SubagentToolConfig(provider="oneshot", background_mode="continuable"),
            )
        assert (
            str(err.value) == 'provider "oneshot" does not support `background_mode: continuable`'
        )


async def test_invalid_max_depth_given_directly_is_a_type_error() -> None:
    """TOOL-5: an invalid max_depth passed to the installer directly raises TypeError."""
    async with boot() as b:
        for bad in (-1, 1.5, True, "deep"):
            config = attrs.evolve(SubagentToolConfig(provider="local"))
            object.__setattr__(config, "max_depth", bad)
            with pytest.raises(TypeError):
                install_subagent_tool(b.host.ctx.plugin("t"), config)


# -- TOOL-6: the request --------------------------------------------------------------------------


async def test_request_carries_label_prompt_and_parent() -> None:
    """TOOL-6: the request is {label: description, prompt: [text], parent: the calling agent}."""
    provider = LocalProvider()
    async with boot(row(), provider=provider) as b:
        await b.execute({"description": "find the bug", "prompt": "look at x"})
        request = provider.requests[-1]
        assert request.label == "find the bug"
        assert request.prompt == (TextBlock(text="look at x"),)
        assert request.parent is b.parent


async def test_no_calling_agent_is_an_errored_result() -> None:
    """TOOL-6: without a calling agent the call fails with the documented text."""
    provider = FakeProvider(name="local")
    async with boot(row(), provider=provider) as b:
        result = await b.host.ctx.tools.execute(
            ToolExecutionInput(call_id="c", name="subagent", arguments=args(), signal=AbortSignal())
        )
        assert result.error is not None and result.error.code == "NO_AGENT"
        assert text(result) == f"Error: {NO_AGENT}"
        assert provider.started == 0


# -- TOOL-7: foreground ---------------------------------------------------------------------------


async def test_foreground_returns_the_text_blocks_and_disposes() -> None:
    """TOOL-7: a completed run's result is its concatenated text blocks; the run is disposed."""
    fake = FakeProvider(
        name="local",
        result=SubagentResult(
            output=(TextBlock(text="one "), TextBlock(text="two")), stop_reason="completed"
        ),
    )
    async with boot(row(), provider=fake) as b:
        result = await b.execute(args())
        assert result.ok and text(result) == "one two"
        assert fake.disposed == 1


@pytest.mark.parametrize(
    ("reason", "diagnostic", "partial", "expected"),
    [
        ("aborted", None, "", "subagent run was cancelled"),
        ("error", "model 500", "", "subagent run failed\nDiagnostic: model 500"),
        (
            "max-tokens",
            None,
            "half",
            "subagent run hit its token limit before finishing\n"
            "Partial output before the run ended:\nhalf",
        ),
        (
            "refusal",
            "policy",
            "no",
            "subagent declined the task\nDiagnostic: policy\n"
            "Partial output before the run ended:\nno",
        ),
        ("weird", None, "", "subagent run ended abnormally (weird)"),
    ],
)
async def test_foreground_failure_headlines(
    reason: str, diagnostic: str | None, partial: str, expected: str
) -> None:
    """TOOL-7: a run that did not complete is `Error: <headline>`, then `\\nDiagnostic: `,
    then `\\nPartial output before the run ended:\\n`; the run is still disposed."""
    output = (TextBlock(text=partial),) if partial else ()
    fake = FakeProvider(
        name="local",
        result=SubagentResult(output=output, stop_reason=reason, diagnostic=diagnostic),
    )
    async with boot(row(), provider=fake) as b:
        result = await b.execute(args())
        assert result.error is not None and result.error.code == "SUBAGENT_RUN_FAILED"
        assert text(result) == f"Error: {expected}"
        assert fake.disposed == 1


async def test_result_and_dispose_failures_are_aggregated() -> None:
    """TOOL-7: a faulted result and a failed dispose make one error naming both; a dispose
    failure after a completed result is still an error."""
    both = FakeProvider(
        name="local", result=RuntimeError("transport lost"), dispose_error=OSError("pipe closed")
    )
    async with boot(row(), provider=both) as b:
        result = await b.execute(args())
        assert result.error is not None and result.error.code == "SUBAGENT_DISPOSE_FAILED"
        assert "transport lost" in text(result) and "pipe closed" in text(result)
    after_success = FakeProvider(name="local", dispose_error=OSError("pipe closed"))
    async with boot(row(), provider=after_success) as b:
        result = await b.execute(args())
        assert result.error is not None and result.error.code == "SUBAGENT_DISPOSE_FAILED"
        assert "pipe closed" in text(result)


async def test_pre_aborted_call_fails_before_dispatch() -> None:
    """TOOL-7: a call whose signal is already aborted fails before dispatch."""
    fake = FakeProvider(name="local")
    async with boot(row(), provider=fake) as b:
        controller = AbortController()
        controller.abort("stop")
        result = await b.execute(args(), signal=controller.signal)
        assert text(result) == "Error: tool call aborted before dispatch"
        assert fake.started == 0


async def test_aborting_a_foreground_call_cancels_and_disposes_the_child() -> None:
    """TOOL-7: the call's signal owns a foreground child: aborting it ends the run, which is
    disposed; the result is an errored one."""
    provider = LocalProvider()
    async with boot(row(), provider=provider) as b:
        controller = AbortController()
        task = asyncio.ensure_future(b.execute(args("hold never"), signal=controller.signal))
        await b.until(lambda: bool(provider.requests) and len(b.host.ctx.agents.list()) == 2)
        controller.abort("user stop")
        result = await task
        assert not result.ok
        assert len(b.host.ctx.agents.list()) == 1


# -- TOOL-8: one-shot background jobs -------------------------------------------------------------


async def test_background_job_is_collected_with_job_output() -> None:
    """TOOL-8: run_in_background starts a 'subagent' job of the parent, `started background
    subagent job subagent-1`; job_output gives `<answer>\\n[status: completed]`."""
    async with boot(row(), provider=LocalProvider()) as b:
        assert {"job_output", "job_kill"} <= set(b.tool_names())
        started = await b.execute(args("background work", run_in_background=True))
        assert text(started) == "started background subagent job subagent-1"
        job = b.host.ctx.jobs.get("subagent-1")
        assert (job.kind, job.label, job.owner_id) == ("subagent", "a small task", b.parent.id)
        output = await b.execute({"job_id": "subagent-1", "wait": True}, name="job_output")
        assert text(output) == "child says: background work\n[status: completed]"


async def test_the_call_signal_does_not_own_a_background_child() -> None:
    """TOOL-8: the job's producer owns the child: aborting the tool call's signal after the
    call returned leaves the child running; job_kill stops it (killed)."""
    gate = asyncio.Event()
    async with boot(row(), provider=LocalProvider(), gates={"g": gate.wait}) as b:
        controller = AbortController()
        started = await b.execute(args("hold g", run_in_background=True), signal=controller.signal)
        assert started.ok
        controller.abort("the call is over")
        await b.until(lambda: len(b.host.ctx.agents.list()) == 2)  # the child is published
        job = b.host.ctx.jobs.get("subagent-1")
        assert job.status == "running"
        killed = await b.execute({"job_id": job.id}, name="job_kill")
        assert text(killed) == f"job {job.id} is stopping"
        output = await b.execute({"job_id": job.id, "wait": True}, name="job_output")
        assert "[status: killed" in text(output)


async def test_background_jobs_count_towards_the_per_owner_cap() -> None:
    """TOOL-8, BUG-7: past the per-owner cap the call is an errored result (JOB_LIMIT) and no
    child starts."""
    provider = LocalProvider()
    async with scripted_host(
        "subagent", row(), model=make_model(), modules=MODULES, config={"jobs": {"cap": 1}}
    ) as host:
        parent = (await host.create_agent()).agent
        b = Booted(host=host, parent=parent)
        b.add_provider(provider)
        host.ctx.on("agent/created", lambda *_: b.changed.set(), global_=True)
        assert (await b.execute(args("hold x", run_in_background=True))).ok
        refused = await b.execute(args("hold y", run_in_background=True))
        assert refused.error is not None and refused.error.code == "JOB_LIMIT"
        await b.until(lambda: bool(provider.requests))
        assert list(host.ctx.jobs.jobs) == ["subagent-1"]
        assert [r.prompt for r in provider.requests] == [(TextBlock(text="hold x"),)]
        host.ctx.jobs.kill("subagent-1")


async def test_background_without_jobs_is_an_errored_result() -> None:
    """TOOL-8: without ctx.jobs a background call fails with the documented text."""
    fake = FakeProvider(name="local")
    async with boot(row(), provider=fake) as b:
        b.host.ctx.host.services.pop("jobs")
        result = await b.execute(args(run_in_background=True))
        assert text(result) == f"Error: {NO_JOBS}"
        assert fake.started == 0


async def test_failed_start_settles_the_job_failed() -> None:
    """TOOL-8: a start that is refused after the job began settles it `failed` with the
    error (here the depth cap)."""
    async with boot(row(max_depth=0), provider=LocalProvider()) as b:
        await b.execute(args(run_in_background=True))
        output = await b.execute({"job_id": "subagent-1", "wait": True}, name="job_output")
        assert "[status: failed, SubagentDepthError: subagent depth 1 exceeds maxDepth 0]" in text(
            output
        )


@attrs.define(eq=False)
class StoppedStartProvider:
    """A provider whose start waits until its signal is aborted, records the reason, then
    rejects with ``error``."""

    error: Exception
    name: str = "local"
    capabilities: SubagentCapabilities = IN_PROCESS_CAPABILITIES
    inherits_parent_context: bool = False
    reasons: list[object] = attrs.Factory(list)
    waiting: asyncio.Event = attrs.Factory(asyncio.Event)

    async def start(self, request: ResolvedSubagentStartRequest) -> SubagentRun:
        self.waiting.set()
        await request.signal.wait()
        self.reasons.append(request.signal.reason)
        raise self.error


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (RuntimeError("start gave up"), "(no new output)\n[status: killed]"),
        (
            ExceptionGroup("start failed", [RuntimeError("setup"), RuntimeError("cleanup")]),
            "(no new output)\n[status: failed, ExceptionGroup: start failed (2 sub-exceptions)]",
        ),
    ],
)
async def test_job_kill_stops_a_starting_child_with_the_default_reason(
    error: Exception, status: str
) -> None:
    """TOOL-8: job_kill without a reason aborts the job's producer with "background subagent
    task killed"; a start that then rejects settles the job killed, unless its error is an
    aggregate of several failures (an ExceptionGroup), which settles it failed with the
    error."""
    provider = StoppedStartProvider(error=error)
    async with boot(row(), provider=provider) as b:
        started = await b.execute(args(run_in_background=True))
        assert text(started) == "started background subagent job subagent-1"
        async with asyncio.timeout(BOUND):
            await provider.waiting.wait()
        killed = await b.execute({"job_id": "subagent-1"}, name="job_kill")
        assert text(killed) == "job subagent-1 is stopping"
        output = await b.execute({"job_id": "subagent-1", "wait": True}, name="job_output")
        assert provider.reasons == ["background subagent task killed"]
        assert text(output) == status


async def test_job_tools_only_where_background_jobs_are_possible() -> None:
    """TOOL-8, tools 15.3: job_output/job_kill are visible beside a one-shot background tool,
    not beside a continuable or a foreground-only one."""
    async with boot(row(background_mode="continuable"), provider=LocalProvider()) as b:
        assert "job_output" not in b.tool_names()
    async with boot(row(enable_run_in_background=False), provider=LocalProvider()) as b:
        assert "job_output" not in b.tool_names()


# -- TOOL-9: continuable --------------------------------------------------------------------------


async def test_continuable_call_returns_the_child_id_and_creates_no_job() -> None:
    """TOOL-9: a continuable call returns `started subagent <id>` once the prompt is
    accepted; no job is created; the parent later gets the settlement notice."""
    async with boot(row(background_mode="continuable"), provider=LocalProvider()) as b:
        result = await b.execute(args("continue me"))
        child_id = text(result).removeprefix("started subagent ")
        assert text(result) == f"started subagent {child_id}"
        assert b.host.ctx.jobs.jobs == {}
        entries = await b.svc.list_children(b.parent.id)
        assert [e.id for e in entries] == [child_id]
        assert entries[0].label == "a small task"  # type: ignore[union-attr]


async def test_cancelled_preparation_leaves_nothing_and_a_sibling_succeeds() -> None:
    """TOOL-9: cancelling one of two concurrent continuable starts during preparation leaves no
    agent and no session for it, while the sibling starts independently."""
    gate = asyncio.Event()
    provider = LocalProvider(prepare_gate=gate)
    async with boot(row(background_mode="continuable"), provider=provider) as b:
        cancelled = AbortController()
        first = asyncio.ensure_future(b.execute(args("a"), signal=cancelled.signal))
        second = asyncio.ensure_future(b.execute(args("b")))
        await b.until(lambda: len(provider.prepared) == 2)
        before_agents = len(b.host.ctx.agents.list())
        before_sessions = len(b.host.ctx.sessions.list())
        cancelled.abort("changed my mind")
        gate.set()
        failed, ok = await first, await second
        assert not failed.ok
        assert ok.ok and text(ok).startswith("started subagent ")
        assert len(b.host.ctx.agents.list()) == before_agents + 1
        assert len(b.host.ctx.sessions.list()) == before_sessions + 1
        assert len(await b.svc.list_children(b.parent.id)) == 1


def named_tool(name: str) -> ToolDefinition:
    async def run(arguments: Any, ctx: ToolRunContext) -> str:
        return "done"

    return ToolDefinition(name=name, description=f"The {name} tool.", execute=run)


async def test_continuable_route_carries_the_row_config_through_a_cold_resume(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """TOOL-6, TOOL-9, CONT-10, DEP-2: in continuable mode the row's persona, tool_filter,
    agent_options and max_depth reach the child (persona in its system prompt, the denied
    tool absent, the configured model and max_tokens, its own subagent call refused past
    max_depth), and all but max_tokens again after the child was cold-resumed by a
    follow-up (max_tokens is never restored)."""
    requests: list[ScriptedRequest] = []
    script = make_model()

    def model(request: ScriptedRequest) -> ScriptedReply | str:
        requests.append(request)
        return script(request)

    specs: list[ContinuableStartSpec] = []
    original = SubagentService.start_continuable

    async def recording(self: SubagentService, spec: ContinuableStartSpec) -> Any:
        specs.append(spec)
        return await original(self, spec)

    monkeypatch.setattr(SubagentService, "start_continuable", recording)
    configured = row(
        background_mode="continuable",
        agent_options={"model": "small", "max_tokens": 77},
        tool_filter={"deny": ["peek"]},
        persona="You are terse.",
        max_depth=1,
    )
    async with scripted_host("subagent", configured, model=model, modules=MODULES) as host:
        host.ctx.tools.register(named_tool("look"))
        host.ctx.tools.register(named_tool("peek"))
        parent = (await host.create_agent()).agent
        b = Booted(host=host, parent=parent)
        b.add_provider(LocalProvider())
        ends: list[SubagentRunEndInfo] = []
        ended = asyncio.Event()

        def on_end(info: SubagentRunEndInfo) -> None:
            ends.append(info)
            ended.set()

        host.ctx.on("subagent/end", on_end)

        async def epoch_end(count: int) -> SubagentRunEndInfo:
            async with asyncio.timeout(BOUND):
                while len(ends) < count:
                    ended.clear()
                    await ended.wait()
            return ends[count - 1]

        result = await b.execute(args(call_text(args("grand"))))
        child_id = text(result).removeprefix("started subagent ")
        assert text(result) == f"started subagent {child_id}"
        (spec,) = specs
        assert (spec.persona, spec.max_depth) == ("You are terse.", 1)
        assert spec.tool_filter == ToolRestriction(deny=("peek",))
        assert spec.agent_options == AgentOptions(model="small", max_tokens=77)
        refused = "got: Error: subagent depth 2 exceeds maxDepth 1"
        first = await epoch_end(1)
        assert blocks_text(first.last_assistant_message) == refused
        await b.svc.followup(
            parent,
            child_id,
            text_blocks(call_text(args("grand again"))),
            SubagentFollowupOptions(source=CoordinatorMessageSource(sender_session_id=parent.id)),
        )
        second = await epoch_end(2)
        assert second.id == child_id and second.run_id != first.run_id
        assert blocks_text(second.last_assistant_message) == refused
        # The child's own calls (one per epoch) carried the same row config and were refused.
        configs = [(s.persona, s.max_depth, s.tool_filter, s.agent_options) for s in specs]
        assert len(specs) == 3 and configs[1:] == configs[:1] * 2
        assert [s.parent.id for s in specs[1:]] == [child_id, child_id]
        mine = [r for r in requests if r.options.session_id == child_id]
        assert len(mine) == 4  # two per epoch: the refused call, then the answer
        for request in mine:
            names = [t.name for t in request.tools or ()]
            assert "look" in names and "subagent" in names and "peek" not in names
            assert "You are terse." in request.system
            assert request.model == "small"
        assert [r.max_tokens for r in mine] == [77, 77, None, None]


# -- TOOL-10: concurrency -------------------------------------------------------------------------


async def test_sibling_delegations_overlap() -> None:
    """TOOL-10: two foreground calls in one response run together: each child waits until
    the other has started (a two-child gate), which a serial execution would never pass."""
    arrived = {"a": asyncio.Event(), "b": asyncio.Event()}

    def gate(me: str, other: str) -> Callable[[], Awaitable[object]]:
        async def wait() -> None:
            arrived[me].set()
            await arrived[other].wait()

        return wait

    gates = {"a": gate("a", "b"), "b": gate("b", "a")}
    async with boot(row(), provider=LocalProvider(), gates=gates) as b:
        definition = b.parent.ctx.tools.get("subagent")
        assert definition is not None and definition.concurrency_safe
        answer = await b.run(call_text(args("hold a"), args("hold b")))
        assert answer == "got: working | working"


# -- TOOL-11: the guidance section ----------------------------------------------------------------


def section_names(b: Booted, agent: Agent) -> dict[str, str]:
    assembly = agent.ctx.system_prompt.assemble(AssembleContext(scope=agent.ctx.scope, agent=agent))
    return dict(assembly.sections)


async def test_guidance_section_in_continuable_mode() -> None:
    """TOOL-11: in continuable mode `tool:<name>` (order 116.5) advises background use; it is
    empty while the tool is absent or hidden by a restriction in that scope."""
    assert SECTION_ORDER == 116.5
    async with boot(row(background_mode="continuable")) as b:
        assert "tool:subagent" not in section_names(b, b.parent)

        async def read(args: Any, run: Any) -> str:
            return ""

        b.host.ctx.tools.register(ToolDefinition(name="read", description="d", execute=read))

        def only_read(ctx: Context) -> None:
            ctx.tools.restrict(ToolRestriction(allow=("read",)))

        earlier = (await b.host.create_agent(setup=only_read)).agent  # before the tool exists
        owner = b.add_provider(LocalProvider())
        assert "subagent" not in b.tool_names(earlier)
        assert "tool:subagent" not in section_names(b, earlier)
        text_ = section_names(b, b.parent)["tool:subagent"]
        assert "Use subagent in the background by default" in text_
        assert "runtime sends you a notice containing its outcome" in text_

        def hide(ctx: Context) -> None:
            ctx.tools.restrict(ToolRestriction(deny=("subagent",)))

        hidden = (await b.host.create_agent(setup=hide)).agent
        assert "tool:subagent" not in section_names(b, hidden)
        await owner.dispose()
        assert "tool:subagent" not in section_names(b, b.parent)


async def test_no_guidance_section_in_one_shot_mode() -> None:
    """TOOL-11: the section exists only in continuable mode with background enabled."""
    for config in ({}, {"background_mode": "continuable", "enable_run_in_background": False}):
        async with boot(row(**config), provider=LocalProvider()) as b:
            assert not any(n.startswith("tool:") for n in section_names(b, b.parent))


# -- DEP: depth through the real tool -------------------------------------------------------------


async def test_a_depth_capped_chain_refuses_the_fourth_level_with_an_errored_result() -> None:
    """DEP-2, TOOL-6: with the default max_depth 3, a chain of delegations refuses the 4th
    level as an errored tool result (never an exception); every turn completes."""
    async with boot(row(), provider=LocalProvider()) as b:
        answer = await b.run("chain 4")
        assert answer == "got: got: got: got: Error: subagent depth 4 exceeds maxDepth 3"
        ends = [e.data.reason.kind for e in b.parent.session.events if e.type == "turn/end"]
        assert ends == ["completed"]


async def test_max_depth_zero_forbids_any_child() -> None:
    """DEP-2: max_depth 0 refuses the first child with the depth text."""
    async with boot(row(max_depth=0), provider=LocalProvider()) as b:
        result = await b.execute(args())
        assert result.error is not None
        assert text(result) == "Error: subagent depth 1 exceeds maxDepth 0"


# -- a provider's own cancellation is not the parent's (tools 15: never end the parent's turn) ----


@attrs.define(eq=False)
class SelfCancellingProvider:
    """A provider that settles with a cancellation of its own, not of the caller's task:
    ``where`` is ``start`` (its start raises ``CancelledError``), ``result`` (it cancels its
    result future) or ``prepare`` (its ``prepare_continuable`` raises ``CancelledError``)."""

    where: str
    name: str = "local"
    capabilities: SubagentCapabilities = IN_PROCESS_CAPABILITIES
    inherits_parent_context: bool = False
    disposed: int = 0

    async def start(self, request: ResolvedSubagentStartRequest) -> SubagentRun:
        if self.where == "start":
            raise asyncio.CancelledError
        future: asyncio.Future[SubagentResult] = asyncio.get_running_loop().create_future()
        future.cancel()

        async def dispose() -> None:
            self.disposed += 1

        return SubagentRun(id="cancelled-run", local_agent=None, result=future, dispose=dispose)

    async def prepare_continuable(self, request: ContinuableCreateRequest) -> ContinuableCreateSpec:
        raise asyncio.CancelledError


@pytest.mark.parametrize(
    ("where", "config", "expected", "code"),
    [
        ("start", {}, "Error: subagent start was cancelled; no subagent was started", "CANCELLED"),
        ("result", {}, "Error: subagent run was cancelled", "SUBAGENT_RUN_FAILED"),
        (
            "prepare",
            {"background_mode": "continuable"},
            "Error: subagent start was cancelled; no subagent was started",
            "CANCELLED",
        ),
    ],
)
async def test_a_providers_own_cancellation_is_an_errored_result_not_the_end_of_the_turn(
    where: str, config: dict[str, Any], expected: str, code: str
) -> None:
    """TOOL-7, TOOL-9 (tools 15: bad outcomes are errored results): a provider that cancels
    its own start, preparation or result future (``SharedResult.cancelled()``) is not a
    cancellation of the parent: the call is an errored result the model reads, a run that
    exists is disposed, and the parent's turn completes."""
    provider = SelfCancellingProvider(where=where)
    async with boot(row(**config), provider=provider) as b:
        answer = await b.run(call_text(args()))
        assert answer == f"got: {expected}"
        (result,) = [e.data for e in b.parent.session.events if e.type == "tool/result"]
        assert result.error is not None and result.error.code == code
        ends = [e.data.reason.kind for e in b.parent.session.events if e.type == "turn/end"]
        assert ends == ["completed"]
        assert provider.disposed == (1 if where == "result" else 0)


# -- ROB-84: the delegation-depth statement in a child's runtime context ---------------------------


def _depth_statements(b: Booted, agent_text: str) -> list[str]:
    """The depth statements in the requests whose latest user text is ``agent_text``."""
    return [
        line
        for request in b.host.model.requests
        if request.last_user_text == agent_text
        for message in request.messages
        for line in message.text.split("\n")
        if line.startswith("Delegation depth for")
    ]


@pytest.mark.parametrize(
    ("max_depth", "expected"),
    [
        (
            1,
            "Delegation depth for `subagent`: current 1, maximum 1, remaining levels 0. Do not "
            "call `subagent` at this depth; carry out the work directly.",
        ),
        (3, "Delegation depth for `subagent`: current 1, maximum 3, remaining levels 2."),
        ("provider-managed", None),
    ],
)
async def test_a_child_reads_its_delegation_depth_in_its_runtime_context(
    max_depth: Any, expected: str | None
) -> None:
    """ROB-84: a child under a numeric max_depth reads its current and maximum depth and the
    levels left (told to do the work itself at the limit) in its runtime context from its
    first request; the root agent reads none, nor does a child without a depth limit."""
    async with boot(row(max_depth=max_depth), provider=LocalProvider()) as b:
        answer = await b.run(call_text(args("child task")))
        assert answer == "got: child says: child task"
        child = _depth_statements(b, "child task")
        assert child == ([expected] if expected is not None else [])
        assert not any(
            "Delegation depth" in m.text
            for r in b.host.model.requests
            if r.last_user_text.startswith("call ")
            for m in r.messages
        )


# -- TOOL-7/8/9: the structured value beside the text ----------------------------------------------


async def test_a_foreground_call_has_a_foreground_value_beside_its_text() -> None:
    """TOOL-7: a completed foreground call's value is {kind: "foreground", runId, output}
    (the run's blocks as JSON, reasoning included), reported by `tools/result`; the model
    reads the concatenated text blocks only; the tool declares that output schema."""
    fake = FakeProvider(
        name="local",
        result=SubagentResult(
            output=(TextBlock(text="one "), ReasoningBlock(text="hm"), TextBlock(text="two")),
            stop_reason="completed",
        ),
    )
    async with boot(row(), provider=fake) as b:
        seen: list[Any] = []
        b.host.ctx.on("tools/result", lambda call, result: seen.append(result.value))
        result = await b.execute(args())
        assert result.ok and text(result) == "one two"
        expected = {
            "kind": "foreground",
            "runId": "fake-1",
            "output": [
                {"type": "text", "text": "one "},
                {"type": "reasoning", "text": "hm"},
                {"type": "text", "text": "two"},
            ],
        }
        assert thaw_json(result.value) == expected
        assert [thaw_json(v) for v in seen] == [expected]
        definition = b.parent.ctx.tools.get("subagent")
        assert definition is not None and definition.output.schema == OUTPUT_SCHEMA


async def test_a_background_call_has_a_background_value_beside_its_text() -> None:
    """TOOL-8: a one-shot background call's value is {kind: "background", jobId}; the model
    reads `started background subagent job <jobId>`."""
    async with boot(row(), provider=LocalProvider()) as b:
        started = await b.execute(args("background work", run_in_background=True))
        assert thaw_json(started.value) == {"kind": "background", "jobId": "subagent-1"}
        assert text(started) == "started background subagent job subagent-1"


async def test_a_continuable_call_has_a_continuable_value_beside_its_text() -> None:
    """TOOL-9: a continuable call's value is {kind: "continuable", subagentId}; the model
    reads `started subagent <subagentId>`, and the id is the child's."""
    async with boot(row(background_mode="continuable"), provider=LocalProvider()) as b:
        started = await b.execute(args("continue me"))
        value = thaw_json(started.value)
        entries = await b.svc.list_children(b.parent.id)
        assert value == {"kind": "continuable", "subagentId": entries[0].id}
        assert text(started) == f"started subagent {entries[0].id}"


def test_the_rendering_of_each_value_shape() -> None:
    """TOOL-7/8/9: the model's text of each value shape, from the value alone."""
    run: Any = None
    foreground = {
        "kind": "foreground",
        "runId": "r",
        "output": [
            {"type": "text", "text": "a"},
            {"type": "tool-call"},
            {"type": "text", "text": "b"},
        ],
    }
    assert blocks_text(render_output(foreground, run)) == "ab"
    background = {"kind": "background", "jobId": "subagent-3"}
    assert (
        blocks_text(render_output(background, run)) == "started background subagent job subagent-3"
    )
    continuable = {"kind": "continuable", "subagentId": "s-1"}
    assert blocks_text(render_output(continuable, run)) == "started subagent s-1"
