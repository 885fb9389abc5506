"""Activation checkpointing in a transformers model (`gradient_checkpointing_enable()`, train
mode): each decoder layer is a `tag_activation_checkpoint` body; ferrodyn captures as many
graphs as torch.compile, and the loss and every parameter's gradient match eager's."""

from __future__ import annotations

import os
import warnings

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import transformers as hf  # noqa: E402

import ferrodyn  # noqa: E402
from counting_backend import CountingBackend  # noqa: E402

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")

_H = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
          intermediate_size=64, max_position_embeddings=64, num_key_value_heads=2)


def test_llama_gradient_checkpointing_train():
    reentrant = False  # transformers' default; True is refused (test_higher_order_ops.py)
    torch.manual_seed(0)
    model = hf.LlamaModel(hf.LlamaConfig(**_H))
    model.train()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    ids = torch.randint(0, 64, (2, 8))

    def loss_and_grads(m):
        model.zero_grad()
        loss = m(input_ids=ids).last_hidden_state.pow(2).mean()
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                               if p.grad is not None}

    eager_loss, eager_grads = loss_and_grads(model)
    counts = {}
    for name, compile_fn in (("torch", torch.compile), ("ferrodyn", ferrodyn.compile)):
        torch._dynamo.reset()
        cb = CountingBackend()
        loss, grads = loss_and_grads(compile_fn(model, backend=cb))
        counts[name] = cb
        torch.testing.assert_close(loss, eager_loss)
        assert grads.keys() == eager_grads.keys()
        for n in grads:
            torch.testing.assert_close(grads[n], eager_grads[n], atol=1e-5, rtol=1e-4)
    assert counts["ferrodyn"].count == counts["torch"].count == 1
    tags = [n for g in counts["ferrodyn"].graphs for n in g.graph.nodes
            if n.target is torch.ops.higher_order.tag_activation_checkpoint]
    assert len(tags) == _H["num_hidden_layers"]
