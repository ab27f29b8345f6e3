"""Chat tokenizers: any Hugging Face `tokenizer.json` folder, or the bundled demo one.

`load_tokenizer("demo")` loads `assets/demo_tokenizer.json`: a byte-level BPE
of at most 4096 ids (the demo model's vocabulary) with the same pre-tokenizer,
special tokens and tool tokens as Qwen3, built by
`scripts/build_demo_tokenizer.py`. `load_tokenizer(path)` loads a folder that
holds `tokenizer.json` (and reads `tokenizer_config.json`, when present, for
the eos and pad tokens). Both go through `tokenizers.Tokenizer` directly,
which gives the same ids as transformers' `AutoTokenizer` (tested against the
real Qwen3 tokenizer) without its per-call overhead.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Sequence

import tokenizers

ASSETS = pathlib.Path(__file__).resolve().parent / "assets"
DEMO_TOKENIZER = ASSETS / "demo_tokenizer.json"

# The chat template needs these as single ids; a tokenizer without them is no chat tokenizer.
REQUIRED_TOKENS = ("<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>")
DEFAULT_EOS = "<|im_end|>"  # Qwen3 instruct: the end of an assistant turn ends generation.
DEFAULT_PAD = "<|endoftext|>"


class ChatTokenizer:
    """Text <-> ids for chat: special tokens written in text map to their single ids.

    `encode` adds nothing (no BOS/EOS) and `decode` keeps special tokens, so
    ``decode(encode(text)) == text`` for the demo tokenizer and for any text
    that is NFC-normalised under the real Qwen3 one.
    """

    def __init__(
        self,
        tokenizer: tokenizers.Tokenizer,
        *,
        eos_token: str = DEFAULT_EOS,
        pad_token: str = DEFAULT_PAD,
        name: str = "",
    ):
        self._tok = tokenizer
        self.name = name
        missing = [
            t for t in (*REQUIRED_TOKENS, eos_token, pad_token) if tokenizer.token_to_id(t) is None
        ]
        if missing:
            raise ValueError(f"tokenizer {name!r} lacks the chat tokens {missing}")
        self.im_start_id = self.token_to_id("<|im_start|>")
        self.im_end_id = self.token_to_id("<|im_end|>")
        self.eos_id = self.token_to_id(eos_token)
        self.pad_id = self.token_to_id(pad_token)

    @property
    def vocab_size(self) -> int:
        """Ids in use, added tokens included: the least embedding rows a model needs.

        Released models may pad beyond it (Qwen3: 151669 ids, 151936 rows).
        """
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"encode takes a str, got {type(text).__name__}")
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """`encode` for many texts at once (parallel inside `tokenizers`)."""
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        """Text of `ids`, special tokens kept (unless skip_special_tokens); bytes of an
        incomplete UTF-8 character become U+FFFD.

        Ids past `vocab_size` decode to nothing, as in transformers: a model
        whose embedding is padded (Qwen3: rows 151669..151935) can sample them.
        """
        ids = [int(i) for i in ids]
        if any(i < 0 for i in ids):
            raise ValueError(f"token ids must be >= 0, got {min(ids)}")
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int:
        token_id = self._tok.token_to_id(token)
        if token_id is None:
            raise KeyError(f"{token!r} is not a single token of tokenizer {self.name!r}")
        return token_id

    def id_to_token(self, token_id: int) -> str:
        token = self._tok.id_to_token(int(token_id))
        if token is None:
            raise KeyError(f"id {token_id} is outside tokenizer {self.name!r}")
        return token

    def __repr__(self) -> str:
        return f"ChatTokenizer({self.name!r}, vocab_size={self.vocab_size})"


def load_tokenizer(name_or_path: str | pathlib.Path) -> ChatTokenizer:
    """`"demo"` -> the bundled demo tokenizer; a folder or `tokenizer.json` path -> that tokenizer."""
    if str(name_or_path) == "demo":
        return ChatTokenizer(tokenizers.Tokenizer.from_file(str(DEMO_TOKENIZER)), name="demo")
    path = pathlib.Path(name_or_path)
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(f"no tokenizer.json at {path} (or pass 'demo' for the bundled one)")
    eos, pad = _special_tokens_from_config(file.parent / "tokenizer_config.json")
    return ChatTokenizer(
        tokenizers.Tokenizer.from_file(str(file)), eos_token=eos, pad_token=pad, name=str(path)
    )


def _special_tokens_from_config(config_path: pathlib.Path) -> tuple[str, str]:
    """eos/pad token strings from a Hugging Face tokenizer_config.json, Qwen3 defaults otherwise."""
    if not config_path.is_file():
        return DEFAULT_EOS, DEFAULT_PAD
    config = json.loads(config_path.read_text(encoding="utf-8"))

    def token(key: str, default: str) -> str:
        value = config.get(key) or default
        return value["content"] if isinstance(value, dict) else value  # older configs nest it

    return token("eos_token", DEFAULT_EOS), token("pad_token", DEFAULT_PAD)
