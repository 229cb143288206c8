"""Simplified sliding sync (MSC4186) without HTTP: the request model and its validation
(:mod:`~roomstream.sliding.request`), the per-connection memory of what was sent
(:mod:`~roomstream.sliding.connections`) and the room-list reads
(:mod:`~roomstream.sliding.store`). :mod:`roomstream.client.sliding_sync` serves it,
with timelines and visibility from the read path."""
