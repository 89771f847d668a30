"""Fixture files: a run tree in one self-contained, schema-versioned file.

A fixture (``incident.replay``) holds a run, its child runs, all their
events and the blobs they name (the environment snapshot), so that it
replays with no store: :func:`load_fixture` reads it into a memory store.
The file is JSON lines, readable and diffable in a repository::

    {"format": "replayable-fixture", "version": 1, "run_schema": 1, "event_schema": 2,
     "root": "…", "runs": 2, "events": 31, "sanitized": {…manifest…} | null, "source": {…}}
    {"record": "run", "start": {…}, "end": {…} | null}
    {"record": "event", "run_id": "…", "seq": 1, …}
    {"record": "blob", "digest": "…", "data": "<base64>"}

``version`` is this layout's version; ``run_schema`` and ``event_schema`` the
newest run-record and event-record schema the file may hold
(:data:`~replayable.events.model.SEALED_SCHEMA_VERSION`,
:data:`~replayable.events.model.SEALED_EVENT_VERSION`; each record names its
own). A newer or unknown one is refused with a message naming it; an older
layout is upgraded by the explicit functions in :data:`UPCASTERS`, one version
at a time, never by guessing; older records are read as they are (the chain
checks each event by its own schema version).

A sanitized fixture (see :mod:`replayable.testing.sanitize`) has its requests
re-fingerprinted and its chain re-sealed over the sanitized content, in the
unkeyed format: its chain shows accidental edits of the file; that the
content came from a keyed production run is what the header's ``source``
records (the run ids, and the chain as it was verified before sanitizing).
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import msgspec
import orjson

from replayable.errors import FixtureError
from replayable.events.canonical import event_hash, fingerprint, genesis_hash, run_seal
from replayable.events.chain import parse_chain
from replayable.events.model import (
    SEALED_EVENT_VERSION,
    SEALED_SCHEMA_VERSION,
    Event,
    Run,
    RunEnd,
    RunStart,
)
from replayable.store.base import EventStore
from replayable.store.integrity import Integrity
from replayable.store.memory import MemoryStore
from replayable.store.verify import ChainReport, verify_run
from replayable.testing.sanitize import Manifest, Sanitizer, SanitizeRules

__all__ = [
    "FIXTURE_FORMAT",
    "FIXTURE_VERSION",
    "UPCASTERS",
    "Fixture",
    "collect_fixture",
    "export_fixture",
    "import_fixture",
    "load_fixture",
    "read_fixture",
    "sanitize_fixture",
    "write_fixture",
]

FIXTURE_FORMAT: Final = "replayable-fixture"
#: The layout's version. Bump it with an upcaster from the previous one.
FIXTURE_VERSION: Final = 1

#: ``UPCASTERS[n]`` turns a version-``n`` header and its records into version ``n + 1``.
Upcaster = Callable[[dict[str, Any], list[dict[str, Any]]], tuple[dict[str, Any], list[Any]]]
UPCASTERS: dict[int, Upcaster] = {}

_STRUCT_ENCODER: Final = msgspec.json.Encoder()


@dataclass
class Fixture:
    """A run tree as a fixture holds it: records, blobs and the header."""

    root: str
    starts: list[RunStart]
    ends: list[RunEnd]
    events: list[Event]
    blobs: dict[str, bytes] = field(default_factory=dict)
    manifest: dict[str, Any] | None = None
    source: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None

    @property
    def run_ids(self) -> list[str]:
        return [s.run_id for s in self.starts]

    def header(self) -> dict[str, Any]:
        from replayable import __version__

        return {
            "format": FIXTURE_FORMAT,
            "version": FIXTURE_VERSION,
            "run_schema": max((s.schema_version for s in self.starts), default=1),
            "event_schema": max((e.schema_version for e in self.events), default=1),
            "written_by": f"replayable {__version__}",
            "root": self.root,
            "runs": len(self.starts),
            "events": len(self.events),
            "sanitized": self.manifest,
            "source": self.source,
        }

    def store(self) -> MemoryStore:
        """A new memory store holding this fixture's runs (what a replay reads)."""
        store = MemoryStore("memory://fixture")
        for digest, data in self.blobs.items():
            store.put_blob(digest, data)
        store.append(self.starts, self.events, self.ends)
        return store


