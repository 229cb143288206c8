"""Thumbnails with Pillow: what an image is (:func:`probe`), what size a thumbnail of it
is (:func:`target_size`), and the thumbnail's bytes (:func:`render`).

Everything here is synchronous CPU work on one file: callers run it on a worker thread.

Invariants:

- only the formats of :data:`PILLOW_FORMATS` are ever decoded (each decoder is attack
  surface: Synapse's list), and an image of more than ``max_pixels`` pixels (all frames
  counted, for an animated thumbnail) is never decoded: :class:`TooManyPixels` (a
  decompression bomb is refused from its header, before any pixel is decompressed);
- a thumbnail is never larger than the original (no upscaling, as the spec asks: "servers
  SHOULD NOT upscale"); ``crop`` keeps the requested aspect, ``scale`` the original's;
- the EXIF orientation is applied, so that the dimensions recorded and the thumbnails
  are as the image is displayed.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from PIL import Image, ImageSequence

__all__ = [
    "ANIMATED_TYPE",
    "DEFAULT_SIZES",
    "PILLOW_FORMATS",
    "ImageInfo",
    "Method",
    "NotAnImage",
    "Rendered",
    "TooManyPixels",
    "probe",
    "render",
    "target_size",
]

logger = logging.getLogger(__name__)

# Pillow's own bomb check is one process-wide number (a warning above it, an error above
# twice it). Ours is per call, from the header, before anything is decoded (``probe``
# and ``render`` take ``max_pixels``), so Pillow's is off: it would only turn an image
# our limit refuses with 413 into an unreadable one.
Image.MAX_IMAGE_PIXELS = None

Method = Literal["crop", "scale"]

#: The thumbnails made at upload (Synapse's default ``thumbnail_sizes``).
DEFAULT_SIZES: tuple[tuple[int, int, Method], ...] = (
    (32, 32, "crop"),
    (96, 96, "crop"),
    (320, 240, "scale"),
    (640, 480, "scale"),
    (800, 600, "scale"),
)

#: The only formats Pillow may open (Synapse's list).
PILLOW_FORMATS = ("jpeg", "png", "webp", "gif")
#: A static thumbnail's type by the original's format (Synapse's map: PNG keeps the
#: transparency a GIF or PNG may have).
_STATIC_TYPE = {"JPEG": "image/jpeg", "WEBP": "image/jpeg", "PNG": "image/png", "GIF": "image/png"}
#: An animated thumbnail's type.
ANIMATED_TYPE = "image/webp"
_ENCODER = {"image/jpeg": "JPEG", "image/png": "PNG", "image/webp": "WEBP"}

_EXIF_ORIENTATION = 0x0112
_TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
#: Orientations that swap width and height.
_SWAPS = frozenset({5, 6, 7, 8})


class NotAnImage(Exception):
    """The content is not an image of :data:`PILLOW_FORMATS` Pillow can read."""


class TooManyPixels(Exception):
    """The image has more pixels than the limit allows decoding."""


@dataclass(frozen=True, slots=True)
class ImageInfo:
    """An image as displayed (EXIF orientation applied)."""

    width: int
    height: int
    animated: bool
    format: str


@dataclass(frozen=True, slots=True)
class Rendered:
    width: int
    height: int
    animated: bool
    media_type: str
    data: bytes


def _open(path: Path) -> Image.Image:
    try:
        return Image.open(path, formats=PILLOW_FORMATS)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise NotAnImage(str(exc)) from None


def _orientation(image: Image.Image) -> int:
    try:
        value = image.getexif().get(_EXIF_ORIENTATION)
    except Exception:  # EXIF parsing fails in many ways on hostile input; it is optional
        return 1
    return value if isinstance(value, int) and value in _TRANSPOSE else 1


def _info(image: Image.Image, max_pixels: int) -> ImageInfo:
    width, height = image.size
    if _orientation(image) in _SWAPS:
        width, height = height, width
    # Whether a GIF has a second frame is found by seeking to it, which may decode the
    # first: only for an image within the limit.
    animated = width * height <= max_pixels and bool(getattr(image, "is_animated", False))
    return ImageInfo(width, height, animated, str(image.format))


def probe(path: Path, max_pixels: int) -> ImageInfo:
    """What the image at ``path`` is, from its header (nothing is decoded for an image
    over ``max_pixels``, whose ``animated`` is False)."""
    with _open(path) as image:
        try:
            return _info(image, max_pixels)
        except (OSError, ValueError, SyntaxError, EOFError) as exc:
            raise NotAnImage(str(exc)) from None


def target_size(method: Method, width: int, height: int, source: ImageInfo) -> tuple[int, int]:
    """The size of the ``method`` thumbnail asked for as ``width`` x ``height``.

    ``scale``: the largest size of the original's aspect within the box, never above the
    original. ``crop``: the box itself, scaled down (aspect kept) if it does not fit in
    the original. Both at least 1 x 1."""
    sw, sh = source.width, source.height
    if method == "scale":
        if width * sh <= height * sw:  # the width binds
            w, h = width, max(1, (width * sh) // sw)
        else:
            w, h = max(1, (height * sw) // sh), height
        return min(w, sw), min(h, sh)
    if width <= sw and height <= sh:
        return width, height
    if width * sh >= height * sw:  # the width overflows more
        return sw, max(1, min(sh, (height * sw) // width))
    return max(1, min(sw, (width * sh) // height)), sh


def _prepared(image: Image.Image) -> Image.Image:
    """``image`` oriented as displayed, in a mode that resizes well."""
    orientation = _orientation(image)
    if orientation != 1:
        image = image.transpose(_TRANSPOSE[orientation])
    if image.mode in ("1", "L", "P", "LA", "PA", "I", "I;16", "F", "CMYK", "YCbCr"):
        # Palette and grey images scale badly (nearest colours); keep transparency.
        has_alpha = "A" in image.mode or image.info.get("transparency") is not None
        image = image.convert("RGBA" if has_alpha else "RGB")
    return image


def _resize(image: Image.Image, method: Method, size: tuple[int, int]) -> Image.Image:
    tw, th = size
    if method == "scale":
        return image.resize(size, Image.Resampling.LANCZOS, reducing_gap=3.0)
    sw, sh = image.size
    # Scale so that the box is covered, then cut the middle.
    wide = tw * sh > th * sw
    scaled = (tw, max(th, (tw * sh) // sw)) if wide else (max(tw, (th * sw) // sh), th)
    resized = image.resize(scaled, Image.Resampling.LANCZOS, reducing_gap=3.0)
    left, top = (scaled[0] - tw) // 2, (scaled[1] - th) // 2
    return resized.crop((left, top, left + tw, top + th))


def _encode(image: Image.Image, media_type: str) -> bytes:
    out = io.BytesIO()
    if media_type == "image/jpeg" and image.mode != "RGB":
        image = image.convert("RGB")
    image.save(out, _ENCODER[media_type], quality=80)
    return out.getvalue()


def _encode_animated(frames: list[Image.Image], durations: list[int], loop: int) -> bytes:
    out = io.BytesIO()
    frames[0].save(
        out,
        "WEBP",
        save_all=True,
        append_images=frames[1:],
        loop=loop,
        duration=durations,
        quality=80,
    )
    return out.getvalue()


def render(
    path: Path,
    wanted: Iterable[tuple[Method, int, int]],
    *,
    animated: bool,
    max_pixels: int,
) -> list[Rendered]:
    """Thumbnails of the image at ``path``, one per ``(method, width, height)`` in
    ``wanted`` (sizes from :func:`target_size`), decoding the image once.

    ``animated``: of an animated image, animated WebP thumbnails (every frame); of a
    still one, or one whose frames together exceed ``max_pixels``, static ones. Raises
    :class:`NotAnImage` or :class:`TooManyPixels`."""
    wanted = list(wanted)
    with _open(path) as image:
        try:
            info = _info(image, max_pixels)
        except (OSError, ValueError, SyntaxError, EOFError) as exc:
            raise NotAnImage(str(exc)) from None
        if info.width * info.height > max_pixels:
            raise TooManyPixels(f"{info.width}x{info.height} is over {max_pixels} pixels")
        frames_count = int(getattr(image, "n_frames", 1)) if animated and info.animated else 1
        if frames_count > 1 and frames_count * info.width * info.height <= max_pixels:
            return [_render_animated(image, method, size) for method, *size in wanted]
        static_type = _STATIC_TYPE.get(info.format, "image/png")
        try:
            if image.format == "JPEG" and wanted:
                # Let the decoder scale down (1/2, 1/4, 1/8) to just above the largest
                # thumbnail: much less to decode and resize.
                need = max(max(w, h) for _, w, h in wanted)
                image.draft("RGB", (need, need))
            image.seek(0)
            image.load()
            source = _prepared(image)
        except (OSError, ValueError, SyntaxError, EOFError) as exc:
            raise NotAnImage(str(exc)) from None
        results = []
        for method, width, height in wanted:
            thumbnail = _resize(source, method, (width, height))
            results.append(
                Rendered(width, height, False, static_type, _encode(thumbnail, static_type))
            )
        return results


def _render_animated(image: Image.Image, method: Method, size: list[int]) -> Rendered:
    width, height = size
    orientation = _orientation(image)
    frames, durations = [], []
    try:
        for frame in ImageSequence.Iterator(image):
            copy = frame.copy()
            if orientation != 1:
                copy = copy.transpose(_TRANSPOSE[orientation])
            frames.append(_resize(copy.convert("RGBA"), method, (width, height)))
            durations.append(int(frame.info.get("duration", image.info.get("duration", 100))))
    except (OSError, ValueError, SyntaxError, EOFError) as exc:
        raise NotAnImage(str(exc)) from None
    data = _encode_animated(frames, durations, int(image.info.get("loop", 0)))
    return Rendered(width, height, True, ANIMATED_TYPE, data)
