"""The decision context a replay needs beyond calls: recorded, shown by ``show``, named
by ``diff``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import replayable
from replayable.cli import app

STATE: dict[str, Any] = {}


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'runs.db'}"


@pytest.fixture
def store(url: str) -> Iterator[replayable.EventStore]:
    s = replayable.open_store(url)
    yield s
    s.close()


@pytest.fixture(autouse=True)
def _state() -> None:
    STATE.clear()
    STATE.update(
        version="v2",
        template="Classify this ticket: {ticket}",
        status="pending",
        adapter_fixed=False,
        calls=0,
        flag=False,
    )


def record(store: Any, fn: Any, *args: Any, **options: Any) -> str:
    with replayable.recording(store, **options) as rec:
        fn(*args)
    return rec.run_ids[0]


def show(url: str, run_id: str) -> str:
    result = CliRunner().invoke(app, ["--store", url, "show", run_id], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result.output


# -- retrieval ------------------------------------------------------------------


def search_index(query: str, k: int = 2) -> list[dict[str, Any]]:
    STATE["calls"] += 1
    return [
        {"id": 17, "score": 0.82, "version": STATE["version"], "text": "Refunds within 30 days."},
        {"id": 4, "score": 0.61, "version": "v1", "text": "Shipping is free."},
    ][:k]


@replayable.workflow("decisions.rag")
def rag(question: str) -> str:
    docs = replayable.retrieval(search_index, question, k=2)
    return " ".join(d["text"] for d in docs)


def test_retrieval_records_query_ids_scores_and_versions(store: Any, url: str) -> None:
    """The event names the query and each document; replay calls no index."""
    run_id = record(store, rag, "refund policy")
    (event,) = store.events(run_id)
    assert (event.kind, event.name) == ("retrieval", "search_index")
    assert event.request_value() == {"query": "refund policy", "k": 2}
    assert event.metadata["query"] == "refund policy"
    assert event.metadata["documents"] == [
        {"id": 17, "score": 0.82, "version": "v2"},
        {"id": 4, "score": 0.61, "version": "v1"},
    ]
    STATE["calls"] = 0
    result = replayable.replay(run_id, store=store, fn=rag)
    assert result.status == "identical", result.divergence
    assert STATE["calls"] == 0
    assert "query 'refund policy' → doc 17 v2 (0.82), doc 4 v1 (0.61)" in show(url, run_id)


def test_diff_names_the_document_whose_version_changed(store: Any) -> None:
    """Two runs whose retrieval returned document 17 at v2 and at v3."""
    first = record(store, rag, "refund policy")
    STATE["version"] = "v3"
    second = record(store, rag, "refund policy")
    d = replayable.diff(first, second, store=store)
    assert d.first is not None
    assert "document 17 changed from v2 to v3" in d.first.describe()
    assert d.first.to_dict()["note"] == "document 17 changed from v2 to v3"


class Document:
    """A LangChain-style document: content, and its id and version in ``metadata``."""

    def __init__(self, text: str, **metadata: Any) -> None:
        self.page_content = text
        self.metadata = metadata


@replayable.tool(kind="retrieval")
def vector_search(query: str) -> list[tuple[Document, float]]:
    return [(Document("a", id="doc-9", revision=3), 0.9)]


def test_a_retrieval_tool_describes_documents_and_scored_pairs(store: Any) -> None:
    """``@tool(kind="retrieval")`` understands (document, score) pairs and metadata."""

    @replayable.workflow("decisions.vector")
    def agent() -> int:
        return len(vector_search("q"))

    register_document()
    run_id = record(store, agent)
    (event,) = store.events(run_id)
    assert event.kind == "retrieval"
    assert event.metadata["query"] == "q"
    assert event.metadata["documents"] == [{"id": "doc-9", "score": 0.9, "version": 3}]


def register_document() -> None:
    replayable.register_codec(
        Document,
        lambda d: {"text": d.page_content, "metadata": d.metadata},
        lambda v: Document(v["text"], **v["metadata"]),
    )


# -- prompt templates -----------------------------------------------------------------


@replayable.tool
def classify(prompt: str) -> str:
    return "billing"


@replayable.workflow("decisions.prompted")
def triage(ticket: str) -> str:
    text = replayable.prompt("triage", STATE["version"], STATE["template"], ticket=ticket)
    return classify(text)


def test_a_prompt_template_is_recorded_with_its_name_and_version(store: Any, url: str) -> None:
    """The rendered text comes back; the template's name and version sit beside it."""
    run_id = record(store, triage, "I was charged twice")
    prompt, call = store.events(run_id)
    assert (prompt.kind, prompt.name) == ("prompt", "triage")
    assert prompt.request_value()["version"] == "v2"
    assert prompt.metadata["template"] == "triage"
    assert prompt.metadata["version"] == "v2"
    assert call.request_value() == {"prompt": "Classify this ticket: I was charged twice"}
    assert replayable.replay(run_id, store=store, fn=triage).status == "identical"
    assert "step 1 prompt triage: template triage version v2" in show(url, run_id)


