"""ferrodyn.weak (rust/weak) and torch.utils.weak side by side under random operation sequences.

A hypothesis state machine applies every operation to both dictionaries with the same key and
value objects (keys die for both at once) and requires the same results, the same exceptions and
the same contents in the same order after every step.
"""

import torch.utils.weak as tweak
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import ferrodyn.weak as fweak


class Key:
    def __init__(self, tag):
        self.tag = tag

    def __repr__(self):
        return f"Key({self.tag})"


def outcome(fn):
    """("ok", result) or ("raise", exception type)."""
    try:
        return ("ok", fn())
    except Exception as e:  # noqa: BLE001 - compared between the two
        return ("raise", type(e))


class Lockstep(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.ref = tweak.WeakIdKeyDictionary()
        self.ours = fweak.WeakIdKeyDictionary()
        self.keys = []  # the strong references; a key dies when removed from here
        self.counter = 0
        for _ in range(6):
            self.new_key()

    def both(self, fn):
        a, b = outcome(lambda: fn(self.ref)), outcome(lambda: fn(self.ours))
        assert a == b, f"torch: {a}, ferrodyn: {b}"
        return a

    def pick(self, i):
        return self.keys[i % len(self.keys)]

    @rule()
    def new_key(self):
        self.counter += 1
        self.keys.append(Key(self.counter))

    def replace_key(self, i):
        """Drop key `i` (it dies), keeping the pool's size with a new one."""
        del self.keys[i % len(self.keys)]
        self.new_key()

    @rule(i=st.integers(0, 1000), v=st.integers(0, 5))
    def set(self, i, v):
        k = self.pick(i)
        self.both(lambda d: d.__setitem__(k, v))

    @rule(i=st.integers(0, 1000))
    def get(self, i):
        k = self.pick(i)
        self.both(lambda d: (d.get(k, "absent"), k in d))
        self.both(lambda d: d[k])

    @rule(i=st.integers(0, 1000), default=st.booleans())
    def pop(self, i, default):
        k = self.pick(i)
        self.both(lambda d: d.pop(k, "absent") if default else d.pop(k))

    @rule(i=st.integers(0, 1000))
    def delete(self, i):
        k = self.pick(i)
        self.both(lambda d: d.__delitem__(k))

    @rule(i=st.integers(0, 1000), v=st.integers(0, 5))
    def setdefault(self, i, v):
        k = self.pick(i)
        self.both(lambda d: d.setdefault(k, v))

    @rule()
    def popitem(self):
        self.both(lambda d: (lambda kv: (kv[0].tag, kv[1]))(d.popitem()))

    @rule(i=st.integers(0, 1000))
    def kill(self, i):
        self.replace_key(i)

    @rule(i=st.integers(0, 1000), after=st.integers(0, 10))
    def kill_while_iterating(self, i, after):
        """Walk both dictionaries step by step; a key dies after `after` steps."""
        holder = [self.keys[i % len(self.keys)]]
        self.replace_key(i)
        iters = [iter(self.ref), iter(self.ours)]
        for n in range(10_000):
            torch_step, ours_step = (outcome(lambda it=it: next(it).tag) for it in iters)
            assert torch_step == ours_step, f"step {n}: torch {torch_step}, ferrodyn {ours_step}"
            if torch_step[0] == "raise":
                break
            if n == after:
                holder.clear()
        holder.clear()

    @rule(s=st.sampled_from(["fresh", "self", "pairs"]))
    def update(self, s):
        if s == "fresh":
            self.both(lambda d: d.update({k: k.tag for k in self.keys[::2]}))
        elif s == "self":
            self.both(lambda d: d.update(d))
        else:
            self.both(lambda d: d.update([(k, -1) for k in self.keys[1::3]]))

    @rule()
    def clear(self):
        self.both(lambda d: d.clear())

    @invariant()
    def same_contents(self):
        a = [(k.tag, v) for k, v in self.ref.items()]
        b = [(k.tag, v) for k, v in self.ours.items()]
        assert a == b
        assert len(self.ref) == len(self.ours) == len(a)
        assert (self.ours == self.ref) is True


TestLockstep = Lockstep.TestCase
TestLockstep.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)

