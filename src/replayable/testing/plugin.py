"""The pytest plugin: a recorded incident as a regression test.

Registered through the ``pytest11`` entry point, so installing replayable is
enough. A test marked with a fixture file replays it against the current code
and fails with the divergence message when it diverges::

    @pytest.mark.replayable("incidents/gb-sct.replay")
    def test_gb_sct(replayable_run):
        assert replayable_run.result.status == "identical"
        fixed = replayable_run.fork(replayable_run.step("query_compliance_rules"))
        replayable_run.assert_policies(no_low_risk_without_rules, run_id=fixed.new_run_id)

The path is taken from the test file's folder. Marker options: ``record`` (a
callable that runs the workflow live, for recording the fixture), ``sanitize``
(``"default"``, a rules file or :class:`SanitizeRules`; what a recording is
sanitized with, ``"default"`` unless ``None``), ``policies`` (judged on the
replay: a violation fails the test), ``allow_network``.

``--replayable-record`` chooses, as pytest-recording and vcrpy do, when a
fixture is recorded: ``none`` (never: a missing fixture fails the test; the
default when ``$CI`` is set), ``once`` (record a missing fixture, replay an
existing one; the default otherwise), ``new`` (also re-record a fixture whose
replay diverges) and ``rewrite`` (record every time). A replay reaches no
network: a connection made outside every boundary stops it as ``unrecorded_io``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import pytest

if TYPE_CHECKING:
    from replayable.audit.policies import Policy, PolicyResult
    from replayable.replay.session import ReplayResult
    from replayable.store.memory import MemoryStore
    from replayable.testing.fixture import Fixture
    from replayable.testing.sanitize import SanitizeRules

__all__ = ["ReplayableRun", "replayable_run"]

MODES: Final = ("none", "once", "new", "rewrite")
_STATE: Final = pytest.StashKey["ReplayableRun"]()
_RECORDED: Final = pytest.StashKey[list[str]]()


def default_mode(environ: dict[str, str] | None = None) -> str:
    """``none`` under CI (``$CI`` set to anything but empty, 0 or false), else ``once``."""
    ci = (environ if environ is not None else os.environ).get("CI", "").strip().lower()
    return "none" if ci not in ("", "0", "false", "no") else "once"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("replayable", "replayable fixtures")
    group.addoption(
        "--replayable-record",
        choices=MODES,
        default=None,
        help="When @pytest.mark.replayable fixtures are recorded: none (never; the default "
        "under CI), once (when missing; the default), new (also when a replay diverges), "
        "rewrite (always).",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "replayable(path, record=None, sanitize='default', policies=(), allow_network=False): "
        "replay a replayable fixture file against the current code; fail on divergence",
    )
    config.stash[_RECORDED] = []


@dataclass
class ReplayableRun:
    """A fixture, loaded into its own memory store, and its replay against the current code."""

    path: Path
    fixture: Fixture
    store: MemoryStore
    result: ReplayResult
    mode: str
    recorded: bool = False
    policies: tuple[Policy, ...] = field(default_factory=tuple)

    @property
    def run_id(self) -> str:
        return self.fixture.root

    def step(self, name: str, *, nth: int = 1) -> int:
        """The seq of the ``nth`` call named ``name`` in the recorded run (a fork point)."""
        calls = [e.seq for e in self.store.events(self.run_id) if e.name == name]
        if len(calls) < nth:
            raise LookupError(
                f"the fixture's run calls {name!r} {len(calls)} time(s), not {nth}; it has "
                + ", ".join(sorted({e.name for e in self.store.events(self.run_id)}))
            )
        return calls[nth - 1]

    def replay(self, **options: Any) -> ReplayResult:
        """``replayable.replay`` of the fixture's run, with any of its options."""
        from replayable.replay.api import replay

        return replay(self.run_id, store=self.store, **options)

    def fork(self, at: int, **options: Any) -> ReplayResult:
        """A fork at step ``at``: the tape before it, the current code live from it (side
        effects guarded); the fork is a new run in this store (``result.new_run_id``)."""
        options.setdefault("on_side_effect", "recorded")
        return self.replay(fork_at=at, **options)

    def counterfactual(self, live: Iterable[str], **options: Any) -> ReplayResult:
        """The named kinds or tools live, everything else frozen."""
        return self.replay(live=set(live), **options)

    def check(self, *policies: Policy, run_id: str | None = None) -> list[PolicyResult]:
        """The policies' verdicts on the recorded run, or on ``run_id`` (a fork's run)."""
        from replayable.audit.policies import check_run

        return check_run(self.store, run_id or self.run_id, policies or self.policies)

    def assert_policies(self, *policies: Policy, run_id: str | None = None) -> None:
        """Fail the test with every violated policy's verdict."""
        failed = [r for r in self.check(*policies, run_id=run_id) if not r.passed]
        if failed:
            pytest.fail("policy violated:\n" + "\n".join(f"  {r}" for r in failed), False)


