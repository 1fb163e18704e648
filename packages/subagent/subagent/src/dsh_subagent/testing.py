"""The provider contract suite: what every subagent provider must do, as runnable tests.

Subclass :class:`ProviderContract` in your provider's tests and implement
``contract_host()``, an async context manager that yields a :class:`ContractHost`: a booted
host where your provider is registered, a live parent agent, and two prompts (one the child
answers with ``expected_output`` in it, one the child keeps working on until cancelled).
pytest then runs every ``test_*`` method below against your provider::

    class TestMyProviderContract(ProviderContract):
        def contract_host(self):
            return in_process_contract_host("subagent-mine", modules={...})

Needs ``dsh-core[testing]`` (pytest, hypothesis) and the async test plugin
``dsh_core.testing.pytest_plugin``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, TypeVar

import attrs
import pytest

from dsh_core import (
    AbortController,
    AbortedError,
    Agent,
    Message,
    TextBlock,
    attrs_eq,
    attrs_hash,
    attrs_repr,
    blocks_text,
    check_balanced,
    text_blocks,
)
from dsh_core.testing import ScriptedReply, ScriptedRequest, TestHost, scripted_host

from ._descriptor import DESCRIPTOR_EVENT
from ._service import SUBAGENTS, SubagentService
from ._types import (
    ContinuableCreateRequest,
    ContinuableCreateSpec,
    ContinuableStart,
    ContinuableStartSpec,
    CoordinatorMessageSource,
    SubagentCapabilities,
    SubagentFollowupOptions,
    SubagentRunEndInfo,
    SubagentRunInfo,
    SubagentSettledMessageSource,
    SubagentStartRequest,
)

__all__ = [
    "ANSWER_PREFIX",
    "HOLD_PROMPT",
    "ContractHost",
    "ProviderContract",
    "contract_model",
    "in_process_contract_host",
]

#: The scripted child answers every prompt with this prefix + the prompt.
ANSWER_PREFIX = "contract answer: "
#: A prompt the scripted child keeps working on until its request is aborted.
HOLD_PROMPT = "contract: hold until cancelled"
#: The bound (seconds) on every wait of the continuable checks.
BOUND = 10

T = TypeVar("T")


@attrs.frozen(kw_only=True)
class ContractHost:
    """What the suite needs: the host, the parent, the provider's name, and the prompts.

    ``unregister`` (optional) removes the provider from the running host, as unmounting its
    plugin does; the continuable checks use it to prove a cold resume never consults the
    provider (CONT-10). ``followup_output`` is what the child's answer to ``followup_prompt``
    contains.
    """

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    host: TestHost
    parent: Agent = attrs.field(eq=False)
    provider_name: str
    prompt: str = "contract: say hello"
    expected_output: str = f"{ANSWER_PREFIX}contract: say hello"
    hold_prompt: str = HOLD_PROMPT
    followup_prompt: str = "contract: and once more"
    followup_output: str = f"{ANSWER_PREFIX}contract: and once more"
    unregister: Callable[[], Awaitable[None]] | None = attrs.field(default=None, eq=False)

    @property
    def subagents(self) -> SubagentService:
        """The service, seen from the parent."""
        return self.parent.ctx[SUBAGENTS]


def contract_model(request: ScriptedRequest) -> ScriptedReply | str:
    """The scripted model the in-process contract hosts use (children and parent alike)."""
    if request.last_user_text == HOLD_PROMPT:
        return ScriptedReply(text="working", wait=asyncio.Event().wait)
    return ANSWER_PREFIX + request.last_user_text


@contextlib.asynccontextmanager
async def in_process_contract_host(
    *plugins: str,
    provider_name: str,
    modules: Mapping[str, Any],
    config: Mapping[str, Mapping[str, Any]] | None = None,
) -> AsyncIterator[ContractHost]:
    """A scripted host mounting ``subagent`` and ``plugins``, with a parent that has finished
    one turn (so seeded providers have history to inherit)."""
    async with scripted_host(
        "subagent", *plugins, model=contract_model, modules=modules, config=config
    ) as host:
        handle = await host.create_agent()
        await host.run(handle.agent, "contract: parent's first turn")
        mounted = [ctx for name, ctx in host.runtime.mounted if name in plugins]

        async def unregister() -> None:
            for ctx in reversed(mounted):
                await ctx.dispose()

        yield ContractHost(
            host=host, parent=handle.agent, provider_name=provider_name, unregister=unregister
        )
        await handle.dispose()


class ProviderContract:
    """The contract every subagent provider meets (subclass; implement ``contract_host``)."""

    def contract_host(self) -> contextlib.AbstractAsyncContextManager[ContractHost]:
        """Yield a :class:`ContractHost` for the provider under test."""
        raise NotImplementedError

    def _request(self, h: ContractHost, prompt: str, signal: Any = None) -> SubagentStartRequest:
        return SubagentStartRequest(
            prompt=text_blocks(prompt),
            parent=h.parent,
            signal=signal or AbortController().signal,
            label="contract",
        )

    async def test_provider_shape(self) -> None:
        """SVC-1: the provider is registered under a non-empty name with typed capabilities."""
        async with self.contract_host() as h:
            provider = h.subagents.get_provider(h.provider_name)
            assert provider is not None
            assert provider.name == h.provider_name != ""
            assert isinstance(provider.capabilities, SubagentCapabilities)
            assert isinstance(provider.inherits_parent_context, bool)
            assert h.provider_name in h.subagents.list()

    async def test_start_publishes_then_completes(self) -> None:
        """DRV-1: start returns a published run; the result carries the child's answer."""
        async with self.contract_host() as h:
            run = await h.subagents.start(h.provider_name, self._request(h, h.prompt))
            try:
                assert run.id
                child = run.local_agent
                if child is not None:
                    assert child.id == run.id
                    assert h.host.ctx.agents.get(run.id) is child
                    assert child.session.header.parent_session == h.parent.id
                result = await run.result
                assert result.stop_reason == "completed"
                assert h.expected_output in blocks_text(result.output)
            finally:
                await run.dispose()
            if child is not None:
                assert h.host.ctx.agents.get(run.id) is None

    async def test_dispose_is_idempotent_and_settles(self) -> None:
        """DRV-5: dispose is idempotent, cancels remaining work and settles the result."""
        async with self.contract_host() as h:
            run = await h.subagents.start(h.provider_name, self._request(h, h.hold_prompt))
            await asyncio.gather(run.dispose(), run.dispose())
            await run.dispose()
            result = await run.result
            assert result.stop_reason == "aborted"

    async def test_abandoned_wait_never_wedges_dispose(self) -> None:
        """DRV-5, hardening 11.8: a consumer whose wait on result times out cancels only its
        wait; dispose() still stops the child and the result settles aborted."""
        async with self.contract_host() as h:
            run = await h.subagents.start(h.provider_name, self._request(h, h.hold_prompt))
            try:
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(run.result, 0.01)
                assert not run.result.done()
            finally:
                await asyncio.wait_for(run.dispose(), 10)
            result = await asyncio.wait_for(run.result, 10)
            assert result.stop_reason == "aborted"

    async def test_pre_aborted_signal_leaves_nothing(self) -> None:
        """DRV-2: a signal aborted before start rejects; no agent or session is left behind."""
        async with self.contract_host() as h:
            agents = len(h.host.ctx.agents.list())
            sessions = len(h.host.ctx.sessions.list())
            controller = AbortController()
            controller.abort("stop")
            with pytest.raises(AbortedError) as caught:
                await h.subagents.start(
                    h.provider_name, self._request(h, h.prompt, controller.signal)
                )
            assert caught.value.reason == "stop"
            assert len(h.host.ctx.agents.list()) == agents
            assert len(h.host.ctx.sessions.list()) == sessions

    async def test_abort_after_publication_settles_aborted(self) -> None:
        """DRV-5: aborting the request signal after publication settles the run aborted."""
        async with self.contract_host() as h:
            controller = AbortController()
            run = await h.subagents.start(
                h.provider_name, self._request(h, h.hold_prompt, controller.signal)
            )
            try:
                controller.abort("changed my mind")
                result = await run.result
                assert result.stop_reason == "aborted"
            finally:
                await run.dispose()

    async def test_concurrent_starts_are_independent(self) -> None:
        """SVC-13: concurrent children settle independently; cancelling one spares the other."""
        async with self.contract_host() as h:
            held = AbortController()
            first, second = await asyncio.gather(
                h.subagents.start(h.provider_name, self._request(h, h.hold_prompt, held.signal)),
                h.subagents.start(h.provider_name, self._request(h, h.prompt)),
            )
            try:
                assert first.id != second.id
                done = await second.result
                assert done.stop_reason == "completed"
                assert not first.result.done()
                held.abort("only the first")
                assert (await first.result).stop_reason == "aborted"
            finally:
                await asyncio.gather(first.dispose(), second.dispose())

    async def test_lifecycle_events_pair(self) -> None:
        """SVC-9/10: subagent/start then subagent/end with the same run id and identity."""
        async with self.contract_host() as h:
            seen: list[SubagentRunInfo | SubagentRunEndInfo] = []
            h.parent.ctx.on("subagent/start", seen.append)
            h.parent.ctx.on("subagent/end", seen.append)
            run = await h.subagents.start(h.provider_name, self._request(h, h.prompt))
            try:
                await run.result
            finally:
                await run.dispose()
            start, end = seen
            assert isinstance(start, SubagentRunInfo)
            assert isinstance(end, SubagentRunEndInfo)
            assert (end.run_id, end.provider, end.id, end.local) == (
                start.run_id,
                h.provider_name,
                run.id,
                run.local_agent is not None,
            )
            assert end.stop_reason == "completed"
            assert end.last_assistant_message
            assert isinstance(end.last_assistant_message[0], TextBlock)

    async def test_prepare_continuable_returns_detached_data(self) -> None:
        """CONT-4: prepare_continuable (if present) returns data only: a balanced seed or none."""
        async with self.contract_host() as h:
            provider = h.subagents.get_provider(h.provider_name)
            assert provider is not None
            prepare = getattr(provider, "prepare_continuable", None)
            if prepare is None:
                return
            spec = await prepare(
                ContinuableCreateRequest(
                    session_id="contract-child", parent=h.parent, signal=AbortController().signal
                )
            )
            assert isinstance(spec, ContinuableCreateSpec)
            if spec.seed is not None:
                assert [e.seq for e in spec.seed] == list(range(len(spec.seed)))
                check_balanced(spec.seed)
                if not provider.inherits_parent_context:
                    raise AssertionError("a provider that does not inherit context seeded a child")

    # -- continuable children (opt-in: only providers that define prepare_continuable) ----------

    def _continuable(self, h: ContractHost) -> Any:
        """The provider under test, or a skip when it serves no continuable children."""
        provider = h.subagents.get_provider(h.provider_name)
        assert provider is not None
        if getattr(provider, "prepare_continuable", None) is None:
            pytest.skip(f"provider {h.provider_name!r} has no prepare_continuable")
        return provider

    def _spec(self, h: ContractHost, prompt: str, **changes: Any) -> ContinuableStartSpec:
        return ContinuableStartSpec(
            provider=h.provider_name,
            label="contract",
            prompt=text_blocks(prompt),
            parent=h.parent,
            **changes,
        )

    async def test_continuable_child_runs_and_settles(self) -> None:
        """CONT-2, CONT-15, SET-1/2: a continuable child started through the manager with this
        provider answers, settles ``completed``, and its parent gets the exact notice."""
        async with self.contract_host() as h:
            self._continuable(h)
            watch = _Settlements(h)
            started = await _bounded(h.subagents.start_continuable(self._spec(h, h.prompt)))
            assert isinstance(started, ContinuableStart)
            child = h.host.ctx.agents.get(started.child_id)
            assert child is not None
            assert child.session.header.parent_session == h.parent.id
            end = await watch.ended(started.child_id)
            assert end.stop_reason == "completed"
            assert end.provider == h.provider_name
            assert end.last_assistant_message is not None
            assert h.expected_output in blocks_text(end.last_assistant_message)
            (notice,) = watch.notices(started.child_id)
            summary = (
                f"Background subagent {started.child_id} finished and will do no further work "
                "unless you send it more."
            )
            assert notice.source == SubagentSettledMessageSource(
                sender_session_id=started.child_id, summary=summary
            )
            texts = [b.text for b in notice.content if isinstance(b, TextBlock)]
            assert texts[:2] == [summary, "Its closing message:"]
            assert h.expected_output in "".join(texts[2:])
            assert h.host.ctx.agents.get(started.child_id) is None

    async def test_continuable_child_resumes_cold_without_its_provider(self) -> None:
        """CONT-7, CONT-10: a follow-up to a settled child resumes it from its log in a new
        epoch, after the provider is unregistered; the epoch still names the provider."""
        async with self.contract_host() as h:
            self._continuable(h)
            watch = _Settlements(h)
            started = await _bounded(h.subagents.start_continuable(self._spec(h, h.prompt)))
            first = await watch.ended(started.child_id)
            if h.unregister is not None:
                await _bounded(h.unregister())
                assert h.subagents.get_provider(h.provider_name) is None
            source = CoordinatorMessageSource(sender_session_id=h.parent.id)
            message_id = await _bounded(
                h.subagents.followup(
                    h.parent,
                    started.child_id,
                    text_blocks(h.followup_prompt),
                    SubagentFollowupOptions(source=source),
                )
            )
            assert message_id != started.message_id
            second = await watch.ended(started.child_id, count=2)
            assert second.run_id != first.run_id
            assert second.provider == h.provider_name
            assert second.stop_reason == "completed"
            assert second.last_assistant_message is not None
            assert h.followup_output in blocks_text(second.last_assistant_message)
            assert len(watch.notices(started.child_id)) == 2

    async def test_continuable_seed_and_turn_numbering(self) -> None:
        """DSC-5: the child's log is the provider's seed, then the descriptor before turn 1;
        ``seed_length`` counts only the seed, turns continue after an inherited prefix, and a
        cold resume appends no second descriptor."""
        async with self.contract_host() as h:
            provider = self._continuable(h)
            spec = await _bounded(
                provider.prepare_continuable(
                    ContinuableCreateRequest(session_id="contract-probe", parent=h.parent)
                )
            )
            seed = spec.seed or ()
            inherited = max((e.data.turn for e in seed if e.type == "turn/start"), default=0)
            watch = _Settlements(h)
            started = await _bounded(h.subagents.start_continuable(self._spec(h, h.prompt)))
            await watch.ended(started.child_id)
            source = CoordinatorMessageSource(sender_session_id=h.parent.id)
            await _bounded(
                h.subagents.followup(
                    h.parent,
                    started.child_id,
                    text_blocks(h.followup_prompt),
                    SubagentFollowupOptions(source=source),
                )
            )
            await watch.ended(started.child_id, count=2)
            header, events = await _bounded(h.host.ctx.session_persistence.load(started.child_id))
            assert (header.seed_length or 0) == len(seed)
            assert [(e.type, e.data) for e in events[: len(seed)]] == [
                (e.type, e.data) for e in seed
            ]
            own = events[len(seed) :]
            kinds = [e.type for e in own]
            assert kinds.count(DESCRIPTOR_EVENT) == 1
            assert kinds.index(DESCRIPTOR_EVENT) < kinds.index("turn/start")
            turns = [e.data.turn for e in own if e.type == "turn/start"]
            assert turns == [inherited + 1, inherited + 2]

    async def test_concurrent_continuable_prepares_are_independent(self) -> None:
        """SVC-13, TOOL-9: concurrent preparations and starts do not interfere: one whose
        signal is aborted (it may fail with the abort, or finish) spares the other, and one
        child settles while its sibling still runs."""
        async with self.contract_host() as h:
            provider = self._continuable(h)
            stop = AbortController()
            stop.abort("the caller gave up")
            abandoned, kept = await _bounded(
                asyncio.gather(
                    provider.prepare_continuable(
                        ContinuableCreateRequest(
                            session_id="contract-a", parent=h.parent, signal=stop.signal
                        )
                    ),
                    provider.prepare_continuable(
                        ContinuableCreateRequest(session_id="contract-b", parent=h.parent)
                    ),
                    return_exceptions=True,
                )
            )
            assert isinstance(kept, ContinuableCreateSpec), kept
            if isinstance(abandoned, BaseException):
                assert isinstance(abandoned, AbortedError), abandoned
                assert abandoned.reason == "the caller gave up"
            watch = _Settlements(h)
            held, quick = await _bounded(
                asyncio.gather(
                    h.subagents.start_continuable(self._spec(h, h.hold_prompt)),
                    h.subagents.start_continuable(self._spec(h, h.prompt)),
                )
            )
            assert held.child_id != quick.child_id
            end = await watch.ended(quick.child_id)
            assert end.stop_reason == "completed"
            still = h.host.ctx.agents.get(held.child_id)
            assert still is not None and still.status == "running"
            assert watch.notices(held.child_id) == []


