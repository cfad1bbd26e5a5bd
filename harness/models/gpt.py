"""A decoder-only Transformer (GPT, pre-LayerNorm) as an nn.Sequential: embeddings, Transformer blocks, head."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

#: The standard deviation of nanoGPT's (and GPT-2's) weight initialisation.
INIT_STD = 0.02


class Embeddings(nn.Module):
    """Token ids (N x T, int64) -> token plus learned position embeddings (N x T x D), then dropout."""


    def __init__(self, vocab: int, d_model: int, context: int, dropout: float):
        super().__init__()
        self.token = nn.Embedding(vocab, d_model)
        self.position = nn.Embedding(context, d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        return self.drop(self.token(ids) + self.position(positions))


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention in which position t attends to positions <= t (scaled_dot_product_attention)."""


    def __init__(self, d_model: int, n_head: int, dropout: float):
        super().__init__()
        if d_model % n_head:
            raise ValueError(f"d_model = {d_model} is not divisible by n_head = {n_head}")
        self.n_head, self.dropout = n_head, dropout
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(n, t, self.n_head, d // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        return self.drop(self.proj(y.transpose(1, 2).reshape(n, t, d)))


class TransformerBlock(nn.Module):
    """x + attention(LN(x)), then x + MLP(LN(x)) with a 4x GELU MLP (GPT-2's pre-LayerNorm block)."""

    def __init__(self, d_model: int, n_head: int, dropout: float):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_head, dropout)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model),
                                 nn.Dropout(dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Head(nn.Module):
    """The final LayerNorm and the linear map to next-token logits (N x T x vocab)."""

    def __init__(self, d_model: int, vocab: int):
        super().__init__()
        self.ln = nn.LayerNorm(d_model)
        self.out = nn.Linear(d_model, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.ln(x))


def gpt(vocab: int, n_layer: int = 4, n_head: int = 4, d_model: int = 128, context: int = 64,
        dropout: float = 0.0) -> nn.Sequential:
    """[Embeddings, n_layer TransformerBlocks, Head]: the blocks pipelines and Local Parallelism cut.

    Initialised as nanoGPT and GPT-2: every Linear and Embedding weight from N(0, 0.02), biases 0, the residual
    projections (attention's and the MLP's last Linear) from N(0, 0.02 / sqrt(2 n_layer)). Unlike nanoGPT the head
    is not tied to the token embedding: the two sit in different pipeline stages.
    """
    model = nn.Sequential(Embeddings(vocab, d_model, context, dropout),
                          *(TransformerBlock(d_model, n_head, dropout) for _ in range(n_layer)),
                          Head(d_model, vocab))
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=INIT_STD)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
    for block in model[1:-1]:
        for residual in (block.attn.proj, block.mlp[2]):
            nn.init.normal_(residual.weight, mean=0.0, std=INIT_STD / math.sqrt(2 * n_layer))
    return model


def sequence_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy over every position: logits N x T x V against next tokens N x T (the mean is per token)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction=reduction)
