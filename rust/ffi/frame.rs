//! CPython frame internals (PEP 523 hook, `_PyInterpreterFrame`, code extras) for 3.11 / 3.12.
