"""Hash test vectors: fixed inputs, and the canonical bytes and hashes they must give.

A library upgrade (orjson's number spelling, cryptography's Ed25519) or a change of
what a hash covers cannot pass unnoticed: every stored chain would stop verifying.
The libraries these depend on are pinned below their next major version.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac

import msgspec
import orjson

from replayable.events.canonical import (
    canonical,
    event_fields,
    event_hash,
    fingerprint,
    genesis_hash,
    run_seal,
)
from replayable.events.chain import (
    ChainKey,
    chain_label,
    event_digest,
    genesis,
    seal_for,
    seal_message,
    start_mac,
)
from replayable.events.codec import encode_request
from replayable.events.model import Event, RunStart

RUN = "01a231a8-f5d1-7228-af5e-3166d2795df2"
REQUEST = b'{"jurisdiction":"GB-SCT"}'
VECTOR_V2 = "e05d6b9ba7323380602cf73a3ec53e89e37de96d0f43d9a6e25c95d79174899a"
KEY = ChainKey("vector-key", b"replayable hash vector key, 32+ bytes!")
START = RunStart(
    run_id=RUN,
    workflow="contract_review",
    entrypoint="contract_review.agent:review_contract",
    parent_run_id=None,
    parent_seq=None,
    root_run_id=RUN,
    tenant=None,
    input='{"args":["C-1042"],"kwargs":{}}',
    metadata={"contract_id": "C-1042"},
    code={"module": "contract_review.agent"},
    env_hash=None,
    lineage={},
    started_at=1796129486.3220124,
)


def _event(prev_hash: str, schema_version: int = 1) -> Event:
    return Event(
        schema_version=schema_version,
        run_id=RUN,
        seq=1,
        kind="tool",
        name="query_compliance_rules",
        key="r:0",
        parent=None,
        call_site=None,
        request=REQUEST.decode(),
        fingerprint=fingerprint("tool", "query_compliance_rules", REQUEST),
        response="[]",
        encoding="json",
        error=None,
        side_effect=False,
        started_at=1796129486.5,
        duration_ns=1200,
        metadata={},
        chain_index=0,
        prev_hash=prev_hash,
        hash="",
    )


def test_canonical_bytes_sort_keys_keep_utf8_and_spell_numbers_one_way():
    """Sorted keys, raw UTF-8 (U+2028 too), -0.0, 1e+100 and the shortest float repr."""
    value = {
        "b": [1, 2.5, -0.0, 1e100, True, None],
        "a": "naïve ✓ \u2028",
        "c": {"z": 1, "y": 1796129486.6904473},
    }
    assert canonical(value) == (
        b'{"a":"na\xc3\xafve \xe2\x9c\x93 \xe2\x80\xa8","b":[1,2.5,-0.0,1e+100,true,null],'
        b'"c":{"y":1796129486.6904473,"z":1}}'
    )
    assert encode_request({"query": "GB-SCT", "k": 5, "when": dt.date(2026, 1, 2)}) == (
        b'{"k":5,"query":"GB-SCT","when":"2026-01-02"}'
    )


def test_fingerprint_and_unkeyed_chain_vectors():
    """Format 1: the fingerprint, genesis, event hash and seal, and their definitions."""
    fp = fingerprint("tool", "query_compliance_rules", REQUEST)
    assert fp == "cefd0a8175cd21d34e526122cb8b17d5451599763988cb10de570be3273dec84"
    assert fp == hashlib.sha256(b"tool\0query_compliance_rules\0" + REQUEST).hexdigest()
    g = genesis_hash(RUN)
    assert g == "a8194f161ef16a654b846cfd5039a04b63a940ab15df6dec8f67910be92ffc50"
    assert g == hashlib.sha256(b"replayable-chain:" + RUN.encode()).hexdigest()
    ev = _event(g)
    h = event_hash(ev)
    assert h == "f5c9aafebbf53068ead186b4b0b602c3260554771164ab33b28863dd0ca81f0e"
    fields = orjson.dumps(event_fields(ev), option=orjson.OPT_SORT_KEYS)
    assert h == hashlib.sha256(g.encode() + fields).hexdigest()
    seal = run_seal(h, START, "completed", '{"risk":"low"}', None, 1796129486.69, 1)
    assert seal == "fbd563c0b453ff3a860a2c06f69ac46cfaf63a4d7a2e5438959bf6a3f561345c"


def test_version_2_events_hash_their_payloads_digests():
    """Events of version 2 (written since the blob tier) cover the sha256 of their request
    and response in place of the text: the same commitment, verifiable without the payload."""
    g = genesis_hash(RUN)
    ev = _event(g, schema_version=2)
    fields = event_fields(ev)
    assert fields[8] == hashlib.sha256(REQUEST).hexdigest()
    assert fields[10] == hashlib.sha256(b"[]").hexdigest()
    h = event_hash(ev)
    assert (
        h
        == hashlib.sha256(
            g.encode() + orjson.dumps(fields, option=orjson.OPT_SORT_KEYS)
        ).hexdigest()
    )
    assert h == VECTOR_V2
    # Without the payload (erased), its digest stands in and the hash is the same.
    gone = msgspec.structs.replace(
        ev, request="null", response=None, request_digest=fields[8], response_digest=fields[10]
    )
    assert event_hash(gone) == h
    assert event_hash(msgspec.structs.replace(ev, schema_version=1)) != h


def test_keyed_chain_vectors():
    """Format 2: HMAC links and seal under a fixed key, the start MAC, the Ed25519 seal
    signature (deterministic), and the HMAC fast path equal to the standard library's."""
    mac_key = hmac.digest(KEY.secret, b"replayable chain hmac-sha256", "sha256")
    assert KEY.mac(b"abc") == hmac.new(mac_key, b"abc", "sha256").hexdigest()
    assert KEY.mac(b"abc") == "faabb61bb36639c1ce069dde91366babfbf3b1e2e01d36aabc50c2ac730d917e"
    g = genesis(KEY, RUN)
    assert g == "cbb032857dbc91233988205877ebdf4472cd70cc5adcf2c51ecbf37707eeedea"
    digest = event_digest(KEY, _event(g))
    assert digest == "701ead833e8a80c602efd190a14837a1c8aec09099af36fa88894ae6e2aabece"
    assert start_mac(KEY, START) == (
        "68d5b8937cf79ea43fe2aabc742c6b72b56c3d50631c393198829d28d680bdc6"
    )
    keyed = msgspec.structs.replace(START, chain=chain_label(KEY, START))
    seal = seal_for(KEY, digest, keyed, "completed", '{"risk":"low"}', None, 1796129486.69, 1)
    assert seal == "c81a948cecb13898a6f2813a665c0df5ad9ece7c3fb1f44641a692f89b792d08"
    assert KEY.sign(seal_message(RUN, seal)) == (
        "c664453e77ae88aa4662946b177ba892f48dd0dd7d281e3da7fa7a81164c87f5"
        "3f36b31dfe92ca870e5f7203d22a6b86281cbac67fafb806a90280eb7d32b703"
    )


def test_the_libraries_the_hashes_depend_on_are_pinned_below_their_next_major():
    """orjson (canonical bytes), cryptography (seal signatures) and google-re2 (redaction,
    hence stored bytes) may not move to a new major version unnoticed."""
    import re
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    deps = {re.split(r"[<>=\[ ]", d, maxsplit=1)[0]: d for d in project["project"]["dependencies"]}
    for name in ("orjson", "cryptography", "google-re2"):
        assert re.search(r"<\d+", deps[name]), f"{name} is not pinned below a major: {deps[name]}"
