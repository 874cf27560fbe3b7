"""Offline test assets for running TorchTitan's stock text loader on CPU (tests only).

Neither TorchTitan wheel (0.2.2, 0.3.0) ships ``tests/assets``: the stock
``c4_test`` dataset and the default tokenizer folder are missing, and nothing
can be downloaded here.  This module writes a small replacement of both:

* ``<root>/tokenizer/``: ``tokenizer.json`` (a ``tokenizers`` BPE model trained
  on the generated corpus) and ``tokenizer_config.json`` naming the BOS/EOS
  tokens, which is the layout ``HuggingFaceTokenizer`` loads from
  ``hf_assets_path``;
* ``<root>/c4_test/data.json``: JSON lines ``{"text": ...}``, which
  ``datasets.load_dataset(<dir>, split="train")`` (the stock ``c4_test``
  loader) reads as a one-split JSON dataset.

Everything is derived from a seeded RNG, so two calls with the same arguments
produce byte-identical files.  Usage::

    python assets.py OUT_DIR            # or: assets.ensure_assets(OUT_DIR)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
from pathlib import Path

BOS = "<|begin_of_text|>"
EOS = "<|end_of_text|>"
PAD = "<|pad|>"
UNK = "<unk>"
SPECIAL_TOKENS = (UNK, BOS, EOS, PAD)

# Bumped whenever the generated content changes; part of the "done" marker.
ASSETS_VERSION = "1"

_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "st", "tr", "pl")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ou")
_CODAS = ("", "", "n", "r", "s", "l", "k")


def _make_lexicon(rng: random.Random, n_words: int) -> list[str]:
    words: set[str] = set()
    while len(words) < n_words:
        syllables = rng.choice((1, 1, 2, 2, 2, 3))
        words.add(
            "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables))
        )
    return sorted(words)


def generate_documents(n_docs: int = 2000, seed: int = 0) -> list[str]:
    """Return ``n_docs`` pseudo-text documents with a Zipf-like word distribution."""
    rng = random.Random(seed)
    lexicon = _make_lexicon(rng, 600)
    weights = [1.0 / (rank + 1) for rank in range(len(lexicon))]
    docs = []
    for _ in range(n_docs):
        sentences = []
        for _ in range(rng.randint(1, 12)):
            words = rng.choices(lexicon, weights=weights, k=rng.randint(4, 18))
            sentence = " ".join(words)
            sentences.append(sentence[0].upper() + sentence[1:] + rng.choice((".", ".", ".", "?", "!")))
        docs.append(" ".join(sentences))
    return docs


def _train_tokenizer(docs: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    # Seed the alphabet with printable ASCII so arbitrary English text encodes
    # without <unk> (the generated corpus only uses a few letters).
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=[chr(c) for c in range(33, 127)],
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer=trainer)
    return tok


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def ensure_assets(root: str | os.PathLike, *, n_docs: int = 2000, vocab_size: int = 512, seed: int = 0) -> dict[str, str]:
    """Create (once) the tokenizer and dataset under ``root``; return their paths.

    ``vocab_size`` must stay <= 2048, the vocabulary of the llama3 debug model.
    Returns ``{"hf_assets_path": <root>/tokenizer, "dataset_path": <root>/c4_test}``.
    """
    if vocab_size > 2048:
        raise ValueError("vocab_size must be <= 2048 (llama3 debugmodel vocabulary)")
    root = Path(root).resolve()
    tok_dir, data_dir = root / "tokenizer", root / "c4_test"
    paths = {"hf_assets_path": str(tok_dir), "dataset_path": str(data_dir)}
    marker = root / ".assets-done"
    stamp = json.dumps({"v": ASSETS_VERSION, "n_docs": n_docs, "vocab_size": vocab_size, "seed": seed})
    if marker.exists() and marker.read_text() == stamp:
        return paths

    docs = generate_documents(n_docs, seed)
    tok = _train_tokenizer(docs, vocab_size)
    _write_atomic(tok_dir / "tokenizer.json", tok.to_str())
    config = {
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": UNK,
        "add_bos_token": False,
        "add_eos_token": False,
        "model_max_length": 1 << 20,
    }
    _write_atomic(tok_dir / "tokenizer_config.json", json.dumps(config, indent=2) + "\n")
    _write_atomic(data_dir / "data.json", "".join(json.dumps({"text": d}) + "\n" for d in docs))
    _write_atomic(marker, stamp)
    return paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--n-docs", type=int, default=2000)
    ap.add_argument("--vocab-size", type=int, default=512)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    print(json.dumps(ensure_assets(a.out_dir, n_docs=a.n_docs, vocab_size=a.vocab_size, seed=a.seed)))


if __name__ == "__main__":
    main()
