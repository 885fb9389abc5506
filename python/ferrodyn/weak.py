"""ferrodyn.weak: the public weak-key dictionaries, implemented in Rust (ferrodyn._C).

Owns the public names and their registration as `collections.abc.MutableMapping`:

- `WeakIdKeyDictionary` / `WeakTensorKeyDictionary` (one class, as in torch): the behaviour of
  `torch.utils.weak.WeakIdKeyDictionary` (keys compared by identity and held weakly; an entry
  vanishes when its key dies; `ref_type=torch.utils.weak._WeakHashRef` compares keys by hash);
- `WeakKeyExactDictionary`: identity-keyed, weakly held keys for the converter's object tracking;
  inserting a key that cannot be weakly referenced raises TypeError, looking one up misses.

Does not own the implementation (rust/weak/) and never imports torch.
"""

from collections.abc import MutableMapping

from ferrodyn._C import WeakIdKeyDictionary, WeakKeyExactDictionary, WeakTensorKeyDictionary

__all__ = ["WeakIdKeyDictionary", "WeakKeyExactDictionary", "WeakTensorKeyDictionary"]

# Registered rather than subclassed: a Python subclass would put its MRO lookups and instance
# dict on every call, and every MutableMapping method is implemented natively anyway.
MutableMapping.register(WeakIdKeyDictionary)
MutableMapping.register(WeakKeyExactDictionary)
