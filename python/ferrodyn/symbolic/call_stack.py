"""Where CPython keeps a call's callable and its NULL/self slot on the value stack.

The one place that knows the layout, per version; every handler that prepares or makes a call
goes through it: the loads that push a callable for a call (LOAD_GLOBAL with bit 0,
LOAD_ATTR / LOAD_SUPER_ATTR with the method bit, 3.11's LOAD_METHOD) use `push_callable`, and
CALL, CALL_KW and CALL_FUNCTION_EX use `pop_call` / `pop_call_ex`. PUSH_NULL needs nothing:
the compiler emits it where the layout puts the NULL.

    3.11, 3.12   ... method|NULL  self|callable  arg1 ... argN    (Python/bytecodes.c: CALL)
    3.13         ... callable     self|NULL      arg1 ... argN
    CALL_FUNCTION_EX: 3.11/3.12 `NULL callable args [kwargs]`, 3.13 `callable NULL args [kwargs]`

The converter never splits a method from its receiver: a method load pushes the bound
attribute with a NULL slot, so `self` is only ever seen in a slot when CPython's layout puts it
there. Does not own what a call does (the callee tracker's `call_function`).
"""

from __future__ import annotations

import sys

from ferrodyn.variables.base import NULL, NullVariable, VariableTracker

#: CPython < 3.13 keeps the NULL/method slot *below* the callable, 3.13 *above* it.
NULL_BELOW_CALLABLE = sys.version_info[:2] < (3, 13)


def push_callable(tx, fn: VariableTracker) -> None:
    """Push `fn` as the callable of a coming call, with an empty (NULL) self slot."""
    if NULL_BELOW_CALLABLE:
        tx.push(NULL)
        tx.push(fn)
    else:
        tx.push(fn)
        tx.push(NULL)


def pop_call(tx, argc: int) -> tuple[VariableTracker, list[VariableTracker]]:
    """Pop a call's `argc` arguments and its two callable slots (CALL / CALL_KW).

    Returns the object to call and its positional arguments, with `self` first when the layout
    put one in the self slot (CPython prepends it the same way)."""
    args = tx.popn(argc)
    lower, upper = tx.popn(2)
    if NULL_BELOW_CALLABLE:
        # method|NULL, self|callable: a non-NULL lower slot is the function, the upper its self.
        if isinstance(lower, NullVariable):
            return upper, args
        return lower, [upper, *args]
    # callable, self|NULL
    if isinstance(upper, NullVariable):
        return lower, args
    return lower, [upper, *args]


def pop_call_ex(tx) -> VariableTracker:
    """Pop CALL_FUNCTION_EX's callable and its unused NULL slot (its args and kwargs already
    popped); returns the callable."""
    if NULL_BELOW_CALLABLE:
        fn = tx.pop()
        tx.pop()
        return fn
    tx.pop()
    return tx.pop()
