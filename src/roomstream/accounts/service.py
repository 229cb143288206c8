"""Registration, login, logout and access-token authentication: the Matrix rules.

Invariants: a user ID is ``@localpart:server_name`` with the localpart from the spec's
grammar (``a-z 0-9 . _ = - / +``, :func:`~roomstream.grammar.is_new_user_id`) and at most
255 bytes in all; passwords are kept only as argon2 hashes; access tokens only as
SHA-256 hashes; every login creates (or reuses, when the client names it) a device and
gives it a fresh token. Guests (``allow_guest_access``) get numeric localparts, which
are reserved for them as in Synapse, no password, and tokens marked as a guest's
(:mod:`~roomstream.accounts.tokens`); upgrading a guest ends every guest token of it. A
deactivated user keeps its row, without a password, so its ID is never reused.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from roomstream.accounts.passwords import hash_password, verify_password
from roomstream.accounts.store import AccountStore, UserExistsError
from roomstream.accounts.token_cache import TOKEN_CACHE, TokenCache
from roomstream.accounts.tokens import (
    is_guest_token,
    new_access_token,
    new_device_id,
    token_hash,
)
from roomstream.caches import stream_invalidation_txn
from roomstream.errors import (
    ForbiddenError,
    GuestAccessForbiddenError,
    InternalServerError,
    InvalidParamError,
    InvalidUsernameError,
    MatrixError,
    MissingParamError,
    MissingTokenError,
    UnauthorizedError,
    UnknownTokenError,
    UserDeactivatedError,
    UserInUseError,
)
from roomstream.grammar import is_new_user_id, is_new_user_localpart, split_user_id
from roomstream.storage import Transaction
from roomstream.streams import StreamIdGenerator

__all__ = [
    "Accounts",
    "Keep",
    "LoginResult",
    "Requester",
    "UserInteractiveAuthRequired",
    "parse_user_id",
]

MAX_PASSWORD_LENGTH = 512
MAX_DEVICE_ID_LENGTH = 255
#: The one user-interactive-auth flow offered for registration.
REGISTRATION_FLOWS = [{"stages": ["m.login.dummy"]}]
#: How long a registration can be answered again through its session (Synapse keeps
#: user-interactive-auth sessions for 48 hours).
REGISTRATION_SESSION_LIFETIME_MS = 48 * 3600 * 1000
MAX_SESSION_LENGTH = 255
#: The flow offered for sensitive actions of a logged-in user.
PASSWORD_FLOWS = [{"stages": ["m.login.password"]}]
#: Guests' localparts: numbers (Synapse's ``GUEST_USER_ID_PATTERN``), reserved for them.
GUEST_LOCALPART_DIGITS = 12


@dataclass(frozen=True, slots=True)
class Keep:
    """What ending all of a user's sessions spares: one device, and of its tokens only
    ``token_hash`` (None: none of them)."""

    device_id: str
    token_hash: str | None


#: Ends sessions on the process that writes the ``caches`` stream: (user, device or
#: None, what to keep when ending all of them).
EndSessions = Callable[[str, str | None, Keep | None], Awaitable[None]]


class UserInteractiveAuthRequired(UnauthorizedError):
    """401 with the flows a client may complete (the spec's user-interactive auth)."""

    def __init__(self, session: str, flows: list[dict[str, Any]]) -> None:
        super().__init__("user-interactive authentication required")
        self.session = session
        self.flows = flows

    def to_json(self) -> dict[str, Any]:
        return {"session": self.session, "flows": self.flows, "params": {}}


@dataclass(frozen=True, slots=True)
class Requester:
    """Who made an authenticated request."""

    user_id: str
    device_id: str
    #: The request came with a guest's token (see :mod:`~roomstream.accounts.tokens`).
    is_guest: bool = False


@dataclass(frozen=True, slots=True)
class LoginResult:
    user_id: str
    device_id: str | None
    access_token: str | None


def parse_user_id(user_id: str) -> tuple[str, str]:
    """(localpart, server name) of a user ID (:func:`~roomstream.grammar.split_user_id`:
    the historical grammar a server must accept); M_INVALID_PARAM if it is not one."""
    parts = split_user_id(user_id)
    if parts is None:
        raise InvalidParamError(f"not a user ID: {user_id[:300]!r}")
    return parts


class Accounts:
    """Local accounts of ``server_name``."""

    def __init__(
        self,
        store: AccountStore,
        server_name: str,
        *,
        registration_enabled: bool = True,
        guest_access_enabled: bool = False,
        token_cache: TokenCache | None = None,
        caches_writer: StreamIdGenerator | None = None,
        forward_end_sessions: EndSessions | None = None,
    ) -> None:
        """``token_cache``: token owners kept in memory (see
        :mod:`~roomstream.accounts.token_cache`); then ending sessions must reach every
        process's cache: through ``caches_writer`` (this process writes the ``caches``
        stream) or else ``forward_end_sessions`` (the writer of that stream does it)."""
        if token_cache is not None and caches_writer is None and forward_end_sessions is None:
            raise ValueError("a token cache needs a way to invalidate it everywhere")
        self.store = store
        self.server_name = server_name
        self.registration_enabled = registration_enabled
        self.guest_access_enabled = guest_access_enabled
        self.token_cache = token_cache
        self._caches_writer = caches_writer
        self._forward_end_sessions = forward_end_sessions
        #: Called with (user, deleted device IDs) after devices were deleted on this
        #: process (not on a process that forwarded the deletion): their keys and
        #: to-device queues go too (roomstream.client composes this).
        self.devices_deleted_listeners: list[Callable[[str, list[str]], Awaitable[None]]] = []
        #: Called with the user after a login renamed one of its existing devices (the
        #: ``device_lists`` stream must say so: roomstream.client composes this).
        self.device_renamed_listeners: list[Callable[[str], Awaitable[None]]] = []

    # -- user IDs ----------------------------------------------------------------------

    def user_id_for(self, localpart: str) -> str:
        localpart = localpart.lower() if localpart.isascii() else localpart
        if not is_new_user_localpart(localpart):
            raise InvalidUsernameError(
                "user names may contain only a-z, 0-9, and the characters . _ = - / +",
            )
        user_id = f"@{localpart}:{self.server_name}"
        if not is_new_user_id(user_id):
            raise InvalidUsernameError("user ID too long")
        return user_id

    def local_user_id(self, user: str) -> str:
        """A user name as given at login (``alice`` or ``@alice:server``) as a user ID."""
        if user.startswith("@"):
            localpart, server = parse_user_id(user)
            if server != self.server_name:
                raise ForbiddenError("invalid username or password")
            return self.user_id_for(localpart)
        return self.user_id_for(user)

    def new_user_id_for(self, localpart: str) -> str:
        """:meth:`user_id_for` a user registering: a numeric localpart is refused
        (``M_INVALID_USERNAME``), being reserved for guests, as in Synapse."""
        user_id = self.user_id_for(localpart)
        if localpart.isascii() and localpart.isdigit():
            raise InvalidUsernameError("numeric user IDs are reserved for guest users")
        return user_id

    async def is_available(self, localpart: str) -> bool:
        user_id = self.new_user_id_for(localpart)
        if await self.store.get_user(user_id) is not None:
            raise UserInUseError("user ID already taken")
        return True

    # -- registration ------------------------------------------------------------------

    async def register(
        self,
        localpart: str | None,
        password: str | None,
        *,
        auth: dict[str, Any] | None,
        device_id: str | None = None,
        display_name: str | None = None,
        inhibit_login: bool = False,
        guest: bool = False,
        guest_access_token: str | None = None,
    ) -> LoginResult:
        """Register through user-interactive auth (one ``m.login.dummy`` stage).

        ``guest``: a guest account instead (:meth:`register_guest`; 403
        ``M_GUEST_ACCESS_FORBIDDEN`` while guest access is off). ``guest_access_token``:
        upgrade the guest that token belongs to into a full account with ``password``
        (``localpart``, if given, must be the guest's own), as Synapse; its guest
        sessions end, and the answer logs in afresh (unless ``inhibit_login``).

        The user name and password are checked before the auth stage, as Synapse does, so
        a client learns of a taken name before completing auth.

        A retry through a session that already completed a registration (the client lost
        the first answer) answers that registration again, as Synapse does: the same
        user, logged in afresh, never ``M_USER_IN_USE``. The retry must carry the
        account's password (when it has one), so it grants nothing a login would not.
        """
        if guest:
            return await self.register_guest(display_name)
        if not self.registration_enabled:
            raise ForbiddenError("registration has been disabled")
        _check_password(password)
        session = _auth_session(auth)
        if session is not None:
            registered = await self.store.registered_by_session(
                session, _registration_sessions_since()
            )
            if registered is not None:
                return await self._registered_again(
                    registered, password, device_id, display_name, inhibit_login
                )
        upgrading = None
        if guest_access_token is not None:
            upgrading = await self._guest_to_upgrade(guest_access_token, localpart)
        if localpart is not None and upgrading is None:
            user_id = self.new_user_id_for(localpart)
            if await self.store.get_user(user_id) is not None:
                raise UserInUseError("user ID already taken")
        if not isinstance(auth, dict) or auth.get("type") != "m.login.dummy":
            session = auth.get("session") if isinstance(auth, dict) else None
            if not isinstance(session, str) or not session:
                session = secrets.token_urlsafe(18)
            raise UserInteractiveAuthRequired(session, REGISTRATION_FLOWS)
        if upgrading is not None:
            return await self._upgrade_guest(
                upgrading, password, device_id, display_name, inhibit_login, session
            )
        return await self.create_account(
            localpart,
            password,
            device_id=device_id,
            display_name=display_name,
            inhibit_login=inhibit_login,
            registration_session=session,
        )

    async def register_guest(self, display_name: str | None = None) -> LoginResult:
        """A new guest account, logged in (``POST /register?kind=guest``): a numeric
        localpart, no password, a token marked as a guest's on a new device (guests do
        not choose their device ID, as in Synapse). Not closed by
        ``enable_registration`` (as in Synapse), only by guest access being off."""
        if not self.guest_access_enabled:
            raise GuestAccessForbiddenError("guest access is disabled")
        for _ in range(10):
            localpart = str(
                secrets.randbelow(9 * 10 ** (GUEST_LOCALPART_DIGITS - 1))
                + 10 ** (GUEST_LOCALPART_DIGITS - 1)
            )
            user_id = self.user_id_for(localpart)
            try:
                await self.store.create_user(user_id, None, False, is_guest=True)
            except UserExistsError:
                continue
            return await self._new_session(user_id, None, display_name, guest=True)
        raise InternalServerError("could not pick a free guest user ID")  # pragma: no cover

    async def _guest_to_upgrade(self, guest_access_token: str, localpart: str | None) -> str:
        """The active guest ``guest_access_token`` belongs to, which ``localpart`` (if
        given) must name; 403 ``M_FORBIDDEN`` otherwise (Synapse's words)."""
        owner = None
        if is_guest_token(guest_access_token):
            owner = await self.store.get_token_owner(token_hash(guest_access_token))
        record = None if owner is None else await self.store.get_user(owner[0])
        if (
            record is None
            or not record.is_guest
            or (localpart is not None and self._names(localpart) != record.user_id)
        ):
            raise ForbiddenError(
                "cannot register taken user ID without valid guest credentials for that user"
            )
        return record.user_id

    async def _upgrade_guest(
        self,
        user_id: str,
        password: str | None,
        device_id: str | None,
        display_name: str | None,
        inhibit_login: bool,
        session: str | None,
    ) -> LoginResult:
        """The guest ``user_id`` becomes a full account (its row stays, with the
        password); then every session it had as a guest ends, so no guest token
        outlives the upgrade (:mod:`~roomstream.accounts.tokens`)."""
        password_hash = None if password is None else await hash_password(password)
        registered = await self.store.upgrade_guest(
            user_id,
            password_hash,
            registration_session=session,
            session_since_ms=_registration_sessions_since(),
        )
        if registered is None:
            raise ForbiddenError("this guest account can no longer be upgraded")
        if registered != user_id:
            return await self._registered_again(
                registered, password, device_id, display_name, inhibit_login
            )
        await self.end_sessions(user_id, None)
        if inhibit_login:
            return LoginResult(user_id, None, None)
        return await self._new_session(user_id, device_id, display_name)

    async def _registered_again(
        self,
        user_id: str,
        password: str | None,
        device_id: str | None,
        display_name: str | None,
        inhibit_login: bool,
    ) -> LoginResult:
        """The answer to a registration retried through its completed session."""
        record = await self.store.get_user(user_id)
        if record is None or record.deactivated:
            raise ForbiddenError("the registration of this session has ended")
        if record.password_hash is not None and (
            password is None or not await verify_password(record.password_hash, password)
        ):
            raise ForbiddenError("invalid username or password")
        if inhibit_login:
            return LoginResult(user_id, None, None)
        return await self._new_session(user_id, device_id, display_name)

    async def create_account(
        self,
        localpart: str | None,
        password: str | None,
        *,
        admin: bool = False,
        device_id: str | None = None,
        display_name: str | None = None,
        inhibit_login: bool = True,
        registration_session: str | None = None,
    ) -> LoginResult:
        """Create a user (no auth stage: for operators and after UIA); optionally log in.

        ``registration_session``: the completed user-interactive-auth session, remembered
        with the user; if a concurrent request through it registered first, that
        registration is answered instead (:meth:`register`)."""
        _check_password(password)
        password_hash = None if password is None else await hash_password(password)
        for _ in range(10):
            name = localpart if localpart is not None else "u" + secrets.token_hex(6)
            user_id = self.user_id_for(name)
            try:
                registered = await self.store.create_user(
                    user_id,
                    password_hash,
                    admin,
                    registration_session=registration_session,
                    session_since_ms=_registration_sessions_since(),
                )
            except UserExistsError:
                if localpart is not None:
                    raise UserInUseError("user ID already taken") from None
                continue
            if registered != user_id:
                return await self._registered_again(
                    registered, password, device_id, display_name, inhibit_login
                )
            break
        else:  # pragma: no cover - 48 random bits colliding ten times
            raise InternalServerError("could not pick a free user ID")
        if inhibit_login:
            return LoginResult(user_id, None, None)
        return await self._new_session(user_id, device_id, display_name)

    # -- login and logout --------------------------------------------------------------

    async def login_with_password(
        self,
        user: str,
        password: str,
        *,
        device_id: str | None = None,
        display_name: str | None = None,
    ) -> LoginResult:
        """``m.login.password``: M_FORBIDDEN (403) for any wrong user or password."""
        _check_password(password)
        user_id = self.local_user_id(user)
        record = await self.store.get_user(user_id)
        if record is not None and record.deactivated:
            # As Synapse: a deactivated account says so (it has no password left to check).
            raise UserDeactivatedError("this account has been deactivated")
        if record is None or record.password_hash is None:
            raise ForbiddenError("invalid username or password")
        if not await verify_password(record.password_hash, password):
            raise ForbiddenError("invalid username or password")
        return await self._new_session(user_id, device_id, display_name)

    async def _new_session(
        self,
        user_id: str,
        device_id: str | None,
        display_name: str | None,
        *,
        guest: bool = False,
    ) -> LoginResult:
        if device_id is not None and not 0 < len(device_id) <= MAX_DEVICE_ID_LENGTH:
            raise InvalidParamError("device_id must be 1-255 characters")
        device_id = device_id or new_device_id()
        token = new_access_token(guest=guest)
        if await self.store.login_device(user_id, device_id, display_name, token_hash(token)):
            for listener in self.device_renamed_listeners:
                await listener(user_id)
        return LoginResult(user_id, device_id, token)

    async def require_password_auth(self, user_id: str, auth: dict[str, Any] | None) -> None:
        """User-interactive auth with one ``m.login.password`` stage for a sensitive action
        of ``user_id`` (deleting devices, replacing cross-signing keys): 401 with the flow
        until ``auth`` holds this user's password; a wrong password is 403 M_FORBIDDEN."""
        if not isinstance(auth, dict) or auth.get("type") != "m.login.password":
            session = auth.get("session") if isinstance(auth, dict) else None
            if not isinstance(session, str) or not session:
                session = secrets.token_urlsafe(18)
            raise UserInteractiveAuthRequired(session, PASSWORD_FLOWS)
        identifier = auth.get("identifier")
        named = identifier.get("user") if isinstance(identifier, dict) else auth.get("user")
        password = auth.get("password")
        if not isinstance(password, str) or (
            named is not None and (not isinstance(named, str) or self._names(named) != user_id)
        ):
            raise ForbiddenError("invalid username or password")
        record = await self.store.get_user(user_id)
        if (
            record is None
            or record.password_hash is None
            or not await verify_password(record.password_hash, password)
        ):
            raise ForbiddenError("invalid username or password")

    def _names(self, user: str) -> str | None:
        try:
            return self.local_user_id(user)
        except MatrixError:
            return None

    async def authenticate(self, access_token: str | None) -> Requester:
        """The owner of a token: M_MISSING_TOKEN / M_UNKNOWN_TOKEN (401) otherwise."""
        if not access_token:
            raise MissingTokenError("missing access token")
        hashed = token_hash(access_token)
        cache = self.token_cache
        if cache is None or not cache.trusted():
            owner = await self.store.get_token_owner(hashed)
        else:
            owner = cache.get(hashed)
            if owner is None:
                generation = cache.generation
                owner = await self.store.get_token_owner(hashed)
                if owner is not None:
                    cache.put(hashed, owner, generation)
        if owner is None:
            raise UnknownTokenError("unknown or expired access token")
        return Requester(owner[0], owner[1], is_guest_token(access_token))

    async def logout(self, requester: Requester) -> None:
        await self.end_sessions(requester.user_id, requester.device_id)

    async def logout_all(self, requester: Requester) -> None:
        await self.end_sessions(requester.user_id, None)

    async def end_sessions(
        self, user_id: str, device_id: str | None, keep: Keep | None = None
    ) -> None:
        """Delete one device of ``user_id`` (None: all of them, or all but ``keep``'s
        device and token) with its tokens, end the tokens in every process's token cache
        (see the constructor), and tell :attr:`devices_deleted_listeners` where the
        deletion happens."""
        if keep is not None and device_id is not None:
            raise ValueError("keep applies to ending all of a user's sessions")
        devices = await self._end_sessions(user_id, device_id, keep)
        for listener in self.devices_deleted_listeners:
            if devices:
                await listener(user_id, devices)

    async def _end_sessions(
        self, user_id: str, device_id: str | None, keep: Keep | None
    ) -> list[str]:
        """The devices deleted here ([] when forwarded: the writer tells its listeners)."""
        cache = self.token_cache
        if cache is None:
            return await self._delete_sessions(user_id, device_id, keep, None)
        writer = self._caches_writer
        if writer is None:
            assert self._forward_end_sessions is not None
            await self._forward_end_sessions(user_id, device_id, keep)
            devices = []
        else:
            instance = writer.instance_name
            async with writer.reserve() as stream_id:

                def invalidation(txn: Transaction) -> None:
                    stream_invalidation_txn(txn, stream_id, instance, TOKEN_CACHE, [user_id])

                devices = await self._delete_sessions(user_id, device_id, keep, invalidation)
        # This process's cache at once (other processes: when the row reaches them).
        cache.invalidate_user(user_id)
        return devices

    async def _delete_sessions(
        self,
        user_id: str,
        device_id: str | None,
        keep: Keep | None,
        also: Callable[[Transaction], None] | None,
    ) -> list[str]:
        if device_id is not None:
            await self.store.delete_device(user_id, device_id, also)
            return [device_id]
        if keep is not None:
            return await self.store.delete_other_sessions(
                user_id, keep.device_id, keep.token_hash, also
            )
        devices = [d for d, _ in await self.store.get_devices(user_id)]
        await self.store.delete_all_devices(user_id, also)
        return devices

    # -- account management ------------------------------------------------------------

    async def change_password(
        self,
        requester: Requester,
        access_token: str,
        new_password: str | None,
        auth: dict[str, Any] | None,
        *,
        logout_devices: bool = True,
    ) -> None:
        """``POST /account/password``: user-interactive auth with the current password
        (:meth:`require_password_auth`), then the new one, hashed as at registration;
        unless ``logout_devices`` is false, every other device is logged out, and every
        other token of the requester's device, as Synapse does: the requesting token
        stays."""
        _check_password(new_password)
        await self.require_password_auth(requester.user_id, auth)
        if new_password is None:
            raise MissingParamError("missing new_password")
        if not await self.store.set_password_hash(
            requester.user_id, await hash_password(new_password)
        ):
            raise ForbiddenError("no such active user")  # pragma: no cover - its token works
        if logout_devices:
            keep = Keep(requester.device_id, token_hash(access_token))
            await self.end_sessions(requester.user_id, None, keep)

    async def deactivate(self, user_id: str) -> None:
        """Mark the account deactivated (no password, never logs in again: 403
        ``M_USER_DEACTIVATED``) and end all its sessions, with their devices' keys and
        to-device queues. Leaving its rooms is the caller's (roomstream.client)."""
        await self.store.deactivate_user(user_id)
        await self.end_sessions(user_id, None)


def _auth_session(auth: dict[str, Any] | None) -> str | None:
    """The user-interactive-auth session a request names, if any (one longer than any
    this server issues is not remembered)."""
    session = auth.get("session") if isinstance(auth, dict) else None
    if isinstance(session, str) and 0 < len(session) <= MAX_SESSION_LENGTH:
        return session
    return None


def _registration_sessions_since() -> int:
    """The oldest creation time (ms) of a registration still answered through its session."""
    return int(time.time() * 1000) - REGISTRATION_SESSION_LIFETIME_MS


def _check_password(password: str | None) -> None:
    if password is not None and (not password or len(password) > MAX_PASSWORD_LENGTH):
        raise InvalidParamError(f"password must be 1-{MAX_PASSWORD_LENGTH} characters")
