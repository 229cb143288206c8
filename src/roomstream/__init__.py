"""roomstream: the room-event engine of a Matrix-style homeserver.

Packages, in dependency order (each may only import those before it):

- ``roomstream.storage``: one async database interface, SQLite and PostgreSQL engines.
- ``roomstream.streams``: stream ID generators, stream definitions, change caches.
- ``roomstream.events`` / ``roomstream.state``: room events, authorization, state.
- ``roomstream.replication``, ``roomstream.api``, ``roomstream.pipelines``: keeping
  processes informed, serving clients, and bulk work on Spark.
"""

__version__ = "0.1.0"
