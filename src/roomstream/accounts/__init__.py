"""Accounts: local users, their devices and access tokens, and password checks.

The Client-Server API (:mod:`roomstream.client`) and the ``roomstream register`` command
use :class:`Accounts`; nothing here knows about HTTP.
"""

from roomstream.accounts.service import Accounts, Keep, LoginResult, Requester, parse_user_id
from roomstream.accounts.store import AccountStore

__all__ = ["AccountStore", "Accounts", "Keep", "LoginResult", "Requester", "parse_user_id"]
