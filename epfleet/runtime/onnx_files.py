"""Telling an ONNX file from anything else without reading it whole: its size and the
framing of its top-level protobuf fields.

An ONNX file is a serialised ``ModelProto``: a sequence of fields, each a tag (field number
and wire type) followed by a varint, a fixed 4 or 8 bytes, or a length and that many bytes.
Walking those tags and seeking over each field's bytes reads a few hundred bytes of a model
of any size, and fails on the first bytes of most other files (text, an archive, zeros),
where ``onnx.load`` would read the whole file into memory first.
"""

from __future__ import annotations

import os
from typing import BinaryIO

MAX_ONNX_BYTES = 2**31 - 1
"""Protobuf's limit on one message: a larger model keeps its weights in external data."""
GRAPH_FIELD = 7
"""``ModelProto.graph``'s field number."""
_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5


def onnx_problem(file: BinaryIO) -> str | None:
    """Why the open ``file`` cannot be an ONNX model, or None when its top-level fields are
    well framed, end with the file and include a graph. Reads only the fields' tags."""
    size = os.fstat(file.fileno()).st_size
    if size > MAX_ONNX_BYTES:
        return (
            f"{size:,} bytes, more than an ONNX file can hold ({MAX_ONNX_BYTES:,}); a larger "
            "model keeps its weights in external data files"
        )
    if size == 0:
        return "the file is empty"
    file.seek(0)
    fields = set()
    while file.tell() < size:
        at = file.tell()
        tag = _varint(file)
        if tag is None or tag >> 3 == 0:
            return f"no protobuf field at byte {at}"
        number, wire = tag >> 3, tag & 7
        if wire == _VARINT:
            skip = 0 if _varint(file) is not None else None
        elif wire == _LENGTH:
            skip = _varint(file)
        else:
            skip = {_FIXED64: 8, _FIXED32: 4}.get(wire)
        if skip is None or file.tell() + skip > size:
            return f"field {number} at byte {at} is cut short or of an unknown kind"
        file.seek(skip, os.SEEK_CUR)
        fields.add(number)
    if GRAPH_FIELD not in fields:
        return "it has no graph"
    return None


def _varint(file: BinaryIO) -> int | None:
    """The varint at the file's position, or None when none is there (at most 10 bytes)."""
    value = 0
    for shift in range(0, 70, 7):
        byte = file.read(1)
        if not byte:
            return None
        value |= (byte[0] & 0x7F) << shift
        if byte[0] < 0x80:
            return value
    return None
