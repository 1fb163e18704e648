"""Host hook specifications of the ``dsh`` plugin project.

A distribution announces itself with an entry point in the ``dsh`` group whose module holds
``@dsh_core.hookimpl`` functions for the hooks below. Hooks run at discovery time, before any
host is booted; runtime behaviour (events, services, tools) goes through
:class:`dsh_core.Context`, not through pluggy. Implementations may accept fewer arguments than a
spec declares; every spec here takes none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from ._events import EventTypeSpec
    from ._plugins import PluginSpec

__all__ = ["dsh_message_source_kinds", "dsh_plugins", "dsh_session_event_types", "hookspec"]

hookspec = pluggy.HookspecMarker("dsh")


@hookspec
def dsh_plugins() -> list[PluginSpec]:
    """Return the plugins this distribution can mount into a host.

    Each :class:`~dsh_core.PluginSpec` is one row a composition may name. Names are global:
    two distributions offering the same name make discovery fail loud.

    :return: the distribution's mountable plugins (may be empty).
    """
    raise NotImplementedError


@hookspec
def dsh_session_event_types() -> list[EventTypeSpec]:
    """Return the session event types this distribution writes or reads.

    Called before any log is loaded or seeded, so a log holding these types can be read.
    Re-registering an identical spec is harmless; a conflicting one fails loud.

    :return: event type specs (e.g. ``subagent/descriptor``).
    """
    raise NotImplementedError


@hookspec
def dsh_message_source_kinds() -> list[type]:
    """Return extra :class:`~dsh_core.MessageSource` variants (``coordinator``, ...).

    Each is an attrs subclass of ``MessageSource`` with a fixed ``kind`` default. A kind no
    plugin registers still round-trips, as ``UnknownSource``.

    :return: message source classes.
    """
    raise NotImplementedError
