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


def select_branch(
    branches: BranchTable,
    head: int,
    chains: Sequence[bytes],
    own_chain: Callable[[int, int], bytes],
) -> tuple[int, int, int]:
    """Where a sent history (its chained digests) lands: (branch, stored, parent).

    ``branch`` >= 0: the longest stored branch the history extends (ties: the head), or the
    branch it repeats or is a prefix of; its first ``stored`` messages are stored already
    (all of them: nothing to append). ``branch`` -1: a new branch forking from ``parent``
    (-1 for none: a new session) after ``stored`` shared messages. ``own_chain(b, pos)``:
    the stored chained digest of message ``pos`` of branch ``b``'s own messages.
    """

    def chain_at(b: int, pos: int) -> bytes:
        while pos < branches[b][1]:
            b = branches[b][0]
        return own_chain(b, pos)

    n = len(chains)
    # the longest branch whose history is a prefix of the request (ties: the head)
    best, from_ = -1, 0
    for b, (_, _, length) in branches.items():
        better = length > from_ or (length == from_ and b == head)
        if length <= n and better and chain_at(b, length - 1) == chains[length - 1]:
            best, from_ = b, length
    if best >= 0:
        return best, from_, -1
    # diverged: fork from the branch sharing the longest common prefix
    parent = -1
    for b, (_, _, length) in branches.items():
        lo, hi = 0, min(length, n)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if chain_at(b, mid - 1) == chains[mid - 1]:
                lo = mid
            else:
                hi = mid - 1
        if lo > from_ or (lo == from_ and lo > 0 and b == head):
            from_, parent = lo, b
    if from_ == n:
        return parent, n, -1  # a shorter re-send: stored already
    return -1, from_, parent


# Claude Code's microcompaction: in the history it re-sends, the results of old tool uses
# (Read, Bash, Grep, Glob, Edit, Write, web fetch/search) become this string, verbatim
# (its ``TIME_BASED_MC_CLEARED_MESSAGE``); the message keeps its place and its tool_use_id.
MICROCOMPACTED = "[Old tool result content cleared]"


def is_microcompacted(message: Mapping[str, Any]) -> bool:
    """A tool result (in the store's dict form) that the harness's microcompaction cleared.

    Asked of each message as it is decoded (``gateway.request_cache.Decoded.placeholders``)
    and of a stored branch's messages when a request holds one: the text is joined only
    when its parts' lengths add up to the placeholder's.
    """
    if message.get("role") != "tool":
        return False
    texts = [p.get("text", "") for p in message.get("parts", ()) if p.get("type") == "text"]
    return sum(map(len, texts)) == len(MICROCOMPACTED) and "".join(texts) == MICROCOMPACTED


def microcompacted(
    sent: Sequence[Mapping[str, Any]], stored: Sequence[Mapping[str, Any]]
) -> list[int]:
    """Positions where the re-sent history ``sent`` holds the microcompaction placeholder in
    place of the result ``stored`` (a branch's history) holds for the same tool call.

    Such a re-send is the stored branch with old results shortened by the harness, not a
    new history: with the stored results put back, it continues the branch (nothing is
    rewritten in the store, and the replica keeps the prefix it was sent). A placeholder
    the branch has no result for (another position, another call) is the client's content.
    """
    return [
        i
        for i, (new, old) in enumerate(zip(sent, stored, strict=False))
        if is_microcompacted(new)
        and old.get("role") == "tool"
        and old.get("tool_call_id") == new.get("tool_call_id")
        and not is_microcompacted(old)
    ]
