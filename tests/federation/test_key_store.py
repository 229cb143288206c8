"""The one key store with fetched keys (both engines): validity, old keys, operator keys
kept, the fetcher asked only for what is missing; the blacklist's address checks; key
answers' checks."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from signedjson.key import generate_signing_key
from signedjson.sign import sign_json

from roomstream.federation.client import IpRangeBlacklist
from roomstream.federation.keyring import (
    InvalidKeyResponseError,
    Keyring,
    OldSigningKey,
    check_key_response,
)
from roomstream.rooms.keys import FetchedKey, KeyNeed, ServerKeyStore, keys_valid_at
from roomstream.storage import Database
from tests.support.rooms import verify_key_base64

KEY = generate_signing_key("k1")
OLD = generate_signing_key("k0")
B64 = verify_key_base64(KEY)
OLD_B64 = verify_key_base64(OLD)


async def test_fetched_keys_with_validity(database: Database) -> None:
    asked: list[list[KeyNeed]] = []
    store = ServerKeyStore(database)

    async def fetcher(needs: Sequence[KeyNeed]) -> None:
        asked.append(list(needs))
        await store.store_fetched(
            [
                FetchedKey("r.test", "ed25519:k1", B64, 5_000),
                FetchedKey("r.test", "ed25519:k0", OLD_B64, 1_000),
            ],
            [("r.test", '{"server_name": "r.test"}', 5_000)],
            fetched_from="r.test",
        )

    store.fetcher = fetcher
    known = await store.verify_keys_at([KeyNeed("r.test", "ed25519:k1", 4_000)])
    assert known["r.test"]["ed25519:k1"][1] == 5_000
    assert len(asked) == 1
    # Known and valid long enough: the fetcher is not asked again.
    await store.verify_keys_at([KeyNeed("r.test", "ed25519:k0", 900)])
    assert len(asked) == 1
    # Valid too short: asked (and still short: the answer says so).
    known = await store.verify_keys_at([KeyNeed("r.test", "ed25519:k0", 2_000)])
    assert len(asked) == 2
    assert keys_valid_at(known, 2_000)["r.test"].keys() == {"ed25519:k1"}
    assert keys_valid_at(known, 1_000)["r.test"].keys() == {"ed25519:k1", "ed25519:k0"}
    assert (await store.key_responses(["r.test", "x.test"])) == {
        "r.test": ('{"server_name": "r.test"}', 5_000)
    }
    # A later answer extends validity; an older one never shortens it.
    await store.store_fetched([FetchedKey("r.test", "ed25519:k1", B64, 9_000)], fetched_from="n")
    await store.store_fetched([FetchedKey("r.test", "ed25519:k1", B64, 3_000)], fetched_from="n")
    assert (await store.valid_keys(["r.test"]))["r.test"]["ed25519:k1"][1] == 9_000


async def test_operator_keys_stay(database: Database) -> None:
    store = ServerKeyStore(database)
    await store.add("r.test", "ed25519:k1", B64)
    other = verify_key_base64(generate_signing_key("k1"))
    await store.store_fetched([FetchedKey("r.test", "ed25519:k1", other, 10)], fetched_from="r")
    key, until = (await store.valid_keys(["r.test"]))["r.test"]["ed25519:k1"]
    assert verify_key_base64_of(key) == B64 and until is None
    # A fetched key an operator then adds: no limit from then on.
    await store.store_fetched([FetchedKey("s.test", "ed25519:k1", B64, 10)], fetched_from="s")
    assert await store.add("s.test", "ed25519:k1", B64)
    assert (await store.valid_keys(["s.test"]))["s.test"]["ed25519:k1"][1] is None
    # The import's view (every key, whatever its validity) still has them all.
    assert set((await store.key_map()).keys()) == {"r.test", "s.test"}


def verify_key_base64_of(key: object) -> str:
    from roomstream.events.hashing import encode_base64

    return encode_base64(key.encode())  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("address", "refused"),
    [
        ("127.0.0.1", True),
        ("10.1.2.3", True),
        ("192.168.1.1", True),
        ("169.254.0.1", True),
        ("::1", True),
        ("fe80::1%eth0", True),
        ("::ffff:127.0.0.1", True),  # IPv4-mapped
        ("2002:7f00:1::", True),  # 6to4 of 127.0.0.1
        ("8.8.8.8", False),
        ("2606:4700::1111", False),
        ("not an address", True),
    ],
)
def test_default_blacklist(address: str, refused: bool) -> None:
    from roomstream.config import DEFAULT_IP_RANGE_BLACKLIST

    assert IpRangeBlacklist(DEFAULT_IP_RANGE_BLACKLIST).refuses(address) is refused


def test_empty_blacklist_still_refuses_unspecified() -> None:
    empty = IpRangeBlacklist([])
    assert empty.refuses("0.0.0.0") and empty.refuses("::")
    assert not empty.refuses("127.0.0.1")


def _answer(server: str = "r.test", **extra: object) -> dict[str, object]:
    doc = {
        "server_name": server,
        "valid_until_ts": 10_000,
        "verify_keys": {"ed25519:k1": {"key": B64}},
        "old_verify_keys": {"ed25519:k0": {"key": OLD_B64, "expired_ts": 500}},
        **extra,
    }
    return dict(sign_json(doc, server, KEY))


def test_key_answer_checks() -> None:
    keys, until = check_key_response(_answer(), "r.test", now_ms=0)
    assert until == 10_000
    assert {(k.key_id, k.valid_until_ts) for k in keys} == {
        ("ed25519:k1", 10_000),
        ("ed25519:k0", 500),
    }
    # valid_until_ts at most seven days ahead (the spec)
    _keys, until = check_key_response(_answer(valid_until_ts=10**15), "r.test", now_ms=0)
    assert until == 7 * 24 * 3600 * 1000
    bad = [
        ("for another server", _answer(), "s.test"),
        ("tampered", {**_answer(), "valid_until_ts": 20_000}, "r.test"),
        ("unsigned", {k: v for k, v in _answer().items() if k != "signatures"}, "r.test"),
        (
            "signed by an old key only",
            dict(sign_json({**_answer(), "signatures": {}}, "r.test", OLD)),
            "r.test",
        ),
        ("bad key", _answer(verify_keys={"ed25519:k1": {"key": "!!"}}), "r.test"),
        ("not an object", [], "r.test"),
    ]
    for name, doc, server in bad:
        with pytest.raises(InvalidKeyResponseError):
            check_key_response(doc, server, now_ms=0)
            pytest.fail(name)


class _SynapseStore:
    def __init__(self) -> None:
        self.stored: list[object] = []

    async def store_server_keys_response(self, *args: object, **kwargs: object) -> None:
        self.stored.append((args, kwargs))


class _SynapseFetcher:
    """What Synapse's ``BaseV2KeyFetcher.process_v2_response`` reads of its fetcher."""

    def __init__(self) -> None:
        self.store = _SynapseStore()


async def test_synapse_accepts_our_key_answers(database: Database) -> None:
    """Synapse's own parsing of a key answer takes ours: the current key, and the old
    key with its expired_ts as its validity."""
    from synapse.crypto.keyring import BaseV2KeyFetcher

    async def no_requests(*args: object, **kwargs: object) -> None:
        raise AssertionError("nothing to fetch")

    keyring = Keyring(
        ServerKeyStore(database),
        "us.test",
        KEY,
        no_requests,
        old_signing_keys=[OldSigningKey("ed25519:k0", OLD_B64, 500)],
    )
    ours = keyring.own_keys()
    fetcher = _SynapseFetcher()
    results = await BaseV2KeyFetcher.process_v2_response(
        fetcher,  # type: ignore[arg-type]
        "us.test",
        ours,
        0,
    )
    assert results["ed25519:k1"].valid_until_ts == ours["valid_until_ts"]
    assert results["ed25519:k0"].valid_until_ts == 500
    # And a notary answer of ours (our signature added) is still the origin's answer.
    notary = await keyring.notary_query({"us.test": {}})
    (doc,) = notary["server_keys"]
    assert await BaseV2KeyFetcher.process_v2_response(fetcher, "us.test", doc, 0)  # type: ignore[arg-type]