# -- collecting from a store ----------------------------------------------------------


def collect_fixture(store: EventStore, run_id: str, *, tree: bool = False) -> Fixture:
    """The run named by ``run_id`` (an id or prefix) and every run below it, read from
    ``store``; with ``tree``, the whole tree from its root run.

    Refuses a run with an unreadable record or a chain that does not verify: a
    fixture is evidence, and an altered run is not one.
    """
    run = store.run(run_id)
    top = store.get_run(run.start.root_run_id) if tree else run
    runs: list[Run] = []
    todo = [top]
    while todo:
        current = todo.pop(0)
        runs.append(current)
        todo.extend(store.children(current.run_id))
    events: list[Event] = []
    blobs: dict[str, bytes] = {}
    integrity = Integrity.from_env()
    checked: dict[str, str] = {}
    for r in runs:
        if r.problems:
            raise FixtureError(f"run {r.run_id} has unreadable records: {r.problems[0]}")
        evs = store.events(r.run_id)
        bad = next((e for e in evs if e.problems), None)
        if bad is not None:
            raise FixtureError(
                f"run {r.run_id} event {bad.seq} is unreadable ({bad.problems[0]}); "
                "an unreadable record cannot go into a fixture"
            )
        report = verify_run(store, r.run_id, integrity=integrity, anchor=None, allow_unkeyed=True)
        if report.status in ("altered", "gapped", "truncated", "missing", "orphaned"):
            raise FixtureError(f"cannot export: {report.message}")
        checked[r.run_id] = _chain_summary(r, report)
        events += evs
        digest = r.start.env_hash
        if digest and digest not in blobs:
            data = store.get_blob(digest)
            if data is None:
                raise FixtureError(f"run {r.run_id}: its environment snapshot is missing")
            blobs[digest] = data
    return Fixture(
        root=top.run_id,
        starts=[r.start for r in runs],
        ends=[r.end for r in runs if r.end is not None],
        events=events,
        blobs=blobs,
        # The store's kind, not its URL: a path or a host name has no place in a test asset.
        source={"store": store.url.partition(":")[0], "chains": checked},
    )


def _chain_summary(run: Run, report: ChainReport) -> str:
    fmt = parse_chain(run.start.chain)
    how = f"keyed v2, key {fmt.key_id}" if fmt.keyed else "unkeyed v1"
    return f"{report.status} ({how}, {report.events_checked} events)"


# -- sanitizing -------------------------------------------------------------------------


