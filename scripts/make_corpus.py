"""Regenerate the bundled demo corpus and tokenizer in configs/corpus/.

The corpus is real English prose: the docstrings of the Python standard
library of the interpreter that runs this script, one JSON object per
docstring. Its output is committed, so the demo and tests never depend on
which Python happens to be installed; rerun it only to change the corpus.

    python scripts/make_corpus.py
"""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
import sys
import warnings
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "configs" / "corpus"
SKIP = ("test", "idlelib", "tkinter", "turtledemo", "lib2to3", "antigravity", "this", "ensurepip", "venv", "__main__")


def docstrings() -> list[tuple[str, str]]:
    seen: set[str] = set()
    out = []
    stdlib = [m for m in pkgutil.iter_modules() if getattr(m.module_finder, "path", "").startswith(sys.base_prefix)]
    names = {m.name for m in stdlib}
    for m in stdlib:
        if m.ispkg and not m.name.startswith(SKIP):
            try:
                pkg = importlib.import_module(m.name)
            except Exception:
                continue
            names.update(s.name for s in pkgutil.iter_modules(pkg.__path__, m.name + "."))
    names = sorted(names)
    for name in names:
        if name.startswith("_") or name.startswith(SKIP) or "._" in name or ".test" in name:
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                mod = importlib.import_module(name)
        except Exception:
            continue
        objs = [(name, mod)] + [(f"{name}.{k}", v) for k, v in sorted(vars(mod).items()) if not k.startswith("_")]
        for qual, obj in objs:
            doc = inspect.getdoc(obj) if (inspect.ismodule(obj) or inspect.isclass(obj) or inspect.isroutine(obj)) else None
            if not doc or len(doc) < 200 or doc in seen:
                continue
            seen.add(doc)
            out.append((qual, doc))
    return out


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    docs = docstrings()
    held_out = [d for n, d in enumerate(docs) if n % 20 == 0]
    train = [d for n, d in enumerate(docs) if n % 20 != 0]
    for name, items in (("stdlib_docs.jsonl", train), ("stdlib_docs_heldout.jsonl", held_out)):
        with open(OUT / name, "w", encoding="utf-8") as f:
            for qual, text in items:
                f.write(json.dumps({"id": qual, "text": text}, ensure_ascii=False) + "\n")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=2048,
        special_tokens=["<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([t for _, t in train], trainer)
    tok.save(str(OUT / "tokenizer.json"))
    print(f"{len(train)} train + {len(held_out)} held-out documents, vocab {tok.get_vocab_size()}")


if __name__ == "__main__":
    main()
