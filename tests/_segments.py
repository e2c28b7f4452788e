"""Reading ``file://`` segment files byte by byte, for tests that check or damage the
on-disk layout."""

from __future__ import annotations

from walsvc.backends._file._format import FRAME_HEADER_SIZE, FrameHeader, parse_frame_header


def whole_frames(data: bytes) -> list[FrameHeader]:
    """The frames of one segment file's bytes, in order. The newest segment may end in
    the writer's zero-filled runway: the frames stop at it, and only zeros may follow."""
    frames = []
    at = 0
    while at < len(data):
        if not data[at : at + FRAME_HEADER_SIZE].strip(b"\0"):
            assert not data[at:].strip(b"\0"), f"bytes after the zeros at offset {at}"
            break
        header = parse_frame_header(data, at, at)
        assert header.end <= len(data), f"frame at offset {at} runs past the end"
        frames.append(header)
        at = header.end
    return frames


def durable_bytes(data: bytes) -> bytes:
    """``data`` without the runway: the segment as it would be had the writer not
    zero-filled ahead of its offset."""
    frames = whole_frames(data)
    return data[: frames[-1].end if frames else 0]
