"""schemathesis against the JSON API's OpenAPI description: no request makes a 500."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from argon2 import PasswordHasher
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error

from replayable.store.sqlite import SQLiteStore
from replayable.web import UserDB, WebConfig, create_app
from tests.web_runs import make_run, review_calls

TOKEN: dict[str, str] = {}


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    root: Path = tmp_path_factory.mktemp("schema")
    store = SQLiteStore(root / "runs.db")
    TOKEN["run"] = make_run(store, review_calls())
    store.close()
    users = UserDB(root / "users.json", hasher=PasswordHasher(time_cost=1, memory_cost=8))
    users.add("adm", "admin")
    TOKEN["admin"] = users.new_token("adm")[1]
    app = create_app(
        WebConfig(store_url=f"sqlite:///{root / 'runs.db'}", users=users, secret=b"z" * 32)
    )
    yield schemathesis.openapi.from_asgi("/api/openapi.json", app)
    # Called without its lifespan: close what it opened, and wait for its replay jobs.
    app.state.web.jobs.shutdown()
    app.state.web.pool.close()


def _real_run(case: Any) -> Any:
    # A random run id is only ever a 404: name the recorded run, so the generated
    # steps, formats and bodies reach the code behind the lookup.
    if case.path_parameters and "run" in case.path_parameters:
        case.path_parameters["run"] = TOKEN["run"]
        if isinstance(case.path_parameters.get("seq"), int):
            case.path_parameters["seq"] %= 7  # steps 1-5 exist; 0 and 6 do not
    return case


def test_no_request_makes_a_server_error(api: Any) -> None:
    """Every operation, with generated parameters and bodies, as the admin: never a 5xx.
    (Operations are driven one by one with hypothesis: bounded examples, fixed seed.)"""
    checked = []
    for result in api.get_all_operations():
        operation = result.ok()

        @settings(
            max_examples=12,
            deadline=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
            database=None,
        )
        @given(case=operation.as_strategy().map(_real_run))
        def call(case: Any) -> None:
            case.call_and_validate(
                headers={"authorization": f"Bearer {TOKEN['admin']}"},
                checks=[not_a_server_error],
            )

        call()
        checked.append(f"{operation.method.upper()} {operation.path}")
    assert len(checked) >= 15, checked