def _rules(value: Any) -> SanitizeRules | None:
    from replayable.testing.sanitize import SanitizeRules

    if value is None or isinstance(value, SanitizeRules):
        return value
    return SanitizeRules.load(str(value))


def _record(
    path: Path, record: Callable[[], Any] | None, sanitize: SanitizeRules | None, mode: str
) -> None:
    if record is None:
        pytest.fail(
            f"replayable: {path} needs recording (--replayable-record={mode}) but the marker "
            "has no record= callable to run the workflow live",
            False,
        )
    import replayable
    from replayable.store.memory import MemoryStore
    from replayable.testing.fixture import export_fixture

    store = MemoryStore()
    with replayable.recording(store) as rec:
        record()
    if not rec.run_ids:
        pytest.fail(f"replayable: record= for {path} ran no @workflow", False)
    export_fixture(store, rec.run_ids[0], path, sanitize=sanitize)


def _prepare(item: pytest.Item) -> ReplayableRun | None:
    marker = item.get_closest_marker("replayable")
    if marker is None:
        return None
    found = item.stash.get(_STATE, None)
    if found is not None:
        return found
    if not marker.args or not isinstance(marker.args[0], str | os.PathLike):
        pytest.fail("@pytest.mark.replayable needs the fixture's path as its argument", False)
    path = Path(marker.args[0])
    if not path.is_absolute():
        path = Path(item.path).parent / path
    opts = dict(marker.kwargs)
    unknown = sorted(set(opts) - {"record", "sanitize", "policies", "allow_network"})
    if unknown:
        pytest.fail(f"@pytest.mark.replayable: unknown option {unknown[0]!r}", False)
    mode = item.config.getoption("replayable_record") or default_mode()
    sanitize = _rules(opts.get("sanitize", "default"))
    recorded = False
    if mode == "rewrite" or (not path.exists() and mode in ("once", "new")):
        _record(path, opts.get("record"), sanitize, mode)
        recorded = True
    elif not path.exists():
        pytest.fail(
            f"replayable: fixture {path} does not exist, and --replayable-record=none "
            "(the default under CI) records nothing; record it with --replayable-record=once",
            False,
        )
    state = _replay(path, mode, opts)
    if mode == "new" and not recorded and state.result.status == "diverged":
        _record(path, opts.get("record"), sanitize, mode)
        state = _replay(path, mode, opts)
        recorded = True
    state.recorded = recorded
    if recorded:
        item.config.stash[_RECORDED].append(str(path))
    item.stash[_STATE] = state
    return state


def _replay(path: Path, mode: str, opts: dict[str, Any]) -> ReplayableRun:
    from replayable.replay.api import replay
    from replayable.testing.fixture import load_fixture

    fx, store = load_fixture(path)
    policies = tuple(opts.get("policies", ()))
    result = replay(
        fx.root,
        store=store,
        policies=policies,
        allow_network=bool(opts.get("allow_network", False)),
    )
    return ReplayableRun(path, fx, store, result, mode, policies=policies)


@pytest.fixture
def replayable_run(request: pytest.FixtureRequest) -> ReplayableRun:
    """The marked fixture's :class:`ReplayableRun`: its replay result, fork and
    counterfactual helpers and policy checks."""
    state = _prepare(request.node)
    if state is None:
        pytest.fail(
            "the replayable_run fixture needs @pytest.mark.replayable('path/to.replay')", False
        )
    return state


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    """Before the test body: a marked fixture must replay identically and pass its
    policies; otherwise the test fails with the divergence message."""
    state = _prepare(item)
    if state is None:
        return
    result = state.result
    if result.status == "diverged" and result.divergence is not None:
        pytest.fail(
            f"replayable: {state.path.name} diverged from the current code:\n"
            f"{result.divergence.message}",
            False,
        )
    if result.status not in ("identical", "incomplete"):
        why = f": {result.error!r}" if result.error is not None else ""
        pytest.fail(f"replayable: {state.path.name} replayed {result.status}{why}", False)
    failed = [r for r in result.policies if not r.passed]
    if failed:
        pytest.fail(
            f"replayable: {state.path.name} violates:\n" + "\n".join(f"  {r}" for r in failed),
            False,
        )


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    recorded: list[str] = config.stash.get(_RECORDED, [])
    if recorded:
        terminalreporter.write_line(
            f"replayable: recorded {len(recorded)} fixture(s): " + ", ".join(recorded)
        )
