"""The federation media answer as Synapse reads it: our ``multipart/mixed`` framing fed to
Synapse's own parser of authenticated federation media (``synapse.http.client.
_MultipartParserProtocol``, what a Synapse server runs on our answer), with the content
in any chunking, gives back the exact content, its type and its disposition, and the
JSON part ``{}``."""

from __future__ import annotations

import io
import tempfile
import uuid
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from synapse.http.client import MultipartResponse, _MultipartParserProtocol
from twisted.internet import defer
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone

from roomstream.federation.queries import MediaAnswer
from roomstream.media import Download
from roomstream.media.blobs import Blob
from roomstream.media.safety import download_headers

MEDIA_TYPES = ["application/octet-stream", "image/png", "text/plain", "video/mp4", "text/html"]
NAMES = [None, "notes.bin", "a b.txt", "résumé.pdf", 'x;y="z".png']


def parse_as_synapse(
    head: bytes, data: bytes, tail: bytes, boundary: str, cuts: list[int]
) -> tuple[object, bytes]:
    """Feed the answer as our handler writes it: the head in one write (Synapse's
    parser takes each header value whole from one read), the content in pieces cut at
    ``cuts``, the tail."""
    out = io.BytesIO()
    done: defer.Deferred[object] = defer.Deferred()
    results: list[object] = []
    done.addCallbacks(results.append, results.append)
    parser = _MultipartParserProtocol(out, done, boundary, None)
    parser.dataReceived(head)
    start = 0
    for cut in [*sorted(c % (len(data) + 1) for c in cuts), len(data)]:
        if cut > start:
            parser.dataReceived(data[start:cut])
            start = cut
    parser.dataReceived(tail)
    parser.connectionLost(Failure(ResponseDone()))
    (result,) = results
    return result, out.getvalue()


@settings(max_examples=150, deadline=None)
@given(
    data=st.binary(max_size=3000)
    | st.sampled_from([b"", b"\r\n--", b"--x\r\n\r\n--x--\r\n", b"\r\n" * 50]),
    media_type=st.sampled_from(MEDIA_TYPES),
    name=st.sampled_from(NAMES),
    cuts=st.lists(st.integers(min_value=0, max_value=5000), max_size=6),
)
def test_synapse_reads_our_media_answer(
    data: bytes, media_type: str, name: str | None, cuts: list[int]
) -> None:
    with tempfile.TemporaryDirectory() as where:
        path = Path(where) / "content"
        path.write_bytes(data)
        answer = MediaAnswer(Download(Blob(len(data), path), media_type, name), uuid.uuid4().hex)
        head, tail = answer.head(), answer.tail()
    assert len(head) + len(data) + len(tail) == answer.length
    assert answer.content_type == f"multipart/mixed; boundary={answer.boundary}"
    result, content = parse_as_synapse(head, data, tail, answer.boundary, cuts)
    assert isinstance(result, MultipartResponse), result
    headers = download_headers(media_type, name)
    assert content == data
    assert result.json == b"{}"
    assert result.content_type == headers["Content-Type"].encode()
    assert result.disposition == headers["Content-Disposition"].encode()
    assert result.url is None and result.length == len(data)
