"""A short tour of ferrodyn: the frame hook, a guard tree, a cache hit, and ferrodyn.compile.

    make demo        (or: PYTHONPATH=python .venv/bin/python examples/demo.py)
"""

import torch

import ferrodyn
from ferrodyn import _C


def section(title):
    print(f"\n== {title} " + "=" * (60 - len(title)))


class TinyNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def scale(x, k):
    return x * k


def main():
    # 1. The hook: a thread-local callback sees frames on a cache miss (argument slots, no frame object)
    section("1. the frame hook")
    seen = []

    def callback(frame):
        seen.append((frame.f_code.co_name, frame.f_locals))
        return None  # None: run the frame normally

    prior = _C.set_eval_frame(callback)
    try:
        scale(2, 3)
    finally:
        _C.set_eval_frame(prior)
    print("the callback saw:", seen)

    # 2. A guard tree: built from Python, checked in Rust, explained on failure
    section("2. a guard tree")
    x = torch.randn(2, 3)
    b = _C.GuardBuilder(globals(), None)
    b.tensor_match(b.local(0, "x"), x)
    b.equals(b.local(1, "k"), 3)
    tree = b.build()
    print("leaves:")
    for leaf in tree.leaves():
        print("   ", leaf)
    print("check(randn(2, 3), 3):", tree.check((torch.randn(2, 3), 3)))
    print("explain(randn(2, 4), 3):", tree.explain((torch.randn(2, 4), 3)))

    # 3. A cache hit: an entry for scale's code runs instead of its bytecode when guards pass
    section("3. a cache hit")
    _C.reset()

    def entry(x, k):
        return ("from the cache", x * k)

    _C.insert_entry(scale.__code__, _C.CacheEntry(entry, tree, compile_id="demo/0"))
    prior = _C.set_eval_frame(False)  # False: cached entries only, never compile
    try:
        print("scale(x, 3)         ->", scale(x, 3)[0])
        print("scale(randn(5), 3)  ->", type(scale(torch.randn(5), 3)).__name__, "(guards failed: ran normally)")
    finally:
        _C.set_eval_frame(prior)
    print("stats:", _C.cache_stats())
    _C.reset()

    # 4. ferrodyn.compile: trace, guard, generate an entry, hit it afterwards
    section("4. ferrodyn.compile on a small model")
    model = TinyNet().eval()

    def forward(x):
        return torch.tanh(model(x)) * 2

    graphs = []

    def counting_eager(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    compiled = ferrodyn.compile(forward, backend=counting_eager)
    x = torch.randn(3, 8)
    for _ in range(3):
        out = compiled(x)
    print("matches eager:", torch.allclose(out, forward(x)), "| graphs compiled:", len(graphs))
    compiled(torch.randn(5, 8))
    print("after a new batch size: graphs compiled:", len(graphs))
    entries = _C.cache_entries(forward.__code__)
    print("cache entries:", [(e.compile_id, e.hits) for e in entries])
    section("5. ferrodyn.explain")
    print(ferrodyn.explain(forward)(x))


if __name__ == "__main__":
    main()
