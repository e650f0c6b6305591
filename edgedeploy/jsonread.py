"""Reading a JSON record from a folder the tool does not control (an output folder, a bundle, a device's reply).

``path.read_text()`` on such a name reads whatever is there: a FIFO blocks forever, a link to ``/dev/zero``
reads until memory runs out. Here the file is opened without blocking, must be a regular file, and is read up
to a bound; anything else is an ``OSError`` naming what it is, which callers already turn into their one line.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from typing import Any

# far above any record the tool writes (a report of thousands of parity rows is a few MB)
MAX_JSON_BYTES = 64 << 20


def read_json(path: str | Path, *, follow_links: bool = False, max_bytes: int = MAX_JSON_BYTES) -> Any:
    """The JSON value in the regular file at ``path``.

    ``follow_links``: accept ``path`` itself being a symbolic link (a path the user named); a link inside a
    folder the tool reads is refused.

    Raises:
        OSError: missing or unreadable, a link (unless ``follow_links``), not a regular file (a FIFO, a
            device), or over ``max_bytes``.
        UnicodeDecodeError: not UTF-8.
        json.JSONDecodeError: not JSON.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | (0 if follow_links else getattr(os, "O_NOFOLLOW", 0))
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, "a symbolic link, not a file", str(path)) from None
        raise
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file (a FIFO, a device or a folder)", str(path))
        if st.st_size > max_bytes:
            raise OSError(errno.EFBIG, f"{st.st_size:,} bytes, more than a record may take", str(path))
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise OSError(errno.EFBIG, "more bytes than a record may take", str(path))
    return json.loads(data.decode("utf-8"))
