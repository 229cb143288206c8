"""What makes serving users' files to browsers safe, as Synapse learned it: the headers
of every download and thumbnail (:func:`download_headers`), and what an upload's
declared type and name may be (:func:`check_media_type`, :func:`check_upload_name`).

Invariants: content is shown inline only for the types of :data:`INLINE_CONTENT_TYPES`
(anything else, SVG and HTML included, is an attachment); every answer forbids scripts
and sniffing (:data:`SECURITY_HEADERS`); every header value is printable ASCII (names are
percent-encoded), so no stored value can break a header.
"""

from __future__ import annotations

import urllib.parse

from roomstream.errors import InvalidParamError

__all__ = [
    "CONTENT_SECURITY_POLICY",
    "INLINE_CONTENT_TYPES",
    "SECURITY_HEADERS",
    "check_media_type",
    "check_upload_name",
    "content_disposition",
    "download_headers",
]

#: Text types whose answers say ``charset=UTF-8`` when the upload said no charset.
TEXT_CONTENT_TYPES = frozenset(
    {
        "text/css",
        "text/csv",
        "text/html",
        "text/calendar",
        "text/plain",
        "text/javascript",
        "application/json",
        "application/ld+json",
        "application/rtf",
        "image/svg+xml",
        "text/xml",
    }
)

#: Types a browser may show inline (Synapse's list, from matrix-react-sdk's); SVG is
#: deliberately absent (it can carry script).
INLINE_CONTENT_TYPES = frozenset(
    {
        "text/css",
        "text/plain",
        "text/csv",
        "application/json",
        "application/ld+json",
        "image/jpeg",
        "image/gif",
        "image/png",
        "image/apng",
        "image/webp",
        "image/avif",
        "video/mp4",
        "video/webm",
        "video/ogg",
        "video/quicktime",
        "audio/mp4",
        "audio/webm",
        "audio/aac",
        "audio/mpeg",
        "audio/ogg",
        "audio/wave",
        "audio/wav",
        "audio/x-wav",
        "audio/x-pn-wav",
        "audio/flac",
        "audio/x-flac",
    }
)

CONTENT_SECURITY_POLICY = (
    "sandbox; default-src 'none'; script-src 'none'; plugin-types application/pdf;"
    " style-src 'unsafe-inline'; media-src 'self'; object-src 'self';"
)

#: On every download and thumbnail.
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    # The same for IE11's non-standard header.
    "X-Content-Security-Policy": "sandbox;",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # Clients on other origins (web clients) may embed it.
    "Cross-Origin-Resource-Policy": "cross-origin",
    # Media is immutable: clients may keep it; proxies must ask again (authentication).
    "Cache-Control": "public,max-age=86400,s-maxage=0,proxy-revalidate",
    "X-Robots-Tag": "noindex, nofollow, noarchive, noimageindex",
}

#: RFC 2616 separators: a name with one of these (or a space, control or non-ASCII
#: character) is sent percent-encoded as ``filename*``.
_SEPARATORS = frozenset('()<>@,;:\\"/[]?={}')
MAX_MEDIA_TYPE = 255
MAX_UPLOAD_NAME = 1024


def _bare(media_type: str) -> str:
    return media_type.split(";", 1)[0].strip().lower()


def _is_token(name: str) -> bool:
    return all(32 < ord(c) < 127 and c not in _SEPARATORS for c in name)


def content_disposition(media_type: str, name: str | None) -> str:
    """``inline`` for a safe type, else ``attachment``; with the file name if any."""
    disposition = "inline" if _bare(media_type) in INLINE_CONTENT_TYPES else "attachment"
    if not name:
        return disposition
    if _is_token(name):
        return f"{disposition}; filename={name}"
    quoted = urllib.parse.quote(name.encode("utf-8", errors="replace"), safe="")
    return f"{disposition}; filename*=utf-8''{quoted}"


def download_headers(media_type: str, name: str | None) -> dict[str, str]:
    """The headers of an answer carrying content of ``media_type`` (which
    :func:`check_media_type` accepted) named ``name``."""
    content_type = media_type
    if _bare(media_type) in TEXT_CONTENT_TYPES and "charset" not in media_type.lower():
        content_type = f"{media_type}; charset=UTF-8"
    return {
        "Content-Type": content_type,
        "Content-Disposition": content_disposition(media_type, name),
        **SECURITY_HEADERS,
    }


def check_media_type(value: str | None) -> str:
    """An upload's ``Content-Type``: absent is ``application/octet-stream``; otherwise
    printable ASCII with a ``/``, at most :data:`MAX_MEDIA_TYPE` characters (it becomes
    a header of every download)."""
    if value is None or not value.strip():
        return "application/octet-stream"
    value = value.strip()
    if (
        len(value) > MAX_MEDIA_TYPE
        or not value.isascii()
        or not value.isprintable()
        or "/" not in _bare(value)
    ):
        raise InvalidParamError("Content-Type must be a media type such as image/png")
    return value


def check_upload_name(value: str | None) -> str | None:
    """An upload's file name: empty is none; refused if it cannot be stored (NUL, not
    UTF-8) or is over :data:`MAX_UPLOAD_NAME` characters."""
    if not value:
        return None
    if len(value) > MAX_UPLOAD_NAME or "\x00" in value:
        raise InvalidParamError(f"filename must be at most {MAX_UPLOAD_NAME} characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidParamError("filename must be UTF-8") from None
    return value
