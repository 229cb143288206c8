"""The Matrix Server-Server API: roomstream talking to other homeservers.

Layering: this package sits above the Client-Server API (:mod:`roomstream.client`), whose
services (typing, receipts, presence, devices, profiles, the directory) inbound EDUs and
queries reach, and below the process assembly (:mod:`roomstream.homeserver`). The
Client-Server API never imports it: what a client request needs from another server
(joining a remote room, resolving a remote alias) reaches the client layer through
interfaces it declares and the assembly fills in.

Inside, as elsewhere, protocols come without I/O: pure codecs (the ``X-Matrix``
authorization header, transactions, server discovery's decisions) with transports around
them (the outbound :class:`FederationClient`, the TLS listener).
"""
