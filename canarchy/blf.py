"""Vector BLF files through python-can's reader, with a file that ends early said.

python-can 4.6's ``BLFReader`` stops quietly where a file is cut: the frames of the last,
incomplete object are lost without a word. :class:`BlfReader` reads the objects the same way and,
after the frames it could read, raises :class:`BlfTruncated` when the file ends inside an object,
inside a frame that continues past the last container, or before the size its header gives.
A container compressed with a method other than none or zlib raises :class:`BlfCompressionUnsupported`
(python-can logs a line and skips the container, whose frames, and often the next container's, are lost).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import Any

from can.io.blf import (LOG_CONTAINER, LOG_CONTAINER_STRUCT, NO_COMPRESSION, OBJ_HEADER_BASE_STRUCT,
                        ZLIB_DEFLATE, BLFParseError, BLFReader)

_HEAD = OBJ_HEADER_BASE_STRUCT.size


class BlfTruncated(BLFParseError):
    """The file ends before its last object does: the frames read before stand."""


class BlfCompressionUnsupported(BLFParseError):
    """A container compressed with a method python-can cannot read: the frames read before stand."""

    def __init__(self, method: int, number: int, offset: int) -> None:
        super().__init__(f"object {number} (byte {offset}) is a container compressed with method {method}, "
                         f"which python-can cannot read (it reads {NO_COMPRESSION}: none and {ZLIB_DEFLATE}: zlib)")
        self.method = method


class BlfReader(BLFReader):
    """python-can's BLF reader that raises :class:`BlfTruncated` after the frames of a cut file and
    :class:`BlfCompressionUnsupported` at a container it cannot decompress."""

    def __iter__(self) -> Iterator[Any]:
        read = self.file.read
        offset = self.file.tell()
        number = 0
        while True:
            head = read(_HEAD)
            if not head:
                break
            number += 1
            if len(head) < _HEAD:
                raise BlfTruncated(f"the file ends inside the header of object {number} (byte {offset + len(head)}): "
                                   f"{len(head)} of {_HEAD} bytes")
            signature, _, _, size, kind = OBJ_HEADER_BASE_STRUCT.unpack(head)
            if signature != b"LOBJ" or size < _HEAD:
                raise BLFParseError(f"object {number} (byte {offset}) is not a BLF object")
            start = offset
            body = read(size - _HEAD)
            cut = len(body) < size - _HEAD
            offset += _HEAD + len(body) + len(read(size % 4))
            if kind == LOG_CONTAINER and len(body) >= LOG_CONTAINER_STRUCT.size:
                method, _ = LOG_CONTAINER_STRUCT.unpack_from(body)
                data = body[LOG_CONTAINER_STRUCT.size:]
                if method == ZLIB_DEFLATE:
                    data = zlib.decompressobj().decompress(data)  # a cut stream gives what it holds
                elif method != NO_COMPRESSION:
                    raise BlfCompressionUnsupported(method, number, start)
                yield from self._parse_container(data)
            if cut:
                raise BlfTruncated(f"the file ends inside object {number} (byte {offset}): "
                                   f"{_HEAD + len(body)} of its {size} bytes")
        if self._tail:
            raise BlfTruncated(f"the file ends inside a frame: {len(self._tail)} bytes of it after the last object")
        if offset < self.file_size:
            raise BlfTruncated(f"the file ends at byte {offset}; its header gives {self.file_size}")
        self.stop()
