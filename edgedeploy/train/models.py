"""Model factories that ship with the package, so a checkpoint's ``factory`` imports anywhere.

``deploy build`` takes a sidecar's factory from this module without ``model.trust_sidecar_code``
(the package zoo), so models users train with ``deploy train`` and deploy belong here. Factories
take ``temperature=`` (``loss.export_temperature = 'output'``): the model then returns
``(logits, softmax(logits / T))``. Heavy dependencies (transformers) are imported inside factories.
"""

from __future__ import annotations

import torch
from torch import nn

from edgedeploy.train.blocks import ResidualBlock, init_weights


def _with_probabilities(logits: torch.Tensor, temperature: float | None) -> torch.Tensor | tuple[torch.Tensor, ...]:
    if temperature is None:
        return logits
    return logits, torch.softmax(logits.float() / temperature, dim=-1)


class DigitsCNN(nn.Module):
    """Small residual CNN for 8x8 single-channel digits: stem, two residual stages, pooled linear head."""

    def __init__(
        self, channels: int = 32, num_classes: int = 10, in_channels: int = 1, temperature: float | None = None
    ) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels), nn.ReLU()
        )
        self.stage1 = ResidualBlock(channels, channels)
        self.stage2 = ResidualBlock(channels, 2 * channels, stride=2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(2 * channels, num_classes)
        self.temperature = temperature
        init_weights(self)

    def forward(self, x):
        x = self.stage2(self.stage1(self.stem(x)))
        return _with_probabilities(self.head(self.pool(x).flatten(1)), self.temperature)


def digits_cnn(
    channels: int = 32, num_classes: int = 10, in_channels: int = 1, temperature: float | None = None
) -> DigitsCNN:
    """Factory for ``examples/digits`` (``edgedeploy.train.models:digits_cnn``)."""
    return DigitsCNN(channels, num_classes, in_channels, temperature)


class MLP(nn.Module):
    """Flatten, ``len(hidden)`` ReLU layers, linear head: for tabular or small flattened inputs."""

    def __init__(
        self, in_features: int, hidden: list[int] | tuple[int, ...] = (64,), num_classes: int = 10,
        temperature: float | None = None,
    ) -> None:  # fmt: skip
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        width = in_features
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, num_classes)
        self.temperature = temperature

    def forward(self, x):
        return _with_probabilities(self.head(self.body(x)), self.temperature)


def mlp(
    in_features: int, hidden: list[int] | tuple[int, ...] = (64,), num_classes: int = 10,
    temperature: float | None = None,
) -> MLP:  # fmt: skip
    """Factory ``edgedeploy.train.models:mlp``."""
    return MLP(in_features, tuple(hidden), num_classes, temperature)


class BertBiLSTMClassifier(nn.Module):
    """BERT encoder -> BiLSTM over its token states -> masked additive self-attention pooling -> linear.

    The seed's hybrid text classifier: BERT extracts contextual features, the BiLSTM adds sequential
    (long-range, order-sensitive) modelling, attention weights the informative tokens. Inputs are
    ``input_ids`` and ``attention_mask`` (int64, ``(batch, length)``); padding gets zero attention.
    ``freeze_layers`` keeps the embeddings and the lowest BERT layers fixed (the seed froze 6 of 12).
    Built from a ``transformers.BertConfig`` (random init; no hub download), eager attention so the
    ONNX export is plain MatMul/Softmax.
    """

    def __init__(
        self, vocab_size: int, num_classes: int, *, hidden: int = 256, layers: int = 4, heads: int = 4,
        intermediate: int = 1024, max_length: int = 128, lstm_hidden: int = 128, dropout: float = 0.1,
        freeze_layers: int = 0, temperature: float | None = None,
    ) -> None:  # fmt: skip
        super().__init__()
        try:
            from transformers import BertConfig, BertModel
        except ImportError:
            from edgedeploy.errors import ConfigError

            raise ConfigError(
                "the BERT + BiLSTM classifier needs transformers", hint="pip install 'edgedeploy[hf]'"
            ) from None
        config = BertConfig(
            vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
            intermediate_size=intermediate, max_position_embeddings=max_length, hidden_dropout_prob=dropout,
            attention_probs_dropout_prob=dropout, attn_implementation="eager",
        )  # fmt: skip
        self.bert = BertModel(config, add_pooling_layer=False)
        self.lstm = nn.LSTM(hidden, lstm_hidden, batch_first=True, bidirectional=True)
        self.attn = nn.Linear(2 * lstm_hidden, 1)
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(2 * lstm_hidden, num_classes)
        self.temperature = temperature
        if freeze_layers:
            frozen = [self.bert.embeddings, *self.bert.encoder.layer[:freeze_layers]]
            for module in frozen:
                for p in module.parameters():
                    p.requires_grad_(False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        states = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        # zero the padded positions: the backward LSTM runs through them into the real tokens, and
        # packed sequences do not export to ONNX; zeros make padding content irrelevant
        states = states * attention_mask.unsqueeze(-1).to(states.dtype)
        seq, _ = self.lstm(states)
        scores = self.attn(seq).squeeze(-1)
        scores = scores.masked_fill(attention_mask == 0, torch.finfo(scores.dtype).min)
        weights = torch.softmax(scores, dim=-1).unsqueeze(-1)
        pooled = (weights * seq).sum(dim=1)
        return _with_probabilities(self.head(self.dropout(pooled)), self.temperature)


def bert_bilstm_classifier(
    vocab_size: int, num_classes: int, tiny: bool = False, temperature: float | None = None, **overrides
) -> BertBiLSTMClassifier:
    """Factory ``edgedeploy.train.models:bert_bilstm_classifier``; ``tiny = true`` is a 2-layer,
    hidden-32 BERT for tests and CPU examples (keys given in ``overrides`` still win)."""
    sizes = dict(hidden=32, layers=2, heads=2, intermediate=64, lstm_hidden=32) if tiny else {}
    sizes.update(overrides)
    return BertBiLSTMClassifier(vocab_size, num_classes, temperature=temperature, **sizes)


class HFSequenceClassifier(nn.Module):
    """A Hugging Face ``AutoModelForSequenceClassification`` returning its logits tensor (positional inputs
    ``input_ids``, ``attention_mask``[, ``token_type_ids``]), so ONNX capture sees plain tensors. State-dict
    keys are the wrapped model's under ``model.``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        extra = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        return self.model(input_ids=input_ids, attention_mask=attention_mask, **extra).logits


def hf_sequence_classifier(model_type: str, config: dict | None = None) -> HFSequenceClassifier:
    """Factory ``edgedeploy.train.models:hf_sequence_classifier``: a randomly initialised sequence classifier
    of ``model_type`` from ``config`` (what ``PretrainedConfig.to_diff_dict()`` gives), eager attention for
    a plain ONNX graph. The Hugging Face Trainer bridge records these kwargs; transformers is imported here."""
    import transformers as T

    settings = {k: v for k, v in (config or {}).items() if k not in ("model_type", "transformers_version")}
    cfg = T.AutoConfig.for_model(model_type, **settings)
    cfg._attn_implementation = "eager"
    return HFSequenceClassifier(T.AutoModelForSequenceClassification.from_config(cfg, attn_implementation="eager"))
