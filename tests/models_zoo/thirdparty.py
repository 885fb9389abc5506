"""Third-party model code in the zoo: transformers, timm and torchvision models built from small
configs (random weights, nothing downloaded: the libraries' offline switches are set before they
are imported). Each is a `Case` for the zoo's differential harness (harness.py); expectations
(which are one graph today) live in tests/test_models_thirdparty.py.

Covered: ten transformers families (BERT, RoBERTa, DistilBERT, GPT-2, Llama, Qwen2, T5, BART,
ViT, CLIP text), in inference, with a padded batch (attention masks), a training step
(gradients compared) and a KV-cache decode step; five timm / torchvision models.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import timm  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torchvision  # noqa: E402
import transformers as hf  # noqa: E402

from models_zoo.cases import Args, Case, _g, _randn, _seeded  # noqa: E402

VOCAB = 100
_H = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
          vocab_size=VOCAB, max_position_embeddings=64)
_TOL = dict(atol=1e-4, rtol=1e-4)


def _ids(b: int, t: int, seed: int) -> torch.Tensor:
    return torch.randint(1, VOCAB, (b, t), generator=_g(seed))


def _padded(b: int, t: int, seed: int, **extra) -> Args:
    """Token ids with right padding and the matching attention mask (1 = real token), plus
    `extra` keyword arguments."""
    lengths = torch.randint(t // 2, t + 1, (b,), generator=_g(seed + 7))
    lengths[0] = t  # at least one full row
    mask = (torch.arange(t)[None, :] < lengths[:, None]).long()
    return Args(_ids(b, t, seed) * mask, attention_mask=mask, **extra)


def _text(v: int, s: int) -> tuple:
    return (_ids(2, (8, 11)[v], s),)


def _image(v: int, s: int) -> tuple:
    return (_randn((2, 3)[v], 3, 32, 32, seed=s),)


def _no_cache(**extra):
    def inputs(v: int, s: int) -> Args:
        return Args(_ids(2, (8, 11)[v], s), use_cache=False, **extra)
    return inputs


def _seq2seq(v: int, s: int) -> Args:
    ids = _ids(2, (8, 11)[v], s)
    return Args(ids, decoder_input_ids=_ids(2, (5, 7)[v], s + 1), use_cache=False)


class DecodeStep(nn.Module):
    """One prefill and one greedy decode step through a causal LM's KV cache (as `generate`
    does it): returns the logits of both steps."""

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.lm = lm

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        first = self.lm(ids, use_cache=True)
        nxt = first.logits[:, -1:].argmax(-1)
        second = self.lm(nxt, past_key_values=first.past_key_values, use_cache=True)
        return first.logits, second.logits


def _bert():
    return hf.BertModel(hf.BertConfig(**_H))


def _bert_classifier():
    return hf.BertForSequenceClassification(hf.BertConfig(**_H, num_labels=3))


def _gpt2_config():
    return hf.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=64,
                         bos_token_id=0, eos_token_id=0)


def _llama_config():
    return hf.LlamaConfig(**_H, num_key_value_heads=2)


def _vit():
    cfg = {k: v for k, v in _H.items() if k not in ("vocab_size", "max_position_embeddings")}
    return hf.ViTModel(hf.ViTConfig(**cfg, image_size=32, patch_size=8))


THIRDPARTY_CASES: list[Case] = [
    # -- transformers: inference ---------------------------------------------------------
    Case("hf_bert", _seeded(_bert), _text, **_TOL),
    Case("hf_bert_padded", _seeded(_bert), lambda v, s: _padded(2, (8, 11)[v], s), **_TOL),
    Case("hf_roberta", _seeded(lambda: hf.RobertaModel(hf.RobertaConfig(**_H, pad_token_id=0))),
         _text, **_TOL),
    Case("hf_distilbert", _seeded(lambda: hf.DistilBertModel(hf.DistilBertConfig(
        dim=32, n_layers=2, n_heads=4, hidden_dim=64, vocab_size=VOCAB,
        max_position_embeddings=64))), lambda v, s: _padded(2, (8, 11)[v], s), **_TOL),
    Case("hf_gpt2", _seeded(lambda: hf.GPT2LMHeadModel(_gpt2_config())), _no_cache(), **_TOL),
    Case("hf_llama_padded", _seeded(lambda: hf.LlamaModel(_llama_config())),
         lambda v, s: _padded(2, (8, 11)[v], s, use_cache=False), **_TOL),
    Case("hf_qwen2", _seeded(lambda: hf.Qwen2Model(hf.Qwen2Config(**_H, num_key_value_heads=2))),
         _no_cache(), **_TOL),
    Case("hf_t5", _seeded(lambda: hf.T5Model(hf.T5Config(
        d_model=32, d_ff=64, num_layers=2, num_heads=4, vocab_size=VOCAB, d_kv=8))), _seq2seq,
         **_TOL),
    Case("hf_bart", _seeded(lambda: hf.BartModel(hf.BartConfig(
        d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=VOCAB,
        max_position_embeddings=64))), _seq2seq, **_TOL),
    Case("hf_vit", _seeded(_vit), _image, **_TOL),
    Case("hf_clip_text", _seeded(lambda: hf.CLIPTextModel(hf.CLIPTextConfig(
        **_H, bos_token_id=0, eos_token_id=2))), _text, **_TOL),
    # -- transformers: a training step and KV-cache decoding ------------------------------
    Case("hf_bert_train_step", _seeded(_bert_classifier),
         lambda v, s: _padded(2, (8, 11)[v], s,
                              labels=torch.randint(0, 3, (2,), generator=_g(s + 3))),
         train=True, random=True, grad=True, **_TOL),
    Case("hf_gpt2_decode", _seeded(lambda: DecodeStep(hf.GPT2LMHeadModel(_gpt2_config()))),
         _text, **_TOL),
    Case("hf_llama_decode", _seeded(lambda: DecodeStep(hf.LlamaForCausalLM(_llama_config()))),
         _text, **_TOL),
    # -- timm / torchvision ---------------------------------------------------------------
    Case("timm_resnet10t", _seeded(lambda: timm.create_model("resnet10t", num_classes=10)),
         _image, **_TOL),
    Case("timm_vit_tiny", _seeded(lambda: timm.create_model(
        "vit_tiny_patch16_224", num_classes=10, img_size=32, patch_size=8)), _image, **_TOL),
    Case("timm_convnext_atto", _seeded(lambda: timm.create_model("convnext_atto", num_classes=10)),
         _image, train=True, grad=True, **_TOL),
    Case("tv_mobilenet_v3_small", _seeded(lambda: torchvision.models.mobilenet_v3_small(
        num_classes=10)), _image, **_TOL),
    Case("tv_resnet18", _seeded(lambda: torchvision.models.resnet18(num_classes=10)), _image,
         **_TOL),
]

THIRDPARTY_BY_NAME = {c.name: c for c in THIRDPARTY_CASES}