def sanitize_fixture(fx: Fixture, rules: SanitizeRules) -> Fixture:
    """``fx`` with personal data replaced, requests re-fingerprinted and chains re-sealed.

    The manifest (``fixture.manifest``) says which rule replaced how many values
    where; the values themselves go nowhere.
    """
    san = Sanitizer(rules)
    tool_of = {(e.run_id, e.seq): e.name for e in fx.events}
    for s in fx.starts:
        san.scan("input", orjson.loads(s.input))
        san.scan("metadata", s.metadata)
    for end in fx.ends:
        for part, text in (("output", end.output), ("error", end.error)):
            if text is not None:
                san.scan(part, orjson.loads(text))
    for e in fx.events:
        tool = tool_of[(e.run_id, e.seq)]
        san.scan("request", orjson.loads(e.request), tool)
        if e.response is not None:
            san.scan("response", orjson.loads(e.response), tool)
        if e.error is not None:
            san.scan("error", orjson.loads(e.error), tool)
        san.scan("metadata", e.metadata, tool)
    for data in fx.blobs.values():
        san.scan("blob", _blob_tree(data))

    blobs: dict[str, bytes] = {}
    renamed: dict[str, str] = {}
    for digest, data in fx.blobs.items():
        tree, changed = san.rewrite("environment snapshot", _blob_tree(data))
        new = orjson.dumps(tree, option=orjson.OPT_SORT_KEYS) if changed else data
        new_digest = hashlib.sha256(new).hexdigest() if changed else digest
        renamed[digest] = new_digest
        blobs[new_digest] = new

    starts: dict[str, RunStart] = {}
    for s in fx.starts:
        where = f"run {s.run_id[:8]}"
        start = msgspec.structs.replace(
            s,
            input=_text(san, f"{where} input", s.input),
            metadata=san.rewrite(f"{where} metadata", s.metadata)[0],
            env_hash=renamed.get(s.env_hash, s.env_hash) if s.env_hash else s.env_hash,
            chain=None,
        )
        starts[s.run_id] = start
    by_run: dict[str, list[Event]] = {}
    for e in fx.events:
        where = f"run {e.run_id[:8]} event {e.seq} ({e.kind} {e.name})"
        request = _text(san, f"{where} request", e.request, sort=True)
        fp = (
            e.fingerprint if request == e.request else fingerprint(e.kind, e.name, request.encode())
        )
        response = None if e.response is None else _text(san, f"{where} response", e.response)
        sanitized = msgspec.structs.replace(
            e,
            request=request,
            fingerprint=fp,
            response=response,
            error=None if e.error is None else _text(san, f"{where} error", e.error),
            metadata=san.rewrite(f"{where} metadata", e.metadata)[0],
            # A digest kept beside a payload is the old text's: the chain is re-sealed
            # over the new text's.
            request_digest=e.request_digest if request == e.request else None,
            response_digest=e.response_digest if response == e.response else None,
        )
        by_run.setdefault(e.run_id, []).append(sanitized)
    events: list[Event] = []
    heads: dict[str, str] = {}
    for run_id, evs in by_run.items():
        prev = genesis_hash(run_id)
        for e in sorted(evs, key=lambda ev: ev.chain_index):
            linked = msgspec.structs.replace(e, prev_hash=prev, hash="")
            linked = msgspec.structs.replace(linked, hash=event_hash(linked))
            prev = linked.hash
            events.append(linked)
        heads[run_id] = prev
    ends: list[RunEnd] = []
    for end in fx.ends:
        where = f"run {end.run_id[:8]}"
        output = None if end.output is None else _text(san, f"{where} output", end.output)
        error = None if end.error is None else _text(san, f"{where} error", end.error)
        start = starts[end.run_id]
        head = heads.get(end.run_id, genesis_hash(end.run_id))
        seal = run_seal(
            head,
            start,
            end.status,
            output,
            error,
            end.ended_at,
            end.event_count,
            version=end.schema_version,
        )
        ends.append(
            msgspec.structs.replace(end, output=output, error=error, last_hash=seal, signature=None)
        )
    events.sort(key=lambda ev: (ev.run_id, ev.seq))
    return Fixture(
        root=fx.root,
        starts=list(starts.values()),
        ends=ends,
        events=events,
        blobs=blobs,
        manifest=_manifest(san.manifest, rules),
        source={**fx.source, "resealed": "unkeyed v1, over the sanitized content"},
    )


def _manifest(m: Manifest, rules: SanitizeRules) -> dict[str, Any]:
    return {
        "rules": {
            "detectors": list(rules.detectors),
            "names": len(rules.names),
            "regexes": [name for name, _ in rules.regexes],
            "paths": [{"name": p.name, "path": p.path, "tool": p.tool} for p in rules.paths],
            "kept": len(rules.keep),
        },
        "replaced": m.total,
        "by_rule": m.to_json(),
    }


