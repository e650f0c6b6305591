"""Tiny random-weight Hugging Face models from configs, saved with a small WordPiece tokenizer (no hub)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefghijklmnopqrstuvwxyz"]
VOCAB += ["the", "cat", "dog", "sat", "on", "mat", "is", "good", "bad", "and", "##s", "##ed", "##ing"]
SENTENCES = [
    "the cat sat on the mat",
    "a dog is good",
    "the dog sat",
    "cats is bad",
    "the mat is good and the cat is bad",
    "dogs sat on cats",
    "the good dog and the bad cat sat on the mat and the dog is good",
    "mat",
]
VISION = ("vit", "convnext", "swin", "mobilevit")


def _configs() -> dict[str, Any]:
    import transformers as T

    v = len(VOCAB)
    small = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
    return {
        "bert": lambda: T.BertModel(T.BertConfig(vocab_size=v, max_position_embeddings=128, **small)),
        "roberta": lambda: T.RobertaModel(
            T.RobertaConfig(vocab_size=v, max_position_embeddings=130, pad_token_id=0, **small)
        ),
        "distilbert": lambda: T.DistilBertModel(
            T.DistilBertConfig(vocab_size=v, dim=32, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=128)
        ),
        "gpt2": lambda: T.GPT2Model(T.GPT2Config(vocab_size=v, n_embd=32, n_layer=2, n_head=2, n_positions=128)),
        "t5": lambda: T.T5EncoderModel(
            T.T5Config(vocab_size=v, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2)
        ),
        "albert": lambda: T.AlbertModel(
            T.AlbertConfig(vocab_size=v, embedding_size=16, max_position_embeddings=128, **small)
        ),
        "vit": lambda: T.ViTModel(T.ViTConfig(image_size=32, patch_size=8, **small)),
        "convnext": lambda: T.ConvNextModel(
            T.ConvNextConfig(image_size=32, hidden_sizes=[8, 16], depths=[1, 1], num_stages=2)
        ),
        "swin": lambda: T.SwinModel(
            T.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4)
        ),
        # initializer_range 0.5: at the default 0.02 this tiny stack's pooled output is exactly 0 for every image
        # (a dead model, whose parity would be vacuous)
        "mobilevit": lambda: T.MobileViTModel(
            T.MobileViTConfig(
                image_size=32,
                hidden_sizes=[16, 24, 32],
                neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64],
                initializer_range=0.5,
            )
        ),
    }


ARCHS = ("bert", "roberta", "distilbert", "gpt2", "t5", "albert", "vit", "convnext", "swin", "mobilevit")


def save_tokenizer(folder: Path) -> None:
    """A WordPiece tokenizer over :data:`VOCAB` with BERT's [CLS] / [SEP] template."""
    import transformers as T
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(VOCAB)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    fast = T.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )
    fast.save_pretrained(folder)


def save_tiny(arch: str, folder: Path, *, head: str | None = None, labels: int = 3) -> Path:
    """Save a tiny random ``arch`` model (optionally with a task ``head`` class name) and its tokenizer."""
    import torch
    import transformers as T

    torch.manual_seed(0)
    model = _configs()[arch]()
    if head is not None:
        cfg = model.config
        cfg.num_labels = labels
        model = getattr(T, head).from_config(cfg)
    model.eval().save_pretrained(folder)
    if arch not in VISION:
        save_tokenizer(folder)
    return folder
