"""What a guest may call: Synapse's guest-allowed endpoints, as roomstream serves them.

Guest access (``allow_guest_access: true``; off by default, as in Synapse) gives
``POST /register?kind=guest`` an account with a numeric user ID, no password and a
guest's access token (:mod:`roomstream.accounts.tokens`). With that token only the
routes below answer; every other authenticated route is ``403 M_GUEST_ACCESS_FORBIDDEN``
(:func:`roomstream.client.server.authenticate`). The list is Synapse's: the servlets that
authenticate with ``allow_guest=True`` (``synapse/rest/client``), restricted to the routes
roomstream has. What a guest may then do in a room is further bounded:

- joining needs the room's ``m.room.guest_access`` to be ``can_join`` (403 ``M_FORBIDDEN``
  otherwise, Synapse's answer), and the join event says ``"kind": "guest"``
  (:meth:`roomstream.client.rooms.RoomService.join`);
- reading (``/messages``, ``/event``, ``/context``, ``/state``, ``/members``,
  ``/initialSync``) follows the history visibility rules as for anyone: a room the guest
  joined, or a ``world_readable`` one;
- membership changes other than joining and leaving (invite, kick, ban, unban) are
  refused with the rest (Synapse lets the request in and refuses it with
  ``M_FORBIDDEN``).

Entries are ``(method, path)`` exactly as the route declares its path (after
``/_matrix/client/{version}``, or absolute); ``tests/client/test_guests.py`` checks that
each names a route that exists.
"""

from __future__ import annotations

__all__ = ["GUEST_ROUTES"]

_STATE = "/rooms/{room_id}/state/{event_type}"

GUEST_ROUTES: frozenset[tuple[str, str]] = frozenset(
    {
        # sync, and sliding sync (unstable and stable paths)
        ("GET", "/sync"),
        ("POST", "/_matrix/client/unstable/org.matrix.simplified_msc3575/sync"),
        ("POST", "/_matrix/client/v4/sync"),
        # the account and its devices, to-device messages and keys
        ("GET", "/account/whoami"),
        ("GET", "/capabilities"),
        ("GET", "/devices"),
        ("GET", "/devices/{device_id}"),
        ("PUT", "/devices/{device_id}"),
        ("PUT", "/sendToDevice/{event_type}/{txn_id}"),
        ("POST", "/keys/upload"),
        ("POST", "/keys/upload/{device_id}"),
        ("POST", "/keys/query"),
        ("POST", "/keys/claim"),
        ("GET", "/keys/changes"),
        ("POST", "/keys/signatures/upload"),
        # rooms: join and leave, read, send
        ("POST", "/join/{room}"),
        ("POST", "/rooms/{room_id}/join"),
        ("POST", "/rooms/{room_id}/leave"),
        ("GET", "/joined_rooms"),
        ("GET", "/publicRooms"),
        ("POST", "/publicRooms"),
        ("GET", "/rooms/{room_id}/members"),
        ("GET", "/rooms/{room_id}/messages"),
        ("GET", "/rooms/{room_id}/state"),
        ("GET", "/rooms/{room_id}/initialSync"),
        ("GET", "/rooms/{room_id}/event/{event_id}"),
        ("GET", "/rooms/{room_id}/context/{event_id}"),
        ("GET", _STATE),
        ("GET", _STATE + "/{state_key:.*}"),
        ("PUT", _STATE),
        ("PUT", _STATE + "/{state_key:.*}"),
        ("PUT", "/rooms/{room_id}/send/{event_type}/{txn_id}"),
        ("POST", "/rooms/{room_id}/send/{event_type}"),
        # discovery answered as Synapse answers it unconfigured
        ("GET", "/voip/turnServer"),
        ("GET", "/thirdparty/protocols"),
        ("GET", "/thirdparty/protocol/{protocol}"),
        ("GET", "/thirdparty/user"),
        ("GET", "/thirdparty/user/{protocol}"),
        ("GET", "/thirdparty/location"),
        ("GET", "/thirdparty/location/{protocol}"),
    }
)
