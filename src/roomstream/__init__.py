"""roomstream: a Matrix homeserver built on streams, replication and room event storage.

Packages, top to bottom; each may import only those below it (packages on one line
import neither each other). ``pyproject.toml``'s import-linter contract states the same
order and ``make lint`` checks it (README, "Layout"):

- ``cli``: the command line;
- ``demo`` (the demo traffic of ``roomstream run --demo``), ``devtools`` (corpora for
  tests and benchmarks);
- ``homeserver``: the process, assembled in one place;
- ``client``: the Matrix Client-Server API;
- ``replication``, ``pipelines`` (Spark), ``sliding`` (sliding sync's model);
- ``reading`` (the read side), ``accounts`` (users, devices, tokens);
- ``rooms``: persisting and creating room events;
- ``state``, ``caches``, ``listener`` (aiohttp listeners with limits);
- ``events``, ``config``;
- ``streams``;
- ``storage``;
- ``errors``, ``metrics``, ``exactjson``, ``glob``, ``grammar`` (identifier grammars).
"""

__version__ = "0.1.0"
