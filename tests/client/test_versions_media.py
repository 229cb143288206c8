"""/versions says authenticated media is served, as Synapse does: "v1.11" (the version
clients such as Hydrogen look for before using /_matrix/client/v1/media; without it their
images stay blank, the legacy endpoints being frozen) and MSC3916's stable flag. The
Hydrogen scenario (tests/web/test_hydrogen.py, images) shows the consequence end to end."""

from __future__ import annotations

from tests.support.homeserver import Homeserver


async def test_versions_advertise_authenticated_media(homeserver: Homeserver) -> None:
    versions = await homeserver.ok("GET", "/_matrix/client/versions")
    assert "v1.11" in versions["versions"]
    # v1.7 to v1.10 are not claimed (not checked as a whole yet).
    assert not {"v1.7", "v1.8", "v1.9", "v1.10"} & set(versions["versions"])
    assert versions["unstable_features"]["org.matrix.msc3916.stable"] is True
    # The endpoints a client then uses answer with a token, and only with one.
    status, _ = await homeserver.call("GET", "/_matrix/client/v1/media/config")
    assert status == 401
