"""Tools for developing and measuring roomstream, never imported by a running server.

- :mod:`~roomstream.devtools.corpus`: deterministic corpora of signed PDUs (with forks,
  rejections and malformed lines) for tests, benchmarks and ``roomstream generate``.

The import-linter contract in ``pyproject.toml`` keeps the runtime packages from
importing this one; only the command line (``roomstream generate``) does.
"""
