"""Background jobs (``ctx.jobs``) and the model's ``job_output`` / ``job_kill`` tools.

A job is work an agent started and collects later (a one-shot background subagent, say). Each
owner may have at most ``cap`` unfinished jobs (default 10); a job that is *stopping* still holds
its slot, and a refused start creates no job id (BUG-7). A job's producer owns its own abort
controller: the tool call that started it does not own it.

The model's ``job_output`` and ``job_kill`` are visible only where an agent can have jobs: in a
scope that also sees a tool that starts jobs (``ToolDefinition.starts_jobs``, e.g. the
``subagent`` tool in one-shot background mode), and in the scope of every agent that owns a
job (registered there when its first job starts), so a job stays collectable after the tool
that started it went away. Elsewhere they are absent from the prompt and fail as
``UNKNOWN_TOOL``.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, Literal

import attrs

from ._abort import AbortController, AbortSignal
from ._errors import DshError
from ._frozen import attrs_eq, attrs_hash, attrs_repr
from ._tools import ToolDefinition, ToolError, ToolRunContext
from ._words import shown_id

if TYPE_CHECKING:
    from ._agent import Agent
    from ._context import Context

__all__ = ["Job", "JobError", "JobService", "JobSettlement", "JobStatus", "install_jobs"]

JobStatus = Literal["running", "stopping", "completed", "failed", "killed"]
_FINAL = frozenset({"completed", "failed", "killed"})
DEFAULT_CAP = 10


def kill_reason(kind: str) -> str:
    """The abort reason of a job killed without one: ``background <kind> task killed`` (for a
    one-shot background subagent, TOOL-8's verbatim ``background subagent task killed``)."""
    return f"background {kind} task killed"


class JobError(DshError):
    """A job operation was refused: ``JOB_LIMIT``, ``UNKNOWN_JOB``, ``UNAUTHORIZED``."""

    code = "JOB_ERROR"


@attrs.frozen(kw_only=True)
class JobSettlement:
    """How a producer ended: its status, final output text, and failure detail."""

    __repr__ = attrs_repr
    __eq__ = attrs_eq
    __hash__ = attrs_hash

    status: Literal["completed", "failed", "killed"]
    output: str = ""
    detail: str | None = None


Producer = Callable[[AbortSignal], Awaitable[JobSettlement]]


class Job:
    """One background job; ``status`` moves running -> (stopping ->) completed/failed/killed."""

    __slots__ = (
        "_controller",
        "_read",
        "_task",
        "detail",
        "id",
        "kind",
        "label",
        "output",
        "owner_id",
        "status",
    )

    def __init__(self, id: str, kind: str, label: str, owner_id: str) -> None:
        self.id = id
        self.kind = kind
        self.label = label
        self.owner_id = owner_id
        self.status: JobStatus = "running"
        self.output = ""
        self.detail: str | None = None
        self._read = 0
        self._controller = AbortController()
        self._task: asyncio.Task[None] | None = None

    @property
    def finished(self) -> bool:
        """Whether the job has settled."""
        return self.status in _FINAL

    def status_line(self) -> str:
        """``[status: <status>]`` or ``[status: <status>, <detail>]``."""
        return f"[status: {self.status}{', ' + self.detail if self.detail else ''}]"

    def take_output(self) -> str:
        """Output not read before (a cursor per job)."""
        new = self.output[self._read :]
        self._read = len(self.output)
        return new

    async def wait(self) -> None:
        """Wait until the job settles."""
        if self._task is not None:
            await asyncio.wait((self._task,))


class JobService:
    """The jobs of one host (provided as ``jobs``)."""

    def __init__(self, ctx: Context, *, cap: int = DEFAULT_CAP) -> None:
        if cap < 1:
            raise JobError("the job cap must be at least 1", code="JOB_CONFIG")
        self._ctx = ctx
        self.cap = cap
        self.jobs: dict[str, Job] = {}
        # Unfinished jobs by owner: admission looks at one owner's few jobs, not at every job
        # the host has run.
        self._unfinished: dict[str, dict[str, Job]] = {}
        self._ids = itertools.count(1)
        #: Called with an owner when it starts its first job (its scope gets the job tools).
        self.on_first_job: Callable[[Agent], None] | None = None
        self._owners: set[str] = set()

    def active(self, owner_id: str) -> list[Job]:
        """The owner's unfinished jobs (running or stopping)."""
        return [j for j in self._unfinished.get(owner_id, {}).values() if not j.finished]

    def start(self, *, kind: str, label: str, owner: Agent, producer: Producer) -> Job:
        """Start ``producer`` as a job of ``owner``; refused (no id minted) past the cap."""
        if len(self.active(owner.id)) >= self.cap:
            raise JobError(
                f"agent {owner.id} already has {self.cap} unfinished background jobs; collect "
                "or kill one first",
                code="JOB_LIMIT",
            )
        if owner.id not in self._owners and self.on_first_job is not None:
            self.on_first_job(owner)
        job = Job(f"{kind}-{next(self._ids)}", kind, label, owner.id)
        self.jobs[job.id] = job
        self._unfinished.setdefault(owner.id, {})[job.id] = job
        job._task = self._ctx.host.spawn(self._run(job, producer), name=f"job:{job.id}")
        return job

    async def _run(self, job: Job, producer: Producer) -> None:
        try:
            try:
                settled = await producer(job._controller.signal)
            except asyncio.CancelledError:
                job.status, job.detail = "killed", "job cancelled"
                raise
            except ExceptionGroup as exc:
                # Several failures at once (an aggregate): a kill explains none of them, so it
                # stays ``failed`` even when the job was being stopped (TOOL-8).
                settled = JobSettlement(status="failed", detail=f"{type(exc).__name__}: {exc}")
            except Exception as exc:
                if job._controller.signal.aborted:  # stopped: the rejection is the kill's
                    settled = JobSettlement(status="killed")
                else:
                    settled = JobSettlement(status="failed", detail=f"{type(exc).__name__}: {exc}")
            else:
                if job._controller.signal.aborted and settled.status != "completed":
                    settled = attrs.evolve(settled, status="killed")
            job.output += settled.output
            job.detail = settled.detail
            job.status = settled.status
        finally:
            mine = self._unfinished.get(job.owner_id)
            if mine is not None:
                mine.pop(job.id, None)
                if not mine:
                    del self._unfinished[job.owner_id]

    def get(self, job_id: str, *, owner: Agent | None = None) -> Job:
        """The job ``job_id``; with ``owner``, only that owner's."""
        job = self.jobs.get(job_id)
        if job is None:
            raise JobError(
                f"unknown job {shown_id(job_id)}; use a job id you were given when a job started",
                code="UNKNOWN_JOB",
            )
        if owner is not None and job.owner_id != owner.id:
            raise JobError(
                f"job {shown_id(job_id)} belongs to another agent; you can read and stop only "
                "your own jobs",
                code="UNAUTHORIZED",
            )
        return job

    def kill(self, job_id: str, reason: str | None = None, *, owner: Agent | None = None) -> Job:
        """Ask a job to stop, for ``reason`` (default: :func:`kill_reason` of its kind); it
        holds its slot (``stopping``) until its producer settles."""
        job = self.get(job_id, owner=owner)
        if not job.finished:
            job.status = "stopping"
            job._controller.abort(reason or kill_reason(job.kind))
        return job

    async def dispose(self) -> None:
        """Stop every job and wait for them to settle."""
        for job in list(self.jobs.values()):
            if not job.finished:
                job.status = "stopping"
                job._controller.abort("host shutting down")
        for job in list(self.jobs.values()):
            await job.wait()


def _render(job: Job, new: str) -> str:
    return f"{new or '(no new output)'}\n{job.status_line()}"


def _can_have_jobs(visible: Iterable[ToolDefinition]) -> bool:
    """The job tools' visibility: some other tool visible in the scope starts jobs."""
    return any(d.starts_jobs for d in visible)


def install_jobs(ctx: Context, *, cap: int = DEFAULT_CAP) -> JobService:
    """Provide ``jobs`` and register ``job_output`` and ``job_kill``: globally, visible only
    beside a tool that starts jobs, and in each job owner's own scope from its first job."""
    service = JobService(ctx, cap=cap)
    ctx.provide("jobs", service)
    ctx.fiber.add(service.dispose)

    def on_agent_disposed(agent: Agent) -> None:
        service._owners.discard(agent.id)
        for job in service.active(agent.id):
            service.kill(job.id, f"owner {agent.id} was disposed")

    ctx.on("agent/disposed", on_agent_disposed, global_=True)

    def owner_of(run: ToolRunContext, tool: str) -> Agent:
        if run.agent is None:
            raise ToolError(f"{tool} requires a calling agent", code="NO_AGENT")
        return run.agent

    async def job_output(args: Any, run: ToolRunContext) -> str:
        job = service.get(args["job_id"], owner=owner_of(run, "job_output"))
        if args.get("wait", False) and not job.finished:
            waiter = asyncio.ensure_future(job.wait())
            aborted = asyncio.ensure_future(run.signal.wait())
            try:
                await asyncio.wait((waiter, aborted), return_when=asyncio.FIRST_COMPLETED)
            finally:  # also when the call itself is cancelled: the helpers die with it
                waiter.cancel()
                aborted.cancel()
        return _render(job, job.take_output())

    async def job_kill(args: Any, run: ToolRunContext) -> str:
        job = service.kill(args["job_id"], owner=owner_of(run, "job_kill"))
        return f"job {job.id} {'is stopping' if not job.finished else 'already ' + job.status}"

    definitions = (
        ToolDefinition(
            name="job_output",
            description=(
                "Read the new output of one of your background jobs and its status. With "
                "wait: true, wait until the job finishes first."
            ),
            parameters={
                "type": "object",
                "properties": {
                    "job_id": {"type": "string", "description": "The job id you were given."},
                    "wait": {"type": "boolean", "description": "Wait for the job to finish."},
                },
                "required": ["job_id"],
                "additionalProperties": False,
            },
            execute=job_output,
            concurrency_safe=True,
            visible_if=_can_have_jobs,
        ),
        ToolDefinition(
            name="job_kill",
            description="Stop one of your background jobs. Its status becomes killed.",
            parameters={
                "type": "object",
                "properties": {"job_id": {"type": "string"}},
                "required": ["job_id"],
                "additionalProperties": False,
            },
            execute=job_kill,
            visible_if=_can_have_jobs,
        ),
    )
    for definition in definitions:
        ctx.tools.register(definition)
    scoped = tuple(attrs.evolve(d, visible_if=None) for d in definitions)

    def on_first_job(owner: Agent) -> None:
        # The owner's own layer: never hidden by a restriction, gone with the agent.
        service._owners.add(owner.id)
        tools = owner.ctx.tools
        for definition in scoped:
            try:
                tools.register(definition)
            except ToolError:  # the scope already has a tool of that name: it stays
                pass

    service.on_first_job = on_first_job
    return service
