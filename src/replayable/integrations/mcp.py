"""MCP client sessions whose tool calls are recorded and replayed.

Two ways in:

- ``instrument(session, side_effects={"delete_file"})`` wraps a connected
  ``mcp.ClientSession`` (or ``mcp.Client``): ``list_tools``, ``call_tool``,
  ``list_resources``, ``list_resource_templates``, ``read_resource``,
  ``list_prompts`` and ``get_prompt`` become boundaries. Everything else is
  passed through.
- ``async with connect(stdio(params), side_effects=...) as session:``
  connects lazily: a recording connects at once, a replay connects only
  when a call has to run live (a fork past its step, a counterfactual), so
  a pure replay needs no server at all.

``call_tool(name, ...)`` is a ``tool`` event named after the MCP tool, with
the arguments as its request, so ``fork_at``, ``allow_live`` and
``replayable.configure(side_effects=...)`` name MCP tools the way they name
local ones. A tool listed in ``side_effects`` is recorded as side-effecting:
a fork never runs it live unless it is named in ``allow_live``. The other
methods are ``tool`` events named ``mcp.<method>``.

On replay a recorded ``progress_callback`` is not called again; a result
the server marked ``is_error`` is a value and comes back as such, an
exception the call raised is raised again.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING, Any

from replayable.capture.context import _STATE, active_state
from replayable.capture.runtime import Call

if TYPE_CHECKING:
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters

__all__ = ["ReplayableSession", "connect", "instrument", "stdio", "streamable_http"]

SessionFactory = Callable[[], AbstractAsyncContextManager[Any]]


def _site() -> str | None:
    try:
        f = sys._getframe(2)
    except ValueError:
        return None
    return f"{f.f_code.co_filename}:{f.f_lineno} in {f.f_code.co_name}"


class ReplayableSession:
    """An MCP client session whose calls are boundaries (see the module docs)."""

    def __init__(
        self,
        session: Any = None,
        *,
        side_effects: Iterable[str] = (),
        server: str | None = None,
        factory: SessionFactory | None = None,
    ) -> None:
        if session is None and factory is None:
            raise ValueError("give a connected session or a factory that opens one")
        self._session = session
        self._factory = factory
        self._stack: AsyncExitStack | None = None
        self.side_effects = frozenset(side_effects)
        self.server = server

    # -- connection ---------------------------------------------------------------

    @property
    def connected(self) -> bool:
        """Whether a real session is open (a pure replay never opens one)."""
        return self._session is not None

    @property
    def session(self) -> Any:
        """The real session (opening it first is the caller's business: see :meth:`open`)."""
        if self._session is None:
            raise RuntimeError("the MCP session is not connected (a replay served every call)")
        return self._session

    async def open(self) -> Any:
        """The real session, connecting through the factory if it is not open yet."""
        if self._session is None:
            if self._factory is None:
                raise RuntimeError("no MCP session and no factory to open one")
            stack = AsyncExitStack()
            # The transport's background tasks must not inherit the run: their
            # traffic belongs to the boundaries below, not to the agent.
            token = _STATE.set(None)
            try:
                self._session = await stack.enter_async_context(self._factory())
            except BaseException:
                await stack.aclose()
                raise
            finally:
                _STATE.reset(token)
            self._stack = stack
        return self._session

    async def aclose(self) -> None:
        """Close a session this object opened."""
        stack, self._stack = self._stack, None
        if stack is not None:
            self._session = None
            await stack.aclose()

    async def __aenter__(self) -> ReplayableSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.session, name)

    # -- boundaries ---------------------------------------------------------------

    async def _call(
        self,
        name: str,
        method: str,
        request: dict[str, Any],
        side_effect: bool,
        invoke: Callable[[Any], Awaitable[Any]],
    ) -> Any:
        async def live() -> Any:
            return await invoke(await self.open())

        st = active_state()
        if st is None or st.run is None:
            return await live()
        meta: dict[str, Any] = {"mcp_method": method}
        if self.server is not None:
            meta["mcp_server"] = self.server
        return await st.run.acall(
            st, Call("tool", name, live, (), {}, request, side_effect, meta, _site())
        )

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        read_timeout_seconds: float | None = None,
        progress_callback: Any = None,
        **kwargs: Any,
    ) -> Any:
        """``tools/call``: a ``tool`` event named ``name``."""
        request: dict[str, Any] = {"arguments": arguments or {}}
        request.update({k: v for k, v in kwargs.items() if v is not None and k != "meta"})

        def invoke(s: Any) -> Awaitable[Any]:
            extra: dict[str, Any] = {}
            if read_timeout_seconds is not None:
                extra["read_timeout_seconds"] = read_timeout_seconds
            if progress_callback is not None:
                extra["progress_callback"] = progress_callback
            return s.call_tool(name, arguments, **extra, **kwargs)  # type: ignore[no-any-return]

        return await self._call(name, "tools/call", request, name in self.side_effects, invoke)

    async def list_tools(self, **kwargs: Any) -> Any:
        """``tools/list``: a ``tool`` event named ``mcp.list_tools``."""
        return await self._method("list_tools", "tools/list", (), kwargs)

    async def list_resources(self, **kwargs: Any) -> Any:
        """``resources/list``."""
        return await self._method("list_resources", "resources/list", (), kwargs)

    async def list_resource_templates(self, **kwargs: Any) -> Any:
        """``resources/templates/list``."""
        return await self._method("list_resource_templates", "resources/templates/list", (), kwargs)

    async def read_resource(self, uri: Any, **kwargs: Any) -> Any:
        """``resources/read``."""
        return await self._method("read_resource", "resources/read", (str(uri),), kwargs)

    async def list_prompts(self, **kwargs: Any) -> Any:
        """``prompts/list``."""
        return await self._method("list_prompts", "prompts/list", (), kwargs)

    async def get_prompt(
        self, name: str, arguments: dict[str, str] | None = None, **kwargs: Any
    ) -> Any:
        """``prompts/get``."""
        return await self._method("get_prompt", "prompts/get", (name, arguments), kwargs)

    async def _method(
        self, attr: str, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        request: dict[str, Any] = {}
        if args:
            request["args"] = list(args)
        if kwargs:
            request["kwargs"] = kwargs

        def invoke(s: Any) -> Awaitable[Any]:
            return getattr(s, attr)(*args, **kwargs)  # type: ignore[no-any-return]

        return await self._call(f"mcp.{attr}", method, request, False, invoke)


def instrument(
    session: Any, *, side_effects: Iterable[str] = (), server: str | None = None
) -> ReplayableSession:
    """Record and replay the calls made through a connected MCP ``ClientSession``
    (or ``mcp.Client``). ``side_effects`` names the server's tools that change the
    world; ``server`` is stored with each event."""
    return ReplayableSession(session, side_effects=side_effects, server=server)


@asynccontextmanager
async def connect(
    factory: SessionFactory, *, side_effects: Iterable[str] = (), server: str | None = None
) -> AsyncIterator[ReplayableSession]:
    """A recorded MCP session opened by ``factory`` (an async context manager yielding an
    initialized session, e.g. :func:`stdio`). A recording connects at once; a replay
    connects only if a call runs live."""
    wrapped = ReplayableSession(factory=factory, side_effects=side_effects, server=server)
    try:
        if not _replaying():
            await wrapped.open()
        yield wrapped
    finally:
        await wrapped.aclose()


def _replaying() -> bool:
    st = active_state()
    if st is None:
        return False
    from replayable.replay.session import Served

    return isinstance(st.session, Served)


def stdio(params: StdioServerParameters) -> SessionFactory:
    """A factory for :func:`connect`: spawn the server and open an initialized session."""

    @asynccontextmanager
    async def open_session() -> AsyncIterator[ClientSession]:
        from mcp import ClientSession
        from mcp.client.stdio import stdio_client

        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            yield session

    return open_session


def streamable_http(url: str, **kwargs: Any) -> SessionFactory:
    """A factory for :func:`connect`: an initialized session over streamable HTTP."""

    @asynccontextmanager
    async def open_session() -> AsyncIterator[ClientSession]:
        from mcp import ClientSession
        from mcp.client.streamable_http import streamable_http_client

        async with (
            streamable_http_client(url, **kwargs) as streams,
            ClientSession(streams[0], streams[1]) as session,
        ):
            await session.initialize()
            yield session

    return open_session
