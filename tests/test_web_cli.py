"""``replayable users`` and ``replayable serve`` from the shell."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from replayable.cli import app
from replayable.store.sqlite import SQLiteStore
from replayable.web.users import UserDB


def run(*args: str, stdin: str | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args), input=stdin)
    return result.exit_code, result.stdout, result.stderr


def test_users_add_set_role_token_remove(tmp_path: Path) -> None:
    """Accounts made from the shell: the password hashed, the token shown once and kept
    as a hash, the role changed, the account removed; mistakes exit 2 with one line."""
    users = str(tmp_path / "users.json")
    code, out, _ = run(
        "users",
        "add",
        "dana",
        "--role",
        "analyst",
        "--password-stdin",
        "--users",
        users,
        stdin="a long password\n",
    )
    assert code == 0
    assert "added dana (analyst)" in out
    assert UserDB(users).check_password("dana", "a long password") is not None
    code, token, _ = run("users", "token", "dana", "--users", users)
    assert code == 0
    assert token.startswith("rpl_")
    assert UserDB(users).check_token(token.strip()).name == "dana"  # type: ignore[union-attr]
    assert token.strip() not in Path(users).read_text()
    assert run("users", "set-role", "dana", "auditor", "--tenant", "acme", "--users", users)[0] == 0
    account = UserDB(users).get("dana")
    assert account is not None
    assert (account.role, account.tenant) == ("auditor", "acme")
    code, out, _ = run("users", "list", "--users", users)
    assert out.split("\t")[:3] == ["dana", "auditor", "acme"]
    code, _, err = run("users", "add", "dana", "--role", "admin", "--users", users, stdin="")
    assert code == 2
    assert "exists" in err
    code, _, err = run("users", "set-role", "dana", "boss", "--users", users)
    assert code == 2
    assert "not one of" in err
    assert run("users", "remove", "dana", "--users", users)[0] == 0
    assert UserDB(users).get("dana") is None


def test_serve_refuses_a_public_address_without_accounts(tmp_path: Path) -> None:
    """Binding to 0.0.0.0 with no accounts and no proxy does not start."""
    db = tmp_path / "runs.db"
    SQLiteStore(db).close()
    code, _, err = run(
        "--store",
        f"sqlite:///{db}",
        "serve",
        "--host",
        "0.0.0.0",
        "--users",
        str(tmp_path / "none.json"),
    )
    assert code == 2
    assert "needs sign-in" in err


def test_serve_refuses_a_missing_store(tmp_path: Path) -> None:
    code, _, err = run(
        "--store",
        f"sqlite:///{tmp_path}/nothing.db",
        "serve",
        "--users",
        str(tmp_path / "none.json"),
    )
    assert code == 2
    assert "no store at" in err


def test_serve_answers_the_local_user_at_once(tmp_path: Path) -> None:
    """`replayable serve` on an embedded store with no accounts: the runs page answers on
    loopback, says it is the embedded mode, and the server stops on SIGTERM."""
    import signal
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    from tests.web_runs import make_run, review_calls

    db = tmp_path / "runs.db"
    store = SQLiteStore(db)
    run_id = make_run(store, review_calls())
    store.close()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "replayable.cli",
            "--store",
            f"sqlite:///{db}",
            "serve",
            "--port",
            str(port),
            "--users",
            str(tmp_path / "none.json"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        body = ""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/runs", timeout=2) as r:
                    body = r.read().decode()
                break
            except OSError:
                if proc.poll() is not None:
                    break
                time.sleep(0.1)
        assert run_id[:13] in body, proc.stderr.read() if proc.poll() is not None else body
        assert 'id="local-mode"' in body
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    assert f"on http://127.0.0.1:{port}/" in out
    assert "Traceback" not in err
