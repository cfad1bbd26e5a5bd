"""Text as training data: a corpus tokenized through `datasets` (char- or byte-level, cached), split by position, and
cut into windows of `context` tokens whose targets are the next tokens."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any

import torch

from harness.data.corpus import Corpus, locked
from harness.data.sources import cache_dir

#: Bumped when tokenization changes, so cached token files from older code are not reused.
TOKENIZER_VERSION = 1


@dataclass
class Tokens:
    """A corpus as token ids: `train` and `held_out` (1-D int64), the vocabulary size, and for char-level the
    characters in id order."""

    train: torch.Tensor
    held_out: torch.Tensor
    vocab_size: int
    chars: str | None
    provenance: dict[str, Any]


def _cache_key(corpus: Corpus, tokenizer: str, held_out: float) -> str:
    held = "" if corpus.held_out is None else Corpus(corpus.held_out).text_sha256
    text = json.dumps([corpus.text_sha256, held, tokenizer, held_out, TOKENIZER_VERSION])
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def tokenize(corpus: Corpus, tokenizer: str = "char", held_out: float = 0.1) -> Tokens:
    """Token ids of `corpus`. The documents are joined (each followed by a newline) and encoded by a `datasets`
    map: `char` gives each distinct character of the corpus an id in sorted order (nanoGPT's shakespeare_char),
    `byte` its UTF-8 bytes (vocabulary 256). The last `held_out` fraction of the tokens is the held-out split, unless
    the corpus brings its own. The ids are cached under <cache_dir()>/text, keyed by the text's sha256 and the
    tokenizer, so later runs and every rank skip the work."""
    if tokenizer not in ("char", "byte"):
        raise ValueError(f"tokenizer must be 'char' or 'byte', not {tokenizer!r}")
    folder = cache_dir() / "text"
    path = folder / f"{_cache_key(corpus, tokenizer, held_out)}.pt"
    with locked(folder / ".lock"):
        if not path.exists():
            saved = _encode(corpus, tokenizer, held_out, folder)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            torch.save(saved, tmp)
            os.replace(tmp, path)
    saved = torch.load(path, weights_only=True)
    chars = saved["chars"] or None
    provenance = {**corpus.provenance, "tokenizer": tokenizer, "vocab_size": int(saved["vocab_size"]),
                  "train_tokens": len(saved["train"]), "held_out_tokens": len(saved["held_out"]),
                  "held_out": "the corpus's own split" if corpus.held_out is not None else
                  f"the last {held_out:g} of the tokens"}
    return Tokens(saved["train"].long(), saved["held_out"].long(), int(saved["vocab_size"]), chars, provenance)


def _encode(corpus: Corpus, tokenizer: str, held_out: float, folder) -> dict[str, Any]:
    import datasets
    import numpy as np

    parts = [corpus.documents] + ([corpus.held_out] if corpus.held_out is not None else [])
    if tokenizer == "char":
        chars = "".join(sorted({c for docs in parts for d in docs for c in d} | {"\n"}))
        lookup = {c: i for i, c in enumerate(chars)}
        vocab = len(chars)

        def encode(batch: dict[str, list[str]]) -> dict[str, list[np.ndarray]]:
            return {"ids": [np.fromiter((lookup[c] for c in t + "\n"), dtype=np.int32, count=len(t) + 1)
                            for t in batch["text"]]}
    else:
        chars, vocab = "", 256

        def encode(batch: dict[str, list[str]]) -> dict[str, list[np.ndarray]]:
            return {"ids": [np.frombuffer((t + "\n").encode("utf-8"), dtype=np.uint8).astype(np.int32)
                            for t in batch["text"]]}

    encoded = []
    # `datasets` reuses an existing cache_file_name as is, so its name keys everything the ids depend on: the
    # documents, the tokenizer, its version and (char) the vocabulary, which a held-out split's characters change.
    vocab_key = hashlib.sha256(f"{tokenizer}{TOKENIZER_VERSION}{chars}".encode()).hexdigest()[:16]
    for docs in parts:
        dataset = datasets.Dataset.from_dict({"text": docs})
        dataset = dataset.map(encode, batched=True, remove_columns=["text"], desc=f"tokenizing ({tokenizer})",
                              cache_file_name=str(folder / f"map-{Corpus(docs).text_sha256[:16]}-{vocab_key}.arrow"))
        ids = [np.asarray(row, dtype=np.int32) for row in dataset.with_format("numpy")["ids"]]
        encoded.append(torch.from_numpy(np.concatenate(ids) if ids else np.zeros(0, dtype=np.int32)))
    dtype = torch.uint8 if vocab <= 256 else torch.int32
    if corpus.held_out is not None:
        train, held = encoded
    else:
        ids = encoded[0]
        n_held = max(1, round(held_out * len(ids)))
        train, held = ids[:len(ids) - n_held], ids[len(ids) - n_held:]
    return {"train": train.to(dtype), "held_out": held.to(dtype), "vocab_size": vocab, "chars": chars}


class TokenWindows:
    """Samples of a language model: window i is tokens [i·stride, i·stride + context) of `ids`, its targets the
    tokens one position later. Duck-typed as TensorData (inputs, targets, len, transform, normalize), so the data
    order, the batches and every method's loading work unchanged; the windows are a view of `ids`, not copies.

    `limit` keeps that many windows evenly spread over all of them (the held-out split's evaluation sample)."""

    transform = None
    normalize = None

    def __init__(self, ids: torch.Tensor, context: int, stride: int, limit: int | None = None):
        if len(ids) < context + 1:
            raise ValueError(f"{len(ids)} tokens cannot make a window of context {context} (need {context + 1})")
        self.context, self.stride = context, stride
        self.windows = ids.unfold(0, context + 1, stride)
        if limit is not None and limit < len(self.windows):
            pick = torch.linspace(0, len(self.windows) - 1, limit).round().long()
            self.windows = self.windows[pick]

    def __len__(self) -> int:
        return len(self.windows)

    def inputs(self, indices: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        return self.windows[indices, :-1].long()

    def targets(self, indices: torch.Tensor) -> torch.Tensor:
        return self.windows[indices, 1:].long()

