"""nn.Module tree methods called with arguments, and isinstance against legacy tensor types.
Found by running PyTorch's test/dynamo/_test_misc_part4.py through ferrodyn:
`named_parameters(prefix="foo")` ignored the prefix (`test_named_parameters`), and the
handlers took their arguments by position in the wrong slots (`parameters(False)` was read as a
prefix and recursed); `isinstance(t, torch.FloatTensor)` compared classes where the legacy
type's metaclass compares dtype and device (`test_tensor_types`). Each case compares with eager
and with torch.compile's graph count."""

import pytest
import torch

from compiled_vs_eager import run_all

pytestmark = pytest.mark.usefixtures("fresh_ferrodyn")


def _model():
    torch.manual_seed(0)
    shared = torch.nn.Linear(2, 2)
    m = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Sequential(shared, torch.nn.ReLU()), shared)
    m.register_buffer("scale", torch.ones(2))
    m[0].register_buffer("offset", torch.zeros(2))
    return m


MODEL = _model()


CALLS = {
    "named_parameters_prefix": lambda m: [k for k, _ in m.named_parameters(prefix="foo")],
    "named_parameters_positional": lambda m: [k for k, _ in m.named_parameters("p", False)],
    "named_parameters_keep_duplicates": lambda m: [k for k, _ in m.named_parameters(remove_duplicate=False)],
    "named_buffers_prefix_norecurse": lambda m: [k for k, _ in m.named_buffers(prefix="b", recurse=False)],
    "named_buffers": lambda m: [k for k, _ in m.named_buffers()],
    "parameters_no_recurse": lambda m: len(list(m.parameters(False))),
    "parameters_recurse_kw": lambda m: len(list(m.parameters(recurse=True))),
    "buffers_positional": lambda m: len(list(m.buffers(False))),
    "named_modules_prefix": lambda m: [k for k, _ in m.named_modules(prefix="root")],
    "named_modules_keep_duplicates": lambda m: [k for k, _ in m.named_modules(remove_duplicate=False)],
    "named_modules_positional": lambda m: [k for k, _ in m.named_modules(None, "r", False)],
    "modules": lambda m: len(list(m.modules())),
    "named_children": lambda m: [k for k, _ in m.named_children()],
    "children": lambda m: len(list(m.children())),
}


def test_module_tree_method_arguments():
    """Every call of CALLS in one frame (one compile): names and counts equal eager's."""
    def fn(x):
        return x + 1, [call(MODEL) for call in CALLS.values()]
    _, _, fd, tc = run_all(fn, torch.ones(2))
    assert fd == tc == 1, (fd, tc)


def test_module_tree_values_are_the_module_tensors():
    def fn(x):
        total = x
        for p in MODEL.parameters(recurse=True):
            total = total + p.sum()
        for _, b in MODEL.named_buffers(prefix="z"):
            total = total + b.sum()
        return total
    _, _, fd, tc = run_all(fn, torch.ones(2))
    assert fd == tc == 1, (fd, tc)


def test_isinstance_legacy_tensor_types():
    def fn(x):
        out = [x + 1, isinstance(x, torch.FloatTensor), isinstance(x, torch.DoubleTensor)]
        for dtype in (torch.float32, torch.float64, torch.int64, torch.bool):
            t = torch.zeros(2, dtype=dtype)
            out += [isinstance(t, torch.FloatTensor), isinstance(t, torch.DoubleTensor),
                    isinstance(t, (torch.LongTensor, torch.BoolTensor)), isinstance(t, torch.Tensor)]
        return out
    _, _, fd, tc = run_all(fn, torch.ones(2))
    assert fd == tc == 1, (fd, tc)
