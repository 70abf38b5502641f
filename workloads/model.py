"""A small GPT (nanoGPT's shape) that splits into pipeline stages with balanced layer counts."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from workloads.records import GPTConfig

__all__ = ["GPTConfig", "build_reference", "build_stages", "loss_fn"]


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape                                                     # noqa: N806
        q, k, v = self.qkv(x).split(C, dim=2)                                 # (B, T, C) each
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, h, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)           # (B, h, T, hs)
        return self.proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = nn.Sequential(nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(), nn.Linear(4 * cfg.n_embd, cfg.n_embd))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Stage(nn.Module):
    """Layers [first, last) of the model; stage 0 embeds tokens, the last stage ends with the LM head.

    Input: token ids (B, T) on stage 0, activations (B, T, C) elsewhere. Output: activations (B, T, C),
    or logits (B, T, vocab) on the last stage.
    """

    def __init__(self, cfg: GPTConfig, first: int, last: int, is_first: bool, is_last: bool) -> None:
        super().__init__()
        self.is_first, self.is_last = is_first, is_last
        if is_first:
            self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
            self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(first, last))
        if is_last:
            self.ln_f = nn.LayerNorm(cfg.n_embd)
            self.head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.is_first:
            pos = torch.arange(x.shape[1], device=x.device)
            x = self.wte(x) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        if self.is_last:
            x = self.head(self.ln_f(x))
        return x


def layer_split(n_layer: int, stages: int, split: list[int] | None = None) -> list[tuple[int, int]]:
    """[first, last) layer ranges per stage: balanced (earlier stages get the remainder) or as given."""
    if split is not None:
        if len(split) != stages or sum(split) != n_layer or min(split) < 0:
            raise ValueError(f"split {split} must have {stages} non-negative counts summing to n_layer={n_layer}")
        counts = split
    else:
        if n_layer < stages:
            raise ValueError(f"{n_layer} layers cannot fill {stages} stages; use n_layer >= {stages}")
        counts = [n_layer // stages + (1 if i < n_layer % stages else 0) for i in range(stages)]
    bounds, start = [], 0
    for c in counts:
        bounds.append((start, start + c))
        start += c
    return bounds


def build_stages(cfg: GPTConfig, stages: int, split: list[int] | None = None) -> list[Stage]:
    """All stages, initialised identically to `build_reference` (same seed, same order of parameters)."""
    torch.manual_seed(cfg.seed)
    reference = build_reference(cfg)
    bounds = layer_split(cfg.n_layer, stages, split)
    result = []
    for i, (first, last) in enumerate(bounds):
        stage = Stage(cfg, first, last, i == 0, i == stages - 1)
        own = stage.state_dict()
        for name in own:
            own[name] = reference.state_dict()[_reference_name(name, first)].clone()
        stage.load_state_dict(own)
        result.append(stage)
    return result


def _reference_name(stage_param: str, first: int) -> str:
    if stage_param.startswith("blocks."):
        _, idx, rest = stage_param.split(".", 2)
        return f"blocks.{int(idx) + first}.{rest}"
    return stage_param


def build_reference(cfg: GPTConfig) -> Stage:
    """The whole model as one stage (single-process reference for gradient checks)."""
    torch.manual_seed(cfg.seed)
    model = Stage(cfg, 0, cfg.n_layer, True, True)
    for name, p in model.named_parameters():
        if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
            nn.init.normal_(p, std=0.02 / math.sqrt(2 * cfg.n_layer))
    return model


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
