"""How the backends lay a branch out and read it back: shared by every backend."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from store import codec
from store.errors import NotFound
from store.histories import StoredHistory

# Branch id -> (parent or -1, fork index, length): a session's branch table.
BranchTable = Mapping[int, tuple[int, int, int]]


def ancestry(branches: BranchTable, branch: int) -> list[tuple[int, int, int]]:
    """Where a branch's history lives: (branch, first index, end) from the root down.

    An ancestor's part ends at its child's fork index, and may be empty when the child
    forked inside the ancestor's own inherited prefix.
    """
    segments: list[tuple[int, int, int]] = []
    cur, end = branch, branches[branch][2]
    while cur >= 0:
        parent, fork, _ = branches[cur]
        start = min(fork, end)
        segments.append((cur, start, end))
        cur, end = parent, start
    segments.reverse()
    return segments


def turns_before(turns: Sequence[tuple[int, bytes]], limit: int) -> list[tuple[int, bytes]]:
    """The (after_index, body) turns that follow a message before index ``limit``."""
    return [(after, body) for after, body in turns if after < limit]


def assemble(
    session: str,
    branch: int,
    branches: BranchTable,
    bodies: Sequence[bytes],
    turns: Sequence[tuple[int, bytes]],
    fetch_blob: Callable[[bytes], bytes | None],
) -> StoredHistory:
    """Decode a loaded branch; ``turns`` are (after_index, packed message) in record order."""
    texts: dict[bytes, str] = {}

    def blob(ref: bytes) -> str:
        if ref not in texts:
            data = fetch_blob(ref)
            if data is None:
                raise NotFound(f"session {session!r} lost blob {ref.hex()}")
            texts[ref] = codec.decode_blob(data)
        return texts[ref]

    gateway: dict[int, list[dict[str, Any]]] = {}
    for after, body in turns:
        gateway.setdefault(after, []).append(codec.unpack_message(body, blob))
    parent, fork, _ = branches[branch]
    return StoredHistory(
        branch_id=branch,
        messages=tuple(codec.unpack_message(body, blob) for body in bodies),
        gateway_turns={k: tuple(v) for k, v in sorted(gateway.items())},
        parent=parent if parent >= 0 else None,
        fork_index=fork,
    )
