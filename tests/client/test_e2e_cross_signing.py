"""Cross-signing: ``POST /keys/device_signing/upload`` and ``/keys/signatures/upload``,
and their keys and signatures in ``/keys/query``, on both engines."""

from __future__ import annotations

from signedjson.sign import sign_json

from tests.support.e2e_keys import CrossSigning, Device, password_auth, public
from tests.support.homeserver import Homeserver


async def test_upload_query_and_replace_with_password(homeserver: Homeserver) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    bob = await hs.register("bob")
    cs = CrossSigning(alice.user_id)
    body = cs.upload_body()
    before = hs.process.keys.position()
    await hs.ok("POST", "/keys/device_signing/upload", body, token=alice.token)  # first: no UIA
    assert hs.process.keys.position() > before
    # Identical again: no UIA either.
    await hs.ok("POST", "/keys/device_signing/upload", body, token=alice.token)
    seen_by_bob = await hs.ok(
        "POST", "/keys/query", {"device_keys": {alice.user_id: []}}, token=bob.token
    )
    assert seen_by_bob["master_keys"][alice.user_id] == body["master_key"]
    assert seen_by_bob["self_signing_keys"][alice.user_id] == body["self_signing_key"]
    assert seen_by_bob["user_signing_keys"] == {}  # only for alice herself
    seen_by_alice = await hs.ok(
        "POST", "/keys/query", {"device_keys": {alice.user_id: []}}, token=alice.token
    )
    assert seen_by_alice["user_signing_keys"][alice.user_id] == body["user_signing_key"]
    # Replacing the master key: 401 with the password flow, then done with the password.
    new = CrossSigning(alice.user_id)
    status, answer = await hs.call(
        "POST", "/keys/device_signing/upload", new.upload_body(), token=alice.token
    )
    assert status == 401 and answer["flows"] == [{"stages": ["m.login.password"]}]
    status, answer = await hs.call(
        "POST",
        "/keys/device_signing/upload",
        {**new.upload_body(), "auth": password_auth(alice.user_id, "wrong")},
        token=alice.token,
    )
    assert (status, answer["errcode"]) == (403, "M_FORBIDDEN")
    await hs.ok(
        "POST",
        "/keys/device_signing/upload",
        {**new.upload_body(), "auth": password_auth(alice.user_id)},
        token=alice.token,
    )
    seen = await hs.ok("POST", "/keys/query", {"device_keys": {alice.user_id: []}}, token=bob.token)
    assert seen["master_keys"][alice.user_id] == new.master_key()


async def test_upload_refusals(homeserver: Homeserver) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    cs = CrossSigning(alice.user_id)
    body = cs.upload_body()
    other = CrossSigning(alice.user_id)
    not_signed = cs.key_object(cs.self_signing, "self_signing")
    wrong_usage = dict(body["master_key"], usage=["self_signing"])
    two_keys = dict(body["master_key"], keys={"ed25519:a": "a", "ed25519:b": "b"})
    bad_id = dict(body["master_key"], keys={"ed25519:x": public(cs.master)})
    for bad in (
        {"self_signing_key": body["self_signing_key"]},  # no master key anywhere
        {"master_key": body["master_key"], "self_signing_key": not_signed},
        {
            "master_key": body["master_key"],
            "self_signing_key": other.upload_body()["self_signing_key"],
        },  # signed by another
        {"master_key": wrong_usage},
        {"master_key": two_keys},
        {"master_key": bad_id},
        {"master_key": dict(body["master_key"], user_id="@bob:test.local")},
        {"master_key": "x"},
    ):
        status, answer = await hs.call(
            "POST", "/keys/device_signing/upload", bad, token=alice.token
        )
        assert status == 400 and answer["errcode"] in ("M_INVALID_PARAM", "M_MISSING_PARAM"), bad
    query = await hs.ok(
        "POST", "/keys/query", {"device_keys": {alice.user_id: []}}, token=alice.token
    )
    assert query["master_keys"] == {}


async def test_signatures_upload_checks_each_signature(homeserver: Homeserver) -> None:
    hs = homeserver
    alice = await hs.register("alice")
    bob = await hs.register("bob")
    device = Device(alice.user_id, alice.device_id)
    device_keys = device.device_keys()
    await hs.ok("POST", "/keys/upload", {"device_keys": device_keys}, token=alice.token)
    cs = CrossSigning(alice.user_id)
    await hs.ok("POST", "/keys/device_signing/upload", cs.upload_body(), token=alice.token)
    bob_cs = CrossSigning(bob.user_id)
    bob_body = bob_cs.upload_body()
    await hs.ok("POST", "/keys/device_signing/upload", bob_body, token=bob.token)

    # Alice's self-signing key signs her device; her user-signing key signs bob's master.
    unsigned_device = {k: v for k, v in device_keys.items() if k != "signatures"}
    signed_device = cs.sign(cs.self_signing, unsigned_device)
    bob_master = bob_body["master_key"]
    signed_bob = cs.sign(cs.user_signing, dict(bob_master))
    forged_bob = cs.sign(CrossSigning(alice.user_id).user_signing, dict(bob_master))
    tampered = dict(unsigned_device, algorithms=["other"])
    tampered = cs.sign(cs.self_signing, tampered)
    before = hs.process.keys.position()
    answer = await hs.ok(
        "POST",
        "/keys/signatures/upload",
        {
            alice.user_id: {alice.device_id: signed_device, "UNKNOWN": signed_device},
            bob.user_id: {public(bob_cs.master): signed_bob},
        },
        token=alice.token,
    )
    assert answer == {
        "failures": {alice.user_id: {"UNKNOWN": {"errcode": "M_NOT_FOUND", "error": "unknown key"}}}
    }
    assert hs.process.keys.position() > before
    answer = await hs.ok(
        "POST",
        "/keys/signatures/upload",
        {
            alice.user_id: {alice.device_id: tampered},
            bob.user_id: {public(bob_cs.master): forged_bob},
        },
        token=alice.token,
    )
    assert answer["failures"][alice.user_id][alice.device_id]["errcode"] == "M_INVALID_SIGNATURE"
    assert answer["failures"][bob.user_id][public(bob_cs.master)]["errcode"] == (
        "M_INVALID_SIGNATURE"
    )
    # The good signatures are merged into /keys/query; the bad ones are nowhere.
    seen = await hs.ok(
        "POST",
        "/keys/query",
        {"device_keys": {alice.user_id: [], bob.user_id: []}},
        token=alice.token,
    )
    device_sigs = seen["device_keys"][alice.user_id][alice.device_id]["signatures"][alice.user_id]
    assert device_sigs == {
        **device_keys["signatures"][alice.user_id],
        **signed_device["signatures"][alice.user_id],
    }
    bob_sigs = seen["master_keys"][bob.user_id]["signatures"][alice.user_id]
    assert bob_sigs == signed_bob["signatures"][alice.user_id]
    assert forged_bob["signatures"][alice.user_id] != bob_sigs
    # Bob cannot sign alice's device with a key he does not have.
    status, answer = await hs.call(
        "POST",
        "/keys/signatures/upload",
        {alice.user_id: {alice.device_id: sign_json(unsigned_device, bob.user_id, cs.master)}},
        token=bob.token,
    )
    assert status == 200
    assert answer["failures"][alice.user_id][alice.device_id]["errcode"] == "M_INVALID_SIGNATURE"
    status, answer = await hs.call(
        "POST", "/keys/signatures/upload", {alice.user_id: "x"}, token=bob.token
    )
    assert (status, answer["errcode"]) == (400, "M_INVALID_PARAM")
