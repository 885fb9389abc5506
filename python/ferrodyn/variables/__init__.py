"""Variable trackers: symbolic stand-ins for Python values during tracing.

`builder.build(tx, value, source)` is the one way to make a tracker from a real value; each
module owns one family (constants, tensors, sequences, dicts, functions, modules, builtins,
torch functions, context managers, user objects) and `operators` the Python operators.
"""
