"""Registration, login, logout and access-token authentication: the Matrix rules.

Invariants: a user ID is ``@localpart:server_name`` with the localpart from the spec's
grammar (``a-z 0-9 . _ = - / +``, :func:`~roomstream.grammar.is_new_user_id`) and at most
255 bytes in all; passwords are kept only as argon2 hashes; access tokens only as
SHA-256 hashes; every login creates (or reuses, when the client names it) a device and
gives it a fresh token.
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
from roomstream.accounts.tokens import new_access_token, new_device_id, token_hash
from roomstream.caches import stream_invalidation_txn
from roomstream.errors import (
    ForbiddenError,
    GuestAccessForbiddenError,
    InternalServerError,
    InvalidParamError,
    InvalidUsernameError,
    MatrixError,
    MissingTokenError,
    UnauthorizedError,
    UnknownTokenError,
    UserInUseError,
)
from roomstream.grammar import is_new_user_id, is_new_user_localpart, split_user_id
from roomstream.storage import Transaction
from roomstream.streams import StreamIdGenerator

__all__ = [
    "Accounts",
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


#: Ends sessions on the process that writes the ``caches`` stream: (user, device or None).
EndSessions = Callable[[str, str | None], Awaitable[None]]


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

    async def is_available(self, localpart: str) -> bool:
        user_id = self.user_id_for(localpart)
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
    ) -> LoginResult:
        """Register through user-interactive auth (one ``m.login.dummy`` stage).

        The user name and password are checked before the auth stage, as Synapse does, so
        a client learns of a taken name before completing auth.

        A retry through a session that already completed a registration (the client lost
        the first answer) answers that registration again, as Synapse does: the same
        user, logged in afresh, never ``M_USER_IN_USE``. The retry must carry the
        account's password (when it has one), so it grants nothing a login would not.
        """
        if guest:
            raise GuestAccessForbiddenError("guest access is disabled")
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
        if localpart is not None:
            user_id = self.user_id_for(localpart)
            if await self.store.get_user(user_id) is not None:
                raise UserInUseError("user ID already taken")
        if not isinstance(auth, dict) or auth.get("type") != "m.login.dummy":
            session = auth.get("session") if isinstance(auth, dict) else None
            if not isinstance(session, str) or not session:
                session = secrets.token_urlsafe(18)
            raise UserInteractiveAuthRequired(session, REGISTRATION_FLOWS)
        return await self.create_account(
            localpart,
            password,
            device_id=device_id,
            display_name=display_name,
            inhibit_login=inhibit_login,
            registration_session=session,
        )

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
        if record is None or record.password_hash is None or record.deactivated:
            raise ForbiddenError("invalid username or password")
        if not await verify_password(record.password_hash, password):
            raise ForbiddenError("invalid username or password")
        return await self._new_session(user_id, device_id, display_name)

    async def _new_session(
        self, user_id: str, device_id: str | None, display_name: str | None
    ) -> LoginResult:
        if device_id is not None and not 0 < len(device_id) <= MAX_DEVICE_ID_LENGTH:
            raise InvalidParamError("device_id must be 1-255 characters")
        device_id = device_id or new_device_id()
        token = new_access_token()
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
        return Requester(*owner)

    async def logout(self, requester: Requester) -> None:
        await self.end_sessions(requester.user_id, requester.device_id)

    async def logout_all(self, requester: Requester) -> None:
        await self.end_sessions(requester.user_id, None)

    async def end_sessions(self, user_id: str, device_id: str | None) -> None:
        """Delete one device of ``user_id`` (None: all of them) with its tokens, end the
        tokens in every process's token cache (see the constructor), and tell
        :attr:`devices_deleted_listeners` where the deletion happens."""
        forwarded = self.token_cache is not None and self._caches_writer is None
        if forwarded or device_id is not None:
            devices = [] if forwarded or device_id is None else [device_id]
        else:
            devices = [d for d, _ in await self.store.get_devices(user_id)]
        await self._end_sessions(user_id, device_id)
        for listener in self.devices_deleted_listeners:
            if devices:
                await listener(user_id, devices)

    async def _end_sessions(self, user_id: str, device_id: str | None) -> None:
        cache = self.token_cache
        if cache is None:
            await self._delete_sessions(user_id, device_id, None)
            return
        writer = self._caches_writer
        if writer is None:
            assert self._forward_end_sessions is not None
            await self._forward_end_sessions(user_id, device_id)
        else:
            instance = writer.instance_name
            async with writer.reserve() as stream_id:

                def invalidation(txn: Transaction) -> None:
                    stream_invalidation_txn(txn, stream_id, instance, TOKEN_CACHE, [user_id])

                await self._delete_sessions(user_id, device_id, invalidation)
        # This process's cache at once (other processes: when the row reaches them).
        cache.invalidate_user(user_id)

    async def _delete_sessions(
        self, user_id: str, device_id: str | None, also: Callable[[Transaction], None] | None
    ) -> None:
        if device_id is None:
            await self.store.delete_all_devices(user_id, also)
        else:
            await self.store.delete_device(user_id, device_id, also)


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
