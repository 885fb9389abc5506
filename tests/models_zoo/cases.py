"""The zoo's cases: each model with example inputs in two shapes and what the differential
run should exercise (training mode, randomness, gradients, a state change). Does not run
anything (harness.py) or hold expectations (test_models.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn as nn

from models_zoo.patterns import (
    VAE, AutocastHead, DenseMoE, DictOutput, FeatureTap, InputInPlace, ItemNormalizer, TiedGPT, LabelSmoothingLoss,
    LoggingModel, MixedStack, NamedTupleOutput, Router, RouterConfig, RunningStats, SparseMoE,
    SuperForwardNet, TeacherStudent, make_mlp, masked_attention,
)
from models_zoo.sequence import (
    BagClassifier, BertStyleSelfAttention, DecoderBlock, GreedyGenerator, EncoderStack, GRUClassifier, HFStyleEncoder, RotaryAttention,
    SelfAttention, TinyGPT, UnrolledRNN,
)
from models_zoo.vision import (
    AudioConvNet, BasicBlock, DropPathBlock, PyramidPool, TinyFPN, ShuffleSEBlock, TimmStyleNet, TinyResNet, TinyUNet, TinyViT,
)


def _g(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=_g(seed))


def _padding_mask(b, t, seed):
    lengths = torch.randint(t // 2, t + 1, (b,), generator=_g(seed))
    return torch.arange(t)[None, :] >= lengths[:, None]  # True = padded


def _tokens(b, t, vocab, seed, pad=False):
    toks = torch.randint(1, vocab, (b, t), generator=_g(seed))
    if pad:
        toks[:, t - 2:] = 0
    return toks


class Args:
    """Example arguments with keywords: `inputs` returns one of these or a plain tuple."""

    def __init__(self, *args, **kwargs):
        self.args = args
        self.kwargs = kwargs


def invoke(fn, inputs):
    if isinstance(inputs, Args):
        return fn(*inputs.args, **inputs.kwargs)
    return fn(*inputs)


@dataclass
class Case:
    """One zoo entry.

    build: a fresh model or function (parameters from a fixed seed).
    inputs(variant, seed): example arguments (a tuple, or Args with keywords); variant 0 and 1
        differ in shape.
    train: put a module in training mode (else eval).
    random: the forward draws random numbers (both runs are given the same seed).
    grad: gradients are compared (loss = sum of the float tensor outputs).
    change: an optional state change applied to both models before a last call
        (a config flag flipped, train/eval switched): the guards must notice it.
    """

    name: str
    build: Callable[[], Any]
    inputs: Callable[[int, int], tuple]
    train: bool = False
    random: bool = False
    grad: bool = False
    change: Callable[[Any], None] | None = None
    atol: float = 1e-5
    rtol: float = 1.3e-6


def _seeded(fn):
    def build():
        torch.manual_seed(0)
        return fn()
    return build


def _flip_router(model):
    model.cfg.head = "reg"
    model.cfg.residual = False


CASES: list[Case] = [
    Case("resnet_eval", _seeded(TinyResNet),
         lambda v, s: (_randn(*((2, 3, 16, 16), (3, 3, 12, 12))[v], seed=s),), atol=1e-4, rtol=1e-4),
    Case("resnet_train", _seeded(TinyResNet),
         lambda v, s: (_randn(*((2, 3, 16, 16), (3, 3, 12, 12))[v], seed=s),),
         train=True, change=lambda m: m.eval(), atol=1e-4, rtol=1e-4),
    Case("resnet_block_train", _seeded(lambda: BasicBlock(4, 8, stride=2)),
         lambda v, s: (_randn(*((2, 4, 8, 8), (3, 4, 6, 6))[v], seed=s),),
         train=True, grad=True, change=lambda m: m.eval(), atol=1e-4, rtol=1e-4),
    Case("gpt_decoder", _seeded(TinyGPT),
         lambda v, s: (_tokens(2, (8, 12)[v], 50, s), _tokens(2, (8, 12)[v], 50, s + 1)),
         grad=True, atol=1e-4, rtol=1e-4),
    Case("gpt_block", _seeded(DecoderBlock),
         lambda v, s: (_randn(2, (8, 5)[v], 32, seed=s),), atol=1e-4, rtol=1e-4),
    Case("transformer_encoder_layer",
         _seeded(lambda: nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.0, batch_first=True)),
         lambda v, s: (_randn(2, (6, 9)[v], 32, seed=s),), train=True, grad=True, atol=1e-4, rtol=1e-4),
    Case("transformer_encoder", _seeded(EncoderStack),
         lambda v, s: (_randn(3, (6, 9)[v], 32, seed=s), _padding_mask(3, (6, 9)[v], s)), atol=1e-4, rtol=1e-4),
    Case("transformer_encoder_dropout_train", _seeded(EncoderStack),
         lambda v, s: (_randn(3, (6, 9)[v], 32, seed=s), _padding_mask(3, (6, 9)[v], s)),
         train=True, random=True, atol=1e-4, rtol=1e-4),
    Case("multihead_attention", _seeded(SelfAttention),
         lambda v, s: (_randn(2, (5, 7)[v], 32, seed=s), _padding_mask(2, (5, 7)[v], s)), atol=1e-4, rtol=1e-4),
    Case("rnn_cell_loop", _seeded(UnrolledRNN),
         lambda v, s: (_randn((6, 5)[v], 3, 8, seed=s),), grad=True, atol=1e-4, rtol=1e-4),
    Case("mlp_dropout_eval", _seeded(make_mlp), lambda v, s: (_randn((4, 7)[v], 16, seed=s),)),
    Case("mlp_dropout_train", _seeded(make_mlp), lambda v, s: (_randn((4, 7)[v], 16, seed=s),),
         train=True, random=True, grad=True),
    Case("moduledict_router", _seeded(lambda: Router(RouterConfig())),
         lambda v, s: (_randn((4, 6)[v], 16, seed=s),), change=_flip_router),
    Case("functional_where_einsum", lambda: masked_attention,
         lambda v, s: (_randn(2, 2, (4, 6)[v], 8, seed=s), _randn(2, 2, (5, 3)[v], 8, seed=s + 1),
                       _randn(2, 2, (5, 3)[v], 8, seed=s + 2),
                       _randn(2, 2, (4, 6)[v], (5, 3)[v], seed=s + 3) > -0.5)),
    Case("dict_output", _seeded(DictOutput), lambda v, s: (_randn((4, 6)[v], 16, seed=s),)),
    Case("namedtuple_output", _seeded(NamedTupleOutput), lambda v, s: (_randn((4, 6)[v], 16, seed=s),)),
    Case("isinstance_modulelist", _seeded(MixedStack), lambda v, s: (_randn((4, 6)[v], 16, seed=s),),
         change=lambda m: m.train()),
    Case("buffer_inplace_update", _seeded(RunningStats), lambda v, s: (_randn((4, 6)[v], 16, seed=s),),
         train=True, change=lambda m: m.eval()),
    Case("embedding_bag_classifier", _seeded(BagClassifier),
         lambda v, s: (_tokens((3, 4)[v], (7, 10)[v], 100, s, pad=True),)),
    Case("conv1d_audio", _seeded(AudioConvNet), lambda v, s: (_randn(2, (400, 320)[v], seed=s),),
         atol=1e-4, rtol=1e-4),
    Case("hf_style_encoder", _seeded(HFStyleEncoder),
         lambda v, s: (_tokens(2, (6, 8)[v], 60, s),),
         atol=1e-4, rtol=1e-4),
    Case("hf_style_encoder_kwargs", _seeded(HFStyleEncoder),
         lambda v, s: Args(_tokens(2, (6, 8)[v], 60, s), attention_mask=(_randn(2, (6, 8)[v], seed=s) > -1).long(),
                             output_hidden_states=True),
         atol=1e-4, rtol=1e-4),
    Case("vit_tiny", _seeded(TinyViT), lambda v, s: (_randn((2, 3)[v], 3, 16, 16, seed=s),),
         grad=True, atol=1e-4, rtol=1e-4),
    Case("unet_small", _seeded(TinyUNet), lambda v, s: (_randn(2, 1, *((16, 16), (8, 12))[v], seed=s),),
         atol=1e-4, rtol=1e-4),
    Case("shuffle_se_block", _seeded(ShuffleSEBlock), lambda v, s: (_randn((2, 3)[v], 16, 8, 8, seed=s),),
         train=True, change=lambda m: m.eval(), atol=1e-4, rtol=1e-4),
    Case("vae", _seeded(VAE), lambda v, s: (_randn((4, 6)[v], 16, seed=s),), train=True, random=True,
         grad=True, atol=1e-4, rtol=1e-4),
    Case("moe_dense_top2", _seeded(DenseMoE), lambda v, s: (_randn((5, 7)[v], 16, seed=s),), atol=1e-5),
    Case("moe_sparse_dispatch", _seeded(SparseMoE), lambda v, s: (_randn((6, 9)[v], 16, seed=s),), atol=1e-5),
    Case("nn_gru", _seeded(GRUClassifier), lambda v, s: (_randn(2, (5, 7)[v], 8, seed=s),), atol=1e-5),
    Case("rotary_sdpa", _seeded(RotaryAttention), lambda v, s: (_randn(2, (6, 8)[v], 32, seed=s),),
         atol=1e-4, rtol=1e-4),
    Case("timm_style", _seeded(TimmStyleNet), lambda v, s: (_randn((2, 3)[v], 3, 12, 12, seed=s),),
         atol=1e-4, rtol=1e-4),
    Case("super_forward", _seeded(SuperForwardNet), lambda v, s: (_randn((4, 6)[v], 16, seed=s),)),
    Case("forward_hooks_features", _seeded(FeatureTap), lambda v, s: (_randn((4, 6)[v], 16, seed=s),)),
    Case("teacher_student_no_grad", _seeded(TeacherStudent), lambda v, s: (_randn((4, 6)[v], 16, seed=s),),
         train=True, grad=True),
    Case("autocast_bf16", _seeded(AutocastHead), lambda v, s: (_randn((4, 6)[v], 16, seed=s),),
         atol=1e-2, rtol=1e-2),
    Case("item_in_forward", _seeded(ItemNormalizer), lambda v, s: (_randn((4, 6)[v], 16, seed=s),)),
    Case("logging_in_forward", _seeded(LoggingModel), lambda v, s: (_randn((4, 6)[v], 16, seed=s),)),
    Case("label_smoothing_loss", _seeded(LabelSmoothingLoss),
         lambda v, s: (_randn((4, 6)[v], 16, seed=s), torch.randint(0, 5, ((4, 6)[v],), generator=_g(s))),
         grad=True),
    Case("bert_style_attention", _seeded(BertStyleSelfAttention),
         lambda v, s: (_randn(2, (5, 7)[v], 32, seed=s), (_randn(2, (5, 7)[v], seed=s) > -1).long()),
         atol=1e-4, rtol=1e-4),
    Case("greedy_generate_no_grad", _seeded(GreedyGenerator), lambda v, s: (_tokens(2, (4, 6)[v], 50, s),),
         atol=1e-4, rtol=1e-4),
    Case("droppath_train", _seeded(DropPathBlock), lambda v, s: (_randn((4, 6)[v], 8, 6, 6, seed=s),),
         train=True, random=True, grad=True, change=lambda m: m.eval(), atol=1e-4, rtol=1e-4),
    Case("fpn_interpolate", _seeded(TinyFPN), lambda v, s: (_randn(2, 3, *((16, 16), (24, 20))[v], seed=s),),
         atol=1e-4, rtol=1e-4),
    Case("input_inplace", _seeded(InputInPlace),
         lambda v, s: (_randn((4, 6)[v], 16, seed=s) * 2, _randn((4, 6)[v], 16, seed=s + 1) > 0.5)),
    Case("gpt_weight_tying", _seeded(TiedGPT), lambda v, s: (_tokens(2, (5, 7)[v], 40, s),), grad=True),
    Case("pyramid_pool", _seeded(PyramidPool), lambda v, s: (_randn(2, 3, *((8, 8), (12, 12))[v], seed=s),)),
]

CASES_BY_NAME = {c.name: c for c in CASES}
