"""The on-disk caches of what the project builds to check itself (the compile check's nvcc results, the test
harness's simulator): where they live, the digest that keys an entry, and entries written whole."""

from __future__ import annotations

import hashlib
import os
import pathlib
from collections.abc import Callable, Iterable


def cache_dir(name: str, switch: str) -> pathlib.Path | None:
    """$RLKERNELS_CACHE_DIR/<name>, else ~/.cache/rlkernels/<name>; None (nothing cached) when the environment
    variable `switch` is 0."""
    if os.environ.get(switch, "1").strip() == "0":
        return None
    root = os.environ.get("RLKERNELS_CACHE_DIR") or pathlib.Path.home() / ".cache" / "rlkernels"
    return pathlib.Path(root, name)


def digest(parts: Iterable[str], files: Iterable[pathlib.Path], root: pathlib.Path) -> str:
    """sha256 of `parts`, then of each file's name (relative to `root` when under it) and bytes, `root`'s
    path in them left out: another checkout's copy of a file is the same file."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() + b"\0")
    where = str(root).encode()
    for path in files:
        h.update(str(path.relative_to(root) if path.is_relative_to(root) else path.name).encode() + b"\0")
        h.update(path.read_bytes().replace(where, b"<checkout>"))
    return h.hexdigest()


def store(entry: pathlib.Path, fill: Callable[[pathlib.Path], object]) -> None:
    """Writes `entry` whole: `fill` writes a temporary file beside it, which is then renamed, so that no
    other process reads half an entry."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    partial = entry.with_name(f"{entry.name}.{os.getpid()}.tmp")
    fill(partial)
    partial.replace(entry)
