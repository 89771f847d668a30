"""The web audit interface: ``replayable serve``.

In: a store URL and a :class:`WebConfig` (accounts, trusted proxy, database logins).
Out: an ASGI app (:func:`create_app`) with server-rendered pages and their JSON
twins under ``/api/…`` (OpenAPI at ``/api/openapi.json``).

- ``app``: middleware (sessions, CSRF, security headers), the permission guard.
- ``pages``, ``pages_audit``, ``pages_jobs``, ``pages_people``: the routes.
- ``reads``: the page reads, logged to the access log like the library's.
- ``views``: records shaped for pages (escaping is the templates', truncation here).
- ``users``, ``auth``, ``config``: accounts, sessions, who may do what.

A thin edge: what a page shows comes from :mod:`replayable.audit`,
:mod:`replayable.diff`, :mod:`replayable.replay` and the CLI's renderers.
"""

from replayable.web.app import create_app
from replayable.web.config import WebConfig
from replayable.web.users import UserDB

__all__ = ["UserDB", "WebConfig", "create_app"]
