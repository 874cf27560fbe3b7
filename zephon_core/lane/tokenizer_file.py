"""Loading a ``tokenizers`` tokenizer from a path a user gave, with one-line errors.

The path is a ``tokenizer.json`` or a folder holding one: the folder TorchTitan's
``hf_assets_path`` and Megatron's ``--tokenizer-model`` (HuggingFaceTokenizer)
name. Next to it, ``tokenizer_config.json`` names the special tokens
(``bos_token``, ``eos_token``), which is where both frameworks read them from.
"""

from __future__ import annotations

import json
import os
from typing import Any

from zephon_core.errors import ConfigError

FILE = "tokenizer.json"
CONFIG = "tokenizer_config.json"


def tokenizer_path(path: str, field: str = "tokenizer") -> str:
    """The ``tokenizer.json`` that ``path`` names (itself, or the one in that folder)."""
    if os.path.isdir(path):
        inside = os.path.join(path, FILE)
        if not os.path.isfile(inside):
            raise ConfigError(f"{field}: {path} is a folder without a {FILE}; pass a {FILE} file or the folder that holds one")
        return inside
    if not os.path.exists(path):
        raise ConfigError(f"{field}: {path}: no such file; pass a {FILE} file or the folder that holds one")
    return path


def load_tokenizer(path: str, field: str = "tokenizer") -> Any:
    """A ``tokenizers.Tokenizer`` read from ``path`` (a file or a folder, see ``tokenizer_path``)."""
    file = tokenizer_path(path, field)
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(file)
    except Exception as e:  # the Rust side raises plain Exception, without the file's name
        raise ConfigError(f"{field}: {file}: not a tokenizers {FILE} ({str(e).splitlines()[0]})") from None


def special_token_ids(path: str, tokenizer: Any) -> tuple[int | None, int | None]:
    """(bos, eos) ids named by the ``tokenizer_config.json`` next to the tokenizer; None where it names none."""
    folder = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    try:
        with open(os.path.join(folder, CONFIG), encoding="utf-8") as f:
            config = json.load(f)
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as e:
        raise ConfigError(f"{os.path.join(folder, CONFIG)}: unreadable ({e})") from None

    def token_id(key: str) -> int | None:
        token = config.get(key)
        if isinstance(token, dict):  # {"content": "<s>", ...}
            token = token.get("content")
        return tokenizer.token_to_id(token) if isinstance(token, str) else None

    return token_id("bos_token"), token_id("eos_token")