def _blob_tree(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


def _text(san: Sanitizer, where: str, text: str, *, sort: bool = False) -> str:
    """A stored JSON text with personal values replaced; the very text when none were."""
    tree, changed = san.rewrite(where, orjson.loads(text), text)
    if not changed:
        return text
    option = orjson.OPT_SORT_KEYS if sort else 0
    return orjson.dumps(tree, option=option).decode()


# -- the file ---------------------------------------------------------------------------


def write_fixture(fx: Fixture, path: str | Path) -> Path:
    """Write ``fx`` to ``path`` (created 0600) and return the path."""
    from replayable._files import write_private

    out = bytearray(orjson.dumps(fx.header()))
    out += b"\n"
    ends = {e.run_id: e for e in fx.ends}
    for s in fx.starts:
        end = ends.get(s.run_id)
        out += b'{"record":"run","start":'
        out += _STRUCT_ENCODER.encode(s)
        out += b',"end":'
        out += b"null" if end is None else _STRUCT_ENCODER.encode(end)
        out += b"}\n"
    for e in fx.events:
        body = _STRUCT_ENCODER.encode(e)
        out += b'{"record":"event",'
        out += body[1:]
        out += b"\n"
    for digest, data in fx.blobs.items():
        out += orjson.dumps(
            {"record": "blob", "digest": digest, "data": base64.b64encode(data).decode()}
        )
        out += b"\n"
    target = Path(path)
    write_private(target, bytes(out))
    fx.path = target
    return target


def read_fixture(path: str | Path) -> Fixture:
    """Read a fixture file; refuses another format, a newer version, or a bad record,
    naming the file and the line."""
    target = Path(path)
    try:
        data = target.read_bytes()
    except OSError as exc:
        raise FixtureError(f"cannot read fixture {target}: {exc.strerror or exc}") from None
    lines = data.splitlines()
    if not lines:
        raise FixtureError(f"{target} is empty, not a replayable fixture")
    try:
        header = orjson.loads(lines[0])
    except orjson.JSONDecodeError:
        header = None
    if not isinstance(header, dict) or header.get("format") != FIXTURE_FORMAT:
        raise FixtureError(
            f"{target} is not a replayable fixture (its first line has no "
            f'"format": "{FIXTURE_FORMAT}")'
        )
    records: list[Any] = []
    for n, line in enumerate(lines[1:], start=2):
        try:
            records.append(orjson.loads(line))
        except orjson.JSONDecodeError as exc:
            raise FixtureError(f"{target} line {n}: not JSON ({exc})") from None
    header, records = _upcast(target, header, records)
    return _build(target, header, records)


def _upcast(
    target: Path, header: dict[str, Any], records: list[Any]
) -> tuple[dict[str, Any], list[Any]]:
    version = header.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise FixtureError(f"{target}: fixture version {version!r} is not a version number")
    if version > FIXTURE_VERSION:
        raise FixtureError(
            f"{target} is fixture version {version}, written by "
            f"{header.get('written_by', 'a newer replayable')}; this replayable reads versions "
            f"up to {FIXTURE_VERSION}: upgrade replayable to use it"
        )
    while version < FIXTURE_VERSION:
        step = UPCASTERS.get(version)
        if step is None:
            raise FixtureError(
                f"{target}: fixture version {version} has no upgrade to {version + 1} "
                "in this replayable"
            )
        header, records = step(dict(header), list(records))
        version += 1
        header["version"] = version
    # Files of layout 1 written before run records had a schema of their own name one.
    for key, newest in (
        ("run_schema", SEALED_SCHEMA_VERSION),
        ("event_schema", SEALED_EVENT_VERSION),
    ):
        schema = header.get(key, 1)
        if not isinstance(schema, int) or isinstance(schema, bool) or schema < 1:
            raise FixtureError(f"{target}: {key} {schema!r} is not a version number")
        if schema > newest:
            raise FixtureError(
                f"{target}: its {key.split('_')[0]} records are schema version {schema}; this "
                f"replayable reads up to {newest}: upgrade replayable to use it"
            )
    return header, records


def _build(target: Path, header: dict[str, Any], records: list[Any]) -> Fixture:
    starts: list[RunStart] = []
    ends: list[RunEnd] = []
    events: list[Event] = []
    blobs: dict[str, bytes] = {}
    for n, rec in enumerate(records, start=2):
        kind = rec.get("record") if isinstance(rec, dict) else None
        try:
            if kind == "event":
                body = {k: v for k, v in rec.items() if k not in ("record", "problems")}
                event = msgspec.convert(body, Event)
                if event.schema_version > SEALED_EVENT_VERSION:
                    raise FixtureError(
                        f"{target} line {n}: event schema version {event.schema_version}; "
                        f"this replayable reads up to {SEALED_EVENT_VERSION}"
                    )
                events.append(event)
            elif kind == "run":
                start = msgspec.convert(rec["start"], RunStart)
                if start.schema_version > SEALED_SCHEMA_VERSION:
                    raise FixtureError(
                        f"{target} line {n}: run schema version {start.schema_version}; "
                        f"this replayable reads up to {SEALED_SCHEMA_VERSION}"
                    )
                starts.append(start)
                if rec.get("end") is not None:
                    ends.append(msgspec.convert(rec["end"], RunEnd))
            elif kind == "blob":
                raw = base64.b64decode(rec["data"], validate=True)
                if hashlib.sha256(raw).hexdigest() != rec["digest"]:
                    raise FixtureError(f"{target} line {n}: blob does not match its digest")
                blobs[rec["digest"]] = raw
            else:
                raise FixtureError(f"{target} line {n}: unknown record {kind!r}")
        except (msgspec.ValidationError, KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, FixtureError):
                raise
            raise FixtureError(f"{target} line {n}: bad {kind} record: {exc}") from None
    root = header.get("root")
    if root not in {s.run_id for s in starts}:
        raise FixtureError(f"{target}: the header names root run {root!r}, which it lacks")
    return Fixture(
        root=str(root),
        starts=starts,
        ends=ends,
        events=events,
        blobs=blobs,
        manifest=header.get("sanitized"),
        source=header.get("source") or {},
        path=target,
    )


# -- loading ----------------------------------------------------------------------------


def load_fixture(path: str | Path) -> tuple[Fixture, MemoryStore]:
    """Read a fixture and check its chains; returns it with a memory store holding it."""
    fx = read_fixture(path)
    store = fx.store()
    _check_chains(fx, store)
    return fx, store


def _check_chains(fx: Fixture, store: EventStore) -> None:
    plain = Integrity()
    env: Integrity | None = None
    for s in fx.starts:
        if parse_chain(s.chain).keyed:
            env = env or Integrity.from_env()
            fmt = parse_chain(s.chain)
            if fmt.key_id is None or env.key(fmt.key_id) is None:
                continue  # a keyed fixture is checked where its key is configured
            report = verify_run(store, s.run_id, integrity=env, anchor=None)
        else:
            report = verify_run(store, s.run_id, integrity=plain, anchor=None)
        if report.status not in ("intact", "unsealed"):
            raise FixtureError(f"fixture {fx.path}: {report.message}")


def export_fixture(
    store: EventStore,
    run_id: str,
    path: str | Path,
    *,
    tree: bool = False,
    sanitize: SanitizeRules | None = None,
) -> Fixture:
    """Collect, optionally sanitize, and write a fixture; returns what was written."""
    fx = collect_fixture(store, run_id, tree=tree)
    if sanitize is not None:
        fx = sanitize_fixture(fx, sanitize)
    write_fixture(fx, path)
    return fx


def import_fixture(path: str | Path, store: EventStore) -> Fixture:
    """Load a fixture's runs into ``store``. Runs already there identically are skipped;
    a run id the store holds with other content is refused."""
    fx, _ = load_fixture(path)
    present: set[str] = set()
    for s in fx.starts:
        try:
            existing = store.get_run(s.run_id)
        except LookupError:
            continue
        if existing.start != s:
            raise FixtureError(
                f"run {s.run_id} is already in {store.url} with other content; "
                "a fixture never overwrites a run"
            )
        present.add(s.run_id)
    for digest, data in fx.blobs.items():
        store.put_blob(digest, data)
    store.append(
        [s for s in fx.starts if s.run_id not in present],
        [e for e in fx.events if e.run_id not in present],
        [e for e in fx.ends if e.run_id not in present],
        durable=True,
    )
    return fx
