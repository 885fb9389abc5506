"""transformers' own ModelOutput classes (BaseModelOutput, BaseModelOutputWithPooling) made,
indexed and returned in traced code, and a module returning one; compiled vs eager, one graph,
torch.compile's count beside. Needs transformers (installed in the 3.11 environment; not yet a
pinned dev requirement)."""


import pytest
import torch

import ferrodyn
from compiled_vs_eager import check_one_graph_like_torch, run_all, same
from test_object_model_outputs import _uses

import transformers.modeling_outputs as transformers_outputs  # noqa: E402
BaseModelOutput = transformers_outputs.BaseModelOutput
BaseModelOutputWithPooling = transformers_outputs.BaseModelOutputWithPooling

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")

CASES = _uses(BaseModelOutput)


@pytest.mark.parametrize("fn", CASES, ids=[f.__name__ for f in CASES])
def test_base_model_output(fn):
    check_one_graph_like_torch(fn, torch.randn(3))


def test_returned_model_output_is_the_same_kind_of_object():
    def fn(x):
        return BaseModelOutputWithPooling(last_hidden_state=x + 1, pooler_output=x * 2)

    x = torch.randn(2)
    got = ferrodyn.compile(fn, backend="eager")(x)
    want = fn(x)
    assert type(got) is type(want)
    assert list(got.keys()) == list(want.keys())
    assert same(dict(got), dict(want)) and same(got.to_tuple(), want.to_tuple())
    assert got.hidden_states is None and torch.equal(got.pooler_output, want.pooler_output)


class TinyEncoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x, return_dict=True):
        h = torch.tanh(self.lin(x))
        out = BaseModelOutputWithPooling(last_hidden_state=h, pooler_output=h.mean(0))
        return out if return_dict else out.to_tuple()


@pytest.mark.parametrize("return_dict", [True, False])
def test_module_returning_model_output(return_dict):
    torch.manual_seed(0)
    m = TinyEncoder()
    _, _, fd, tc = run_all(lambda x: m(x, return_dict=return_dict)[0] * 2, torch.randn(2, 4))
    assert fd == 1 and tc <= fd