async def _bounded(aw: Awaitable[T]) -> T:
    """Every wait of the suite is bounded."""
    async with asyncio.timeout(BOUND):
        return await aw


class _Settlements:
    """The ``subagent/end`` events and settlement notices a contract host sees, by child."""

    def __init__(self, h: ContractHost) -> None:
        self._parent = h.parent
        self._ends: dict[str, list[SubagentRunEndInfo]] = {}
        self._notices: dict[str, list[Message]] = {}
        self._changed = asyncio.Event()
        h.host.ctx.on("subagent/end", self._end)
        h.host.ctx.on("agent/inbox/inserted", self._inserted)

    def _end(self, info: SubagentRunEndInfo) -> None:
        self._ends.setdefault(info.id, []).append(info)
        self._changed.set()

    def _inserted(self, agent: Agent, message: Message) -> None:
        source = message.source
        if agent is self._parent and isinstance(source, SubagentSettledMessageSource):
            self._notices.setdefault(source.sender_session_id, []).append(message)

    async def ended(self, child_id: str, count: int = 1) -> SubagentRunEndInfo:
        """The ``count``-th epoch end of ``child_id`` (waits, bounded)."""
        async with asyncio.timeout(BOUND):
            while len(self._ends.get(child_id, ())) < count:
                self._changed.clear()
                await self._changed.wait()
        return self._ends[child_id][count - 1]

    def notices(self, child_id: str) -> list[Message]:
        """The settlement notices ``child_id`` sent the parent so far."""
        return list(self._notices.get(child_id, ()))
