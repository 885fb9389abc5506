"""Sample tensors for ferrodyn's tensor-layout calibration (embedded into the Rust crate by
rust/tensor/calibrate.rs; not part of the Python package). Owns only the choice of samples and
what the Python API says about each; the Rust side reads the raw memory and compares."""

import contextlib
import functools

import torch


def _clean(fn):
    """Run `fn` in a plain state whatever the caller's: grad mode on, no inference mode, no
    active dispatch/function modes, CPU default device, so samples are ordinary tensors; the
    user's CPU random number generator is left exactly as it was (samples draw from a fork)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.random.fork_rng(devices=[]))
            stack.enter_context(torch.enable_grad())
            stack.enter_context(torch.inference_mode(False))
            stack.enter_context(torch.device("cpu"))
            stack.enter_context(torch._C.DisableTorchFunction())
            from torch.utils._python_dispatch import _disable_current_modes
            stack.enter_context(_disable_current_modes())
            return fn(*args, **kwargs)

    return wrapper


@_clean
def describe(t):
    """What the Python API reports for `t` (the ground truth of verification)."""
    return {
        "sizes": tuple(t.size()),
        "strides": tuple(t.stride()),
        "dtype": t.dtype,
        "device_type": t.device.type,
        "device_index": -1 if t.device.index is None else t.device.index,
        "requires_grad": t.requires_grad,
        "dispatch_keys": torch._C._dispatch_keys(t).raw_repr(),
        "impl": t._cdata,
    }


class _Wrapper(torch.Tensor):
    @staticmethod
    def __new__(cls, elem, **kw):
        return torch.Tensor._make_wrapper_subclass(
            cls, elem.shape, strides=elem.stride(), dtype=elem.dtype, device=elem.device, **kw)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise NotImplementedError(func)


class _Sub(torch.Tensor):
    pass


WRAPPERS_PER_KIND = 16


@_clean
def probes():
    """Tensors with distinctive metadata used to locate fields."""
    base = torch.empty(50000)
    strided = base.as_strided((11, 13, 17), (1009, 101, 7), 3)
    leaf = torch.randn(3, requires_grad=True)
    fresh_leaf = torch.randn(4, requires_grad=True)
    nonleaf = leaf * 2
    nonleaf2 = fresh_leaf + 1
    toggled = torch.randn(5, requires_grad=True)
    e = torch.empty(3, 4)
    # WRAPPERS_PER_KIND of each kind, created round-robin and all kept alive: the bitfield word
    # has padding bits that keep whatever the heap held there, and a policy bit is one that
    # every wrapper of its kind has and no policy-free tensor has (see calibrate.rs).
    kinds = {
        "none": {},
        "sizes": {"dispatch_sizes_strides_policy": "sizes"},
        "strides": {"dispatch_sizes_strides_policy": "strides"},
        "device": {"dispatch_device": True},
        "layout": {"dispatch_layout": True},
    }
    wrappers = {k: [] for k in kinds}
    for _ in range(WRAPPERS_PER_KIND):
        for k, kw in kinds.items():
            wrappers[k].append(_Wrapper(e, **kw))
    with torch.inference_mode():
        inference = torch.empty(2, 3)
    vbase = torch.randn(4, 3)
    rbase = torch.randn(4, 3, requires_grad=True)
    with torch.no_grad():
        nograd_view = rbase[1:]
    views = [(vbase[1:], vbase), (vbase.t()[1:], vbase), (nograd_view, rbase), (rbase[2:], rbase)]
    return {
        "views": views,
        "strided": strided,
        "plain": torch.empty(7),
        "leaves": [leaf, fresh_leaf],
        "nonleaves": [nonleaf, nonleaf2],
        # a non-leaf whose grad_fn calibrate.rs clears with detach_(): only the real grad_fn_
        # word goes from set to null (AutogradMeta's std::string name_ keeps whatever the heap
        # held in its inline buffer, so the leaf/non-leaf contrast alone can be ambiguous)
        "detachable": leaf * 3,
        "toggled": toggled,
        "wrappers": wrappers,
        "keyed": [strided, torch.empty(2, device="meta"), inference, leaf],
        "dtypes": [torch.empty(2, dtype=d) for d in DTYPES],
        "devices": [torch.empty(2), torch.empty(2, device="meta")],
    }


@_clean
def detach_in_place(t):
    """`t.detach_()` in the plain state (calibrate.rs: `grad_fn_` is the word it clears; under
    the caller's inference mode it would not be cleared)."""
    t.detach_()


DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
          torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64, torch.complex128]
for _name in ("float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64"):
    if hasattr(torch, _name):
        DTYPES.append(getattr(torch, _name))


@_clean
def verification_set():
    """A broad set of tensors whose raw reads must agree with the Python API."""
    out = []
    for d in DTYPES:
        out.append(torch.zeros(3, 2, dtype=d))
    a = torch.randn(4, 6, 8)
    out += [a, a.t() if a.dim() == 2 else a.transpose(0, 2), a[1:, ::2, 3], a[..., None].expand(4, 6, 8, 5),
            torch.tensor(3.5), torch.randn(2, 3, 1, 2, 1, 3), torch.randn(1, 2, 1, 2, 1, 2, 1),
            torch.randn(2, 1, 2, 1, 2, 1, 2, 3).transpose(1, 6), torch.empty(0, 5), torch.empty(5, 0, 3),
            torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last), torch.randn(3).as_strided((3, 4), (1, 0)),
            torch.nn.Parameter(torch.randn(3, 3)), torch.nn.Parameter(torch.randn(3), requires_grad=False),
            torch.empty(4, 4, device="meta"), torch.empty(2, 3, 4, 5, 6, 7, device="meta").transpose(0, 5)]
    x = torch.randn(3, 4, requires_grad=True)
    y = x * 3
    out += [x, y, y.sum(), x[0], x.t(), y[1:], x.detach(), y.detach()[::2]]
    z = torch.randn(2, 2, requires_grad=True)
    z.requires_grad_(False)
    out.append(z)
    with torch.no_grad():
        out.append(x * 2)
        out.append(x[1])
    with torch.inference_mode():
        out.append(torch.randn(2, 5))
    out.append(torch.randn(3, 3, dtype=torch.float64, requires_grad=True)[1:].t())
    out.append(torch.randn(3, 3).as_subclass(_Sub))
    out.append(torch.randn(3, 3, requires_grad=True).as_subclass(_Sub))
    return out


def non_plain_keys():
    """Raw bits of the functionality keys under which sizes/strides may be answered by Python
    or by a wrapper (the tensor_size/tensor_stride accessors then use the Python API)."""
    bits = 0
    for name in ("Python", "PythonTLSSnapshot", "Functionalize", "Sparse", "SparseCsr",
                 "NestedTensor", "Quantized", "PythonDispatcher"):
        key = getattr(torch._C.DispatchKey, name, None)
        if key is not None:
            try:
                bits |= torch._C.DispatchKeySet(key).raw_repr()
            except Exception:
                pass
    return bits
