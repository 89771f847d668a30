"""Who is acting: the application user, their role, and the login the store sees.

Every audit read and write names an :class:`Actor`. The CLI builds one from
``--as``/``--role`` or ``$REPLAYABLE_USER``/``$REPLAYABLE_ROLE``; the web app
builds one per request from its session. Roles decide in the library what an
actor may do (:func:`require`); on PostgreSQL the database login's grants
decide again, and a login can never do more than its grants allow.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from replayable.errors import AccessDeniedError, ConfigurationError
from replayable.events.audit import CHANNELS, ROLES

if TYPE_CHECKING:
    from replayable.store.base import EventStore

__all__ = ["PERMISSIONS", "Actor", "check_channel", "require"]

#: What each application role may do with audit records.
PERMISSIONS: Final[dict[str, frozenset[str]]] = {
    "engineer": frozenset({"read", "replay"}),
    "analyst": frozenset({"read", "annotate"}),
    "auditor": frozenset({"read", "read_access_log"}),
    "admin": frozenset({"read", "replay", "annotate", "read_access_log", "scan"}),
}

#: The role of a local user who named none: the owner of an embedded store.
DEFAULT_ROLE: Final = "admin"


@dataclass(frozen=True, slots=True)
class Actor:
    """An application ``user`` acting in ``role`` through the store login ``login``."""

    user: str
    role: str
    login: str

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ConfigurationError(
                f"role {self.role!r} is not one of {', '.join(ROLES)} (--role / $REPLAYABLE_ROLE)"
            )
        if not self.user.strip():
            raise ConfigurationError("the acting user is empty (--as / $REPLAYABLE_USER)")

    @classmethod
    def current(
        cls, store: EventStore, *, user: str | None = None, role: str | None = None
    ) -> Actor:
        """The actor for this process: ``user``/``role`` if given, else
        ``$REPLAYABLE_USER``/``$REPLAYABLE_ROLE``, else the login and ``admin``."""
        login = store.login_name()
        return cls(
            user=user or os.environ.get("REPLAYABLE_USER") or login,
            role=(role or os.environ.get("REPLAYABLE_ROLE") or DEFAULT_ROLE).strip().lower(),
            login=login,
        )

    def may(self, action: str) -> bool:
        """Whether this actor's role allows ``action`` (``read``, ``annotate``, …)."""
        return action in PERMISSIONS.get(self.role, frozenset())


def require(actor: Actor, action: str, what: str) -> None:
    """Raise :class:`AccessDeniedError` unless ``actor``'s role allows ``action``."""
    if not actor.may(action):
        allowed = sorted(r for r, acts in PERMISSIONS.items() if action in acts)
        raise AccessDeniedError(
            f"{actor.user} (role {actor.role}) may not {what}; "
            f"that needs the role {' or '.join(allowed)}"
        )


def check_channel(channel: str) -> str:
    """``channel`` if it is one of :data:`~replayable.events.audit.CHANNELS`."""
    if channel not in CHANNELS:
        raise ConfigurationError(f"channel {channel!r} is not one of {', '.join(CHANNELS)}")
    return channel
