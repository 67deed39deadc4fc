import json

import pytest
import tiktoken.registry

from gateway.tokens import (
    ByteEstimate,
    ChatTokenizer,
    HFCounter,
    SessionPrompts,
    TiktokenCounter,
    TokenizerUnavailable,
    get_counter,
    serialize_message,
    serialize_tools,
)
from gateway.transcript import (
    Message,
    Text,
    Thinking,
    ToolCall,
    Transcript,
    text_message,
    tool_message,
)


def test_qwen_canary() -> None:
    qwen = get_counter("qwen3.6")
    assert qwen.encode("俱乐部, върху") == [104328, 11, 204256]
    assert qwen.count("俱乐部, върху") == 3
    assert not qwen.is_estimate


def test_qwen_chatml_specials_are_single_ids() -> None:
    qwen = get_counter("qwen3.6")
    ids = qwen.encode("<|im_start|>user\nhi<|im_end|>\n")
    assert ids[0] == 248045 and 248046 in ids


def test_estimate_counts_bytes_over_four_with_stable_pseudo_ids() -> None:
    est = get_counter("estimate")
    assert est.is_estimate and "estimate" in est.name
    assert est.count("abcdefgh") == 2
    assert est.count("abcdefghi") == 3
    assert est.count("é") == 1  # 2 bytes
    assert est.encode("abcdabcdxy") == ByteEstimate().encode("abcdabcdxy")
    ids = est.encode("abcdabcdxy")
    assert len(ids) == 3 and ids[0] == ids[1] != ids[2]


def test_unknown_spec_names_the_choices() -> None:
    with pytest.raises(ValueError, match=r"unknown tokenizer 'gpt9'.*estimate"):
        get_counter("gpt9")


def test_hf_missing_file_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(TokenizerUnavailable, match="not found"):
        get_counter(f"hf:{tmp_path / 'nope.json'}")


def test_hf_tokenizer_json(tmp_path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "hello": 1, "world": 2}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    counter = get_counter(f"hf:{path}")
    assert isinstance(counter, HFCounter)
    assert counter.encode("hello world zzz") == [1, 2, 0]


def test_tiktoken_unknown_encoding() -> None:
    with pytest.raises(TokenizerUnavailable, match="unknown tiktoken encoding"):
        TiktokenCounter("nope_base")


def test_tiktoken_loads_from_cache_or_refuses_to_download(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))  # empty cache: would need network
    # Start from no loaded encodings: one that other code already loaded in this process
    # (litellm loads cl100k_base from files it ships when it counts tokens, as in the
    # mini-swe-agent e2e test) is not a file in the cache.
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})
    with pytest.raises(TokenizerUnavailable, match=r"not bundled.*downloaded"):
        get_counter("tiktoken:cl100k_base")


def test_serialize_tool_call_thinking_and_result() -> None:
    reply = Message(
        role="assistant",
        parts=(Thinking("look first"), Text("Reading it."), ToolCall("c1", "read", '{"p": 1}')),
    )
    s = serialize_message(reply)
    assert s.startswith("<|im_start|>assistant\n<think>\nlook first\n</think>\n\nReading it.\n")
    assert '<tool_call>\n{"name": "read", "arguments": {"p": 1}}\n</tool_call><|im_end|>\n' in s
    result = serialize_message(tool_message("c1", "42"))
    assert result == "<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n"
    assert serialize_tools(()) == ""
    assert json.dumps({"name": "read"}) in serialize_tools(({"name": "read"},))


def test_chat_tokenizer_memoizes_each_text_once() -> None:
    calls: list[str] = []

    class Counting(ByteEstimate):
        def encode(self, text: str) -> list[int]:
            calls.append(text)
            return super().encode(text)

    chat = ChatTokenizer(Counting())
    sys_msg, user = text_message("system", "be brief"), text_message("user", "hi")
    t = Transcript(messages=(sys_msg, user, user))
    ids = chat.prompt_ids(t)
    chat.prompt_ids(t)
    # tools preamble (empty), system, user, generation prompt: each encoded once
    assert len(calls) == 4
    texts = [serialize_message(m) for m in t.messages] + ["<|im_start|>assistant\n"]
    assert len(ids) == sum(-(-len(s.encode()) // 4) for s in texts)
    assert chat.message_count(user) == len(chat.message_ids(user))


def test_chat_tokenizer_qwen_matches_whole_prompt_encoding() -> None:
    qwen = get_counter("qwen3.6")
    chat = ChatTokenizer(qwen)
    t = Transcript(
        messages=(
            text_message("system", "You fix bugs."),
            text_message("user", "Fix   it\n\n"),
            Message(role="assistant", parts=(Text("ok"), ToolCall("1", "bash", '{"c": "ls"}'))),
            tool_message("1", "a.py\nb.py\n"),
        )
    )
    whole = "".join(serialize_message(m) for m in t.messages) + "<|im_start|>assistant\n"
    assert chat.prompt_ids(t) == qwen.encode(whole)


def test_session_prompts_reuse_unchanged_turns_and_match_full_tokenization() -> None:
    serialized: list[str] = []

    class Counting(ByteEstimate):
        def encode(self, text: str) -> list[int]:
            serialized.append(text)
            return super().encode(text)

    chat = ChatTokenizer(Counting())
    session = SessionPrompts(chat)
    a, b = text_message("user", "one"), text_message("assistant", "two")
    first = Transcript(messages=(a,))
    second = Transcript(messages=(a, b))
    rewritten = Transcript(messages=(text_message("user", "ONE"), b))
    for t in (first, second, rewritten):
        assert session.prompt_ids(t) == ChatTokenizer(ByteEstimate()).prompt_ids(t)
    assert len(serialized) == len(set(serialized))  # every distinct text encoded once
