"""A store whose writes go to a NATS JetStream stream and whose reads come from its sink.

``open_store("nats://127.0.0.1:4222?stream=replayable&sink=postgresql://…")``:
the writer publishes a batch's records of each run as one message, a frame (see
``_wire``), and ``append`` returns once JetStream acknowledged each of them (stored on as
many replicas as the stream keeps). When the server cannot be reached, or
does not acknowledge within the timeout, ``append`` raises
:class:`StoreUnavailableError` and the writer spools and drains as it does for
any store. ``replayable compactor`` moves the records from the stream into the
sink.

Reads go to the sink. A run not complete there (no end record, or fewer
events than its end counts) is read from the stream as well, so records not
compacted yet are shown, never silently missing; if the stream cannot be read
then, the read fails and says why. Searches and ``verify`` see the sink only:
:meth:`StreamStore.pending_runs` names the runs that still have records in
the stream, for the command line to report.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final
from urllib.parse import parse_qs, unquote, urlsplit

from replayable.errors import ConfigurationError, RunNotFoundError, StoreError
from replayable.events.model import Event, Run, RunEnd, RunStart
from replayable.store.base import EventStore, RunFilter
from replayable.store.lazy import shown_url
from replayable.store.payloads import PayloadTier
from replayable.store.search import EventQuery, SearchPage
from replayable.store.stream._cipher import FrameCipher, SealedMessageError, stream_cipher
from replayable.store.stream._client import StreamClient, StreamConfig
from replayable.store.stream._wire import (
    BLOB_TOKEN,
    decode,
    encode,
    frames,
    message_id,
    records,
    run_filter,
    run_subject,
    token,
)

__all__ = ["Pending", "StreamStore", "parse_stream_url"]

log = logging.getLogger("replayable.store")

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
#: Runs whose subject this store remembers (cleared when full).
_SUBJECT_CACHE: Final = 65_536
#: Most runs with records in the stream a listing looks at.
PENDING_LISTED: Final = 500


def parse_stream_url(url: str) -> tuple[StreamConfig, str, dict[str, str]]:
    """``nats://host:port?stream=NAME&…&sink=URL``: the stream's settings, the sink's URL
    and the other options (``archive``).

    ``sink`` comes last and takes the rest of the URL, its own query included
    (``sink=postgresql://u@h/db?schema=s&tenant=t``); a percent-encoded sink URL
    works as well. Options: ``subject`` (the subjects' prefix, default the stream's
    name), ``replicas`` (1), ``duplicate_window`` in seconds (120), ``timeout`` in
    seconds for one publish or read (5).
    """
    head, sep, sink = url.partition("sink=")
    if not sep:
        raise ConfigurationError(
            f"stream URL {shown_url(url)!r} names no sink; add "
            "&sink=postgresql://… (or sqlite:///…) as its last parameter"
        )
    if "%3A" in sink[:20].upper() and "://" not in sink[:20]:
        sink = unquote(sink)
    parts = urlsplit(head.rstrip("&?"))
    if parts.scheme != "nats" or not parts.hostname:
        raise ConfigurationError(f"stream URL {head!r} must be nats://host:port?stream=NAME&sink=…")
    if parts.path not in ("", "/"):
        raise ConfigurationError(f"stream URL {head!r}: name the stream by ?stream=, not a path")
    query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
    known = {"stream", "subject", "replicas", "duplicate_window", "timeout", "archive"}
    unknown = sorted(set(query) - known)
    if unknown:
        raise ConfigurationError(
            f"stream URL {head!r}: unknown option {unknown[0]!r} "
            f"(known: {', '.join(sorted(known))})"
        )
    stream = query.get("stream", "replayable")
    prefix = query.get("subject", stream)
    for label, value in (("stream", stream), ("subject", prefix)):
        if not _NAME.fullmatch(value):
            raise ConfigurationError(
                f"stream URL {head!r}: {label} {value!r} must be 1-64 letters, digits, '_' or '-'"
            )

    def number(name: str, default: float, low: float) -> float:
        text = query.get(name)
        if text is None:
            return default
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not value >= low:
            raise ConfigurationError(
                f"stream URL {head!r}: {name}={text!r} must be a number of at least {low:g}"
            )
        return value

    replicas = number("replicas", 1.0, 1.0)
    if not replicas.is_integer() or replicas > 5:
        raise ConfigurationError(f"stream URL {head!r}: replicas must be 1 to 5")
    config = StreamConfig(
        server=f"nats://{parts.hostname}:{parts.port or 4222}",
        stream=stream,
        prefix=prefix,
        replicas=int(replicas),
        duplicate_window=number("duplicate_window", 120.0, 1.0),
        timeout=number("timeout", 5.0, 0.05),
    )
    if not sink or "://" not in sink:
        raise ConfigurationError(f"stream URL {head!r}: sink {sink!r} is not a store URL")
    if sink.startswith("nats:"):
        raise ConfigurationError(f"stream URL {head!r}: a stream's sink cannot be a stream")
    extra = {k: v for k, v in query.items() if k == "archive"}
    return config, sink, extra


class Pending:
    """A run's records still in the stream (not compacted into the sink yet)."""

    __slots__ = ("end", "events", "start")

    def __init__(self) -> None:
        self.start: RunStart | None = None
        self.events: dict[int, Event] = {}
        self.end: RunEnd | None = None

    def __bool__(self) -> bool:
        return self.start is not None or bool(self.events) or self.end is not None


class StreamStore(EventStore):
    """Writes to a JetStream stream, reads from the sink (see the module docs)."""

    def __init__(
        self,
        url: str,
        *,
        create: bool = True,
        opener: Callable[[str], EventStore] | None = None,
    ) -> None:
        self.config, self.sink_url, self.options = parse_stream_url(url)
        cfg = self.config
        self.stream = cfg.stream
        self.prefix = cfg.prefix
        self._base = f"{cfg.server}?stream={cfg.stream}" + (
            f"&subject={cfg.prefix}" if cfg.prefix != cfg.stream else ""
        )
        self.url = f"{self._base}&sink={shown_url(self.sink_url)}"
        self._connect = url
        del create  # the sink is made when missing (see ``sink``)
        self._opener = opener
        self._sink: EventStore | None = None
        self._sink_lock = threading.Lock()
        self._sink_tenant = _url_tenant(self.sink_url)
        self._subjects: dict[str, str] = {}
        self.tier = PayloadTier()
        self._cipher = stream_cipher()
        self._cipher_of: Any = None
        self.client = StreamClient(cfg)
        try:
            # Reached at once, so that a server down at start is an outage (the writer
            # spools) and a stream made for other subjects is a clear error.
            self.client.run(self.client.js(), "connecting")
        except BaseException:
            self.client.close()
            raise

    def __repr__(self) -> str:
        return f"<StreamStore {self.url}>"

    def connect_url(self) -> str:
        return self._connect

    # -- the sink ---------------------------------------------------------------------

    @property
    def sink(self) -> EventStore:
        """The store records are compacted into, opened on first use."""
        sink = self._sink
        if sink is None:
            with self._sink_lock:
                if self._sink is None:
                    if self._opener is not None:
                        self._sink = self._opener(self.sink_url)
                    else:
                        from replayable.store import open_store

                        # Made when missing, even for readers: the compactor writes
                        # it, and a run may be read from the stream before it did.
                        self._sink = open_store(self.sink_url)
                sink = self._sink
        return sink

    def __getattr__(self, name: str) -> Any:
        # What a particular sink offers beyond the contract (``query`` on PostgreSQL).
        if name.startswith("_") or name in ("sink", "client", "config"):
            raise AttributeError(name)
        return getattr(self.sink, name)

    # -- writing --------------------------------------------------------------------

    def _subject(self, run_id: str) -> str:
        subject = self._subjects.get(run_id)
        if subject is None:
            start = self._start_of(run_id)
            tenant = (start.tenant if start else None) or self._sink_tenant
            subject = run_subject(self.prefix, tenant, start.workflow if start else None, run_id)
            self._remember(run_id, subject)
        return subject

    def _start_of(self, run_id: str) -> RunStart | None:
        """The start of a run another process began (its subject names its workflow)."""
        try:
            for _, body in self.client.run(
                self.client.read(run_filter(self.prefix, run_id), limit=1), "reading a run"
            ):
                for kind, record in records(body, self.cipher):
                    if kind == "s":
                        return record  # type: ignore[no-any-return]
        except (StoreError, ConfigurationError):
            pass
        try:
            return self.sink.get_run(run_id).start
        except Exception:
            return None

    def _remember(self, run_id: str, subject: str) -> None:
        if len(self._subjects) >= _SUBJECT_CACHE:
            self._subjects.clear()
        self._subjects[run_id] = subject

    def append(
        self,
        starts: Sequence[RunStart] = (),
        events: Sequence[Event] = (),
        ends: Sequence[RunEnd] = (),
        *,
        durable: bool = False,
    ) -> None:
        """Publish the records, one frame per run (a run's records over the size a
        message may have in several), and return once JetStream acknowledged them all."""
        if not (starts or events or ends):
            return
        runs: dict[str, tuple[list[RunStart], list[Event], list[RunEnd]]] = {}
        for s in starts:
            subject = run_subject(self.prefix, s.tenant or self._sink_tenant, s.workflow, s.run_id)
            self._remember(s.run_id, subject)
            runs.setdefault(s.run_id, ([], [], []))[0].append(s)
        # Consecutive events of one run are taken as a slice: a writer's batch holds
        # long stretches of a run.
        i, n = 0, len(events)
        while i < n:
            run_id = events[i].run_id
            j = i + 1
            while j < n and events[j].run_id == run_id:
                j += 1
            runs.setdefault(run_id, ([], [], []))[1].extend(events[i:j])
            i = j
        for x in ends:
            runs.setdefault(x.run_id, ([], [], []))[2].append(x)
        # Room left in a message for its headers (message id, expected stream).
        limit = self.client.max_payload - 1024
        messages: list[tuple[str, str, bytes]] = []
        for run_id, (rs, re_, rx) in runs.items():
            subject = self._subjects.get(run_id) or self._subject(run_id)
            # Message ids travel in a header line: a run id is taken as a subject token
            # is (an id holding a line break could otherwise write frames of its own).
            for mid, body in frames(token(run_id), rs, re_, rx, limit):
                messages.append((subject, mid, self._sealed(body)))
        self.client.run(
            self.client.publish(messages),
            f"publishing {len(starts) + len(events) + len(ends)} record(s)",
        )
        for x in ends:
            self._subjects.pop(x.run_id, None)

    @property
    def cipher(self) -> FrameCipher | None:
        """Seals what this store publishes and opens what it reads (see :mod:`._cipher`):
        with the data keys given to :func:`~replayable.store.crypto.enable_encryption`
        (the writer process's store, for the process that opened it), else this
        process's."""
        keys = self.__dict__.get("data_keys")
        if keys is not None and keys.wrapper is not self._cipher_of:
            self._cipher_of = keys.wrapper
            self._cipher = None if keys.wrapper is None else FrameCipher(keys.wrapper)
        return self._cipher

    def _sealed(self, body: bytes) -> bytes:
        cipher = self.cipher
        return cipher.seal(body) if cipher is not None and cipher.seals else body

    def put_blob(self, digest: str, data: bytes) -> None:
        subject = f"{self.prefix}.{BLOB_TOKEN}.{token(digest)}"
        item = (digest, data)
        self.client.run(
            self.client.publish(
                [(subject, message_id("b", item), self._sealed(encode("b", item)))]
            ),
            "publishing a blob",
        )

    def get_blob(self, digest: str) -> bytes | None:
        found = self.sink.get_blob(digest)
        if found is not None:
            return found
        subject = f"{self.prefix}.{BLOB_TOKEN}.{token(digest)}"
        for _, body in self.client.run(self.client.read(subject, limit=1), "reading a blob"):
            kind, record = decode(body, self.cipher)
            if kind == "b" and record[0] == digest:
                return record[1]  # type: ignore[no-any-return]
        return None

    # -- what is still in the stream ------------------------------------------------------

    def pending(self, run_id: str) -> Pending:
        """The run's records still in the stream; a record that does not decode is
        reported (logged) and left out, as a reader does with a bad row."""
        found = Pending()
        subjects = run_filter(self.prefix, run_id)
        try:
            waiting = sum(
                self.client.run(
                    self.client.subject_counts(subjects), "reading a run's subjects"
                ).values()
            )
            if not waiting:
                return found
            # One round trip per record: a long backlog of one run takes its time.
            messages = self.client.run(
                self.client.read(subjects),
                "reading a run's records",
                timeout=self.config.timeout + waiting * 0.002,
            )
        except StoreError as exc:
            raise type(exc)(
                f"run {run_id} is not complete in {shown_url(self.sink_url)} and its records "
                f"still in stream {self.stream} cannot be read: {exc}"
            ) from exc
        for seq, body in messages:
            try:
                held = records(body, self.cipher)
            except SealedMessageError as exc:
                # Not a bad record: the run's records are there, and this process cannot
                # open them. Showing the run without them would show part of it.
                raise SealedMessageError(
                    f"run {run_id} is not complete in {shown_url(self.sink_url)} and its "
                    f"records still in stream {self.stream} cannot be opened here: {exc}"
                ) from exc
            except ConfigurationError as exc:
                log.warning("replayable: stream %s message %d: %s", self.stream, seq, exc)
                continue
            for kind, record in held:
                if getattr(record, "run_id", None) != run_id:
                    continue
                if kind == "s":
                    found.start = record
                elif kind == "e":
                    found.events.setdefault(record.seq, record)
                elif kind == "x":
                    found.end = record
        return found

    def pending_runs(self, limit: int = PENDING_LISTED) -> dict[str, int]:
        """Runs with records still in the stream, and how many messages each holds (at
        most ``limit`` runs; a frame is one message of many records)."""
        counts = self.client.run(
            self.client.subject_counts(f"{self.prefix}.*.*.*"), "reading the stream's subjects"
        )
        out: dict[str, int] = {}
        for subject, n in counts.items():
            parts = subject.split(".")
            if len(parts) == 4 and parts[1] != BLOB_TOKEN:
                out[parts[3]] = out.get(parts[3], 0) + n
                if len(out) >= limit:
                    break
        return out

    # -- reading ------------------------------------------------------------------------

    def _sink_run(self, run_id: str) -> Run | None:
        try:
            return self.sink.get_run(run_id)
        except RunNotFoundError:
            return None

    def get_run(self, run_id: str) -> Run:
        run = self._sink_run(run_id)
        if run is not None and run.end is not None:
            return run
        # The stream first, then the sink again: a record compacted in between is
        # found in one or the other.
        pending = self.pending(run_id)
        run = self._sink_run(run_id)
        if run is None:
            if pending.start is None:
                raise RunNotFoundError(f"no run {run_id} in {self.url}")
            return Run(start=pending.start, end=pending.end)
        if run.end is None and pending.end is not None:
            return Run(start=run.start, end=pending.end, problems=run.problems)
        return run

    def events(self, run_id: str) -> list[Event]:
        stored = self.sink.events(run_id)
        run = self._sink_run(run_id)
        if run is not None and run.end is not None and len(stored) >= run.end.event_count:
            return stored
        pending = self.pending(run_id)
        if not pending.events:
            return stored
        stored = self.sink.events(run_id)
        have = {e.seq for e in stored}
        extra = [e for seq, e in pending.events.items() if seq not in have]
        return sorted([*stored, *extra], key=lambda e: e.seq) if extra else stored

    def _pending_only(self, filter: RunFilter) -> list[Run]:
        """Runs whose start is in the stream only, passing ``filter``."""
        try:
            waiting = self.pending_runs()
        except StoreError as exc:
            log.warning("replayable: %s; runs not compacted yet are not listed", exc)
            return []
        runs: list[Run] = []
        for run_id in waiting:
            if self._sink_run(run_id) is not None:
                continue
            pending = self.pending(run_id)
            if pending.start is not None:
                run = Run(start=pending.start, end=pending.end)
                if filter.matches(run):
                    runs.append(run)
        return runs

    def list_runs(self, filter: RunFilter | None = None) -> list[Run]:
        f = filter or RunFilter()
        runs = self.sink.list_runs(f)
        extra = self._pending_only(f)
        if not extra:
            return runs
        merged = sorted([*runs, *extra], key=lambda r: r.start.started_at, reverse=True)
        return merged if f.limit is None else merged[: f.limit]

    def count_runs(self, filter: RunFilter | None = None) -> int:
        f = filter or RunFilter()
        return self.sink.count_runs(f) + len(self._pending_only(f))

    def find_run_ids(self, prefix: str, limit: int = 6) -> list[str]:
        found = self.sink.find_run_ids(prefix, limit)
        if len(found) < limit:
            try:
                waiting = self.pending_runs()
            except StoreError:
                waiting = {}
            for run_id in sorted(waiting):
                if run_id.startswith(prefix) and run_id not in found:
                    found.append(run_id)
        return found[:limit]

    def iter_run_ids(self) -> Iterator[str]:
        return self.sink.iter_run_ids()

    def search(self, query: EventQuery) -> SearchPage:
        return self.sink.search(query)

    # -- what verify and the anchor need: the sink's -----------------------------------

    def store_id(self) -> str:
        return self.sink.store_id()

    def row_tenant(self, start: RunStart) -> str | None:
        return self.sink.row_tenant(start)

    def sees_tenant(self, tenant: str | None) -> bool:
        return self.sink.sees_tenant(tenant)

    def tag_problem(self, run: Run) -> str | None:
        return self.sink.tag_problem(run)

    def event_run_ids(self) -> set[str]:
        return self.sink.event_run_ids()

    def interrupt(self) -> None:
        self.client.drop()
        if self._sink is not None:
            self._sink.interrupt()

    def close(self) -> None:
        try:
            self.run_close_hooks()
        finally:
            self.client.close()
            if self._sink is not None:
                self._sink.close()


def _url_tenant(url: str) -> str | None:
    query = urlsplit(url).query
    values = parse_qs(query).get("tenant")
    return values[-1] if values and values[-1] else None


def _delegate(name: str) -> Any:
    def method(self: StreamStore, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.sink, name)(*args, **kwargs)

    method.__name__ = name
    method.__doc__ = f"The sink's ``{name}``."
    return method


# Everything else of the contract (audit records, payload tier, data keys, the
# archive index) is the sink's.
for _name in sorted(EventStore.__abstractmethods__):
    if _name not in StreamStore.__dict__:
        setattr(StreamStore, _name, _delegate(_name))
for _name in (
    "archived_runs",
    "archived_ids",
    "archive_plan",
    "archive_pending",
    "archive_commit",
    "stored_rows",
    "run_spaces",
    "drop_archived_payloads",
    "drop_archived_blobs",
    "hot_events",
    "dropped_ids",
    "archive_index",
    "record_purge",
    "purged_digests",
    "run_summaries",
    "login_name",
    "annotation_head",
):
    setattr(StreamStore, _name, _delegate(_name))
StreamStore.__abstractmethods__ = frozenset()