def test_a_new_template_version_diverges_at_the_prompt_and_diff_names_it(store: Any) -> None:
    """Replay stops at the prompt step naming the version; diff names it too."""
    first = record(store, triage, "I was charged twice")
    STATE.update(version="v3", template="Classify, then explain: {ticket}")
    result = replayable.replay(first, store=store, fn=triage)
    div = result.divergence
    assert div is not None
    assert (div.reason, div.step) == ("request_changed", 1)
    assert {d.path for d in div.diff} == {"template", "version"}
    second = record(store, triage, "I was charged twice")
    d = replayable.diff(first, second, store=store)
    assert d.first is not None
    assert "prompt template version changed from v2 to v3" in d.first.describe()


# -- normalize and validate -----------------------------------------------------------


def adapter(raw: dict[str, Any]) -> dict[str, Any]:
    status = raw["status"]
    if STATE["adapter_fixed"] is False and status == "pending":
        status = "success"  # the adapter's bug: pending taken for success
    return {"paid": status == "success", "status": status}


def given_amount(arguments: dict[str, Any]) -> dict[str, Any]:
    return {"order": str(arguments["order"]).upper(), "cents": round(arguments["amount"] * 100)}


@replayable.tool(normalize=adapter, validate=given_amount)
def charge_status(order: str, cents: int) -> dict[str, Any]:
    STATE["calls"] += 1
    return {"status": STATE["status"], "provider_ref": "ch_1"}


@replayable.workflow("decisions.payment")
def payment(order: str, amount: float) -> bool:
    return bool(charge_status(order=order, amount=amount)["paid"])


def test_the_raw_response_and_the_adapters_result_are_both_kept(store: Any, url: str) -> None:
    """The adapter turned pending into success, and the event shows it."""
    run_id = record(store, payment, "a-1", 12.5)
    (event,) = store.events(run_id)
    assert event.response_tree() == {"status": "pending", "provider_ref": "ch_1"}
    assert event.metadata["normalized"] == {"paid": True, "status": "success"}
    assert event.request_value() == {"order": "A-1", "cents": 1250}
    assert event.metadata["arguments_given"] == {"order": "a-1", "amount": 12.5}
    (line,) = [ln for ln in show(url, run_id).splitlines() if "raw response" in ln]
    raw, _, normalized = line.replace('"', "'").partition("→ normalized")
    assert "step 1 tool charge_status" in raw
    assert "'pending" in raw
    assert "'paid':true" in normalized
    assert "'success'" in normalized
    (line,) = [ln for ln in show(url, run_id).splitlines() if "arguments given" in ln]
    given, _, validated = line.replace('"', "'").partition("→ validated")
    assert "'a-1'" in given
    assert "'A-1'" in validated


def test_the_adapter_runs_again_on_replay_over_the_recorded_raw_response(store: Any) -> None:
    """Fixing the adapter changes the replayed output, not the served raw response."""
    run_id = record(store, payment, "a-1", 12.5)
    STATE["calls"] = 0
    assert replayable.replay(run_id, store=store, fn=payment).status == "identical"
    STATE["adapter_fixed"] = True
    result = replayable.replay(run_id, store=store, fn=payment)
    assert result.status == "diverged"
    assert result.divergence is not None
    assert result.divergence.reason == "output_changed"
    assert STATE["calls"] == 0
    second = record(store, payment, "a-1", 12.5)
    d = replayable.diff(run_id, second, store=store)
    assert d.first is not None
    assert "the adapter's normalized result paid changed from True to False" in d.first.describe()


