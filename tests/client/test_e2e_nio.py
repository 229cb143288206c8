"""matrix-nio against a real ``roomstream run`` process (SQLite and PostgreSQL): its
device management calls, and keys upload / query / claim built by nio's own ``Api`` and
parsed by its response classes (their JSON schemas). nio's Olm machine needs
``python-olm``, which the virtualenv does not have, so the keys are signed here."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from nio import (
    Api,
    AsyncClient,
    DeleteDevicesAuthResponse,
    DeleteDevicesResponse,
    DevicesResponse,
    KeysClaimResponse,
    KeysQueryResponse,
    KeysUploadResponse,
    LoginResponse,
    RegisterResponse,
    SyncResponse,
    UpdateDeviceResponse,
)

from tests.support.e2e_keys import Device
from tests.support.homeserver import RunningServer


@pytest.fixture
async def pair(running_server: RunningServer) -> AsyncIterator[tuple[AsyncClient, AsyncClient]]:
    server = running_server.server_name
    alice = AsyncClient(running_server.url, f"@alice:{server}")
    bob = AsyncClient(running_server.url, f"@bob:{server}")
    try:
        yield alice, bob
    finally:
        await alice.close()
        await bob.close()


async def test_keys_and_devices_with_nio(pair: tuple[AsyncClient, AsyncClient]) -> None:
    alice, bob = pair
    assert isinstance(await alice.register("alice", "alice-pw", "laptop"), RegisterResponse)
    assert isinstance(await bob.register("bob", "bob-pw"), RegisterResponse)
    # A second device for alice, named at login.
    phone = AsyncClient(alice.homeserver, alice.user_id)
    try:
        assert isinstance(await phone.login("alice-pw", device_name="phone"), LoginResponse)
        device = Device(alice.user_id, alice.device_id)
        method, path, data = Api.keys_upload(
            alice.access_token,
            {"device_keys": device.device_keys(), "one_time_keys": device.one_time_keys(["a"])},
        )
        uploaded = await alice._send(KeysUploadResponse, method, path, data)
        assert isinstance(uploaded, KeysUploadResponse), uploaded
        assert uploaded.signed_curve25519_count == 1

        method, path, data = Api.keys_query(bob.access_token, {alice.user_id})
        queried = await bob._send(KeysQueryResponse, method, path, data)
        assert isinstance(queried, KeysQueryResponse), queried
        got = queried.device_keys[alice.user_id][alice.device_id]
        assert got["keys"] == device.device_keys()["keys"]
        assert got["unsigned"] == {"device_display_name": "laptop"}

        method, path, data = Api.keys_claim(bob.access_token, {alice.user_id: [alice.device_id]})
        claimed = await bob._send(KeysClaimResponse, method, path, data)
        assert isinstance(claimed, KeysClaimResponse), claimed
        assert claimed.one_time_keys == {
            alice.user_id: {alice.device_id: device.one_time_keys(["a"])}
        }
        synced = await alice.sync(timeout=0)
        assert isinstance(synced, SyncResponse), synced
        assert synced.device_key_count.signed_curve25519 == 0

        devices = await alice.devices()
        assert isinstance(devices, DevicesResponse), devices
        names = {d.id: d.display_name for d in devices.devices}
        assert names == {alice.device_id: "laptop", phone.device_id: "phone"}
        renamed = await alice.update_device(phone.device_id, {"display_name": "old phone"})
        assert isinstance(renamed, UpdateDeviceResponse), renamed
        # Deleting asks for the password first (user-interactive auth), then deletes.
        asked = await alice.delete_devices([phone.device_id])
        assert isinstance(asked, DeleteDevicesAuthResponse), asked
        auth = {
            "type": "m.login.password",
            "user": alice.user_id,
            "password": "alice-pw",
            "session": asked.session,
        }
        deleted = await alice.delete_devices([phone.device_id], auth)
        assert isinstance(deleted, DeleteDevicesResponse), deleted
        devices = await alice.devices()
        assert isinstance(devices, DevicesResponse)
        assert [d.id for d in devices.devices] == [alice.device_id]
    finally:
        await phone.close()