def test_outside_a_recording_the_tool_still_validates_and_normalizes() -> None:
    """The decorated function behaves the same with no recording."""
    assert charge_status(order="b-2", amount=1.0) == {"paid": True, "status": "success"}


# -- run context and snapshots -------------------------------------------------------------


@replayable.workflow("decisions.flags")
def checkout(cart: str) -> str:
    orders = replayable.snapshot("db.orders", lambda: _read_orders(cart))
    return f"{cart}: {len(orders)} open"


def _read_orders(cart: str) -> list[dict[str, Any]]:
    STATE["calls"] += 1
    return [{"id": 1, "cart": cart, "state": "open"}]


def test_run_context_and_snapshots_are_kept_shown_and_compared(store: Any, url: str) -> None:
    """Flags and permissions given to recording(context=...) and a snapshot of a table."""
    context = {"flags": {"new_checkout": False}, "tenant": {"plan": "pro"}, "perms": ["refund"]}
    run_id = record(store, checkout, "c-1", context=context, metadata={"ticket": "T-1"})
    run = store.run(run_id)
    assert run.metadata["context"] == context
    assert run.metadata["ticket"] == "T-1"
    (event,) = store.events(run_id)
    assert (event.kind, event.name) == ("state_read", "db.orders")
    assert event.metadata["snapshot"] is True
    STATE["calls"] = 0
    assert replayable.replay(run_id, store=store, fn=checkout).status == "identical"
    assert STATE["calls"] == 0  # the callable is not read on replay
    text = show(url, run_id).replace('"', "")
    assert "context: flags={new_checkout:false}, perms=[refund], tenant={plan:pro}" in text
    assert "step 1 state_read db.orders: snapshot [{id:1,cart:c-1,state:open}]" in text
    changed = {**context, "flags": {"new_checkout": True}}
    second = record(store, checkout, "c-1", context=changed)
    d = replayable.diff(run_id, second, store=store)
    assert d.first is not None
    assert "run context flags.new_checkout changed from False to True" in d.first.describe()


def test_context_must_be_a_mapping() -> None:
    """A context that is not a mapping is refused, naming what was given."""
    with pytest.raises(TypeError, match=r"takes a mapping.*not list"):
        replayable.recording("memory://", context=["flag"])  # type: ignore[arg-type]


def test_a_snapshot_outside_a_recording_is_just_the_value() -> None:
    """No run: the value, or the callable's result."""
    assert replayable.snapshot("x", 3) == 3
    assert replayable.snapshot("y", lambda: [1]) == [1]
    assert replayable.prompt("p", 1, "hi {name}", name="Ana") == "hi Ana"


async def asearch(query: str) -> list[dict[str, Any]]:
    STATE["calls"] += 1
    return [{"doc_id": "a", "relevance_score": 0.5, "rev": 7}]


@replayable.tool(kind="retrieval", normalize=lambda docs: [d["doc_id"] for d in docs])
async def atool_search(query: str) -> list[dict[str, Any]]:
    return await asearch(query)


@replayable.workflow("decisions.async_rag")
async def async_rag(question: str) -> list[Any]:
    direct = await replayable.retrieval(asearch, question)
    return [direct, await atool_search(question)]


def test_async_retrievals_replay_as_awaitables(store: Any) -> None:
    """``retrieval()`` of a coroutine function and an async retrieval tool, on replay too."""
    import asyncio

    with replayable.recording(store) as rec:
        out = asyncio.run(async_rag("q"))
    assert out == [[{"doc_id": "a", "relevance_score": 0.5, "rev": 7}], ["a"]]
    first, second = store.events(rec.run_ids[0])
    assert first.metadata["documents"] == [{"id": "a", "score": 0.5, "version": 7}]
    assert second.metadata["documents"] == first.metadata["documents"]
    assert second.metadata["normalized"] == ["a"]
    STATE["calls"] = 0
    result = replayable.replay(rec.run_ids[0], store=store, fn=async_rag)
    assert result.status == "identical", result.divergence
    assert result.output == out
    assert STATE["calls"] == 0
