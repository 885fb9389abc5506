"""Round-trip of code objects through ferrodyn.bytecode (decode -> assemble), usable by the
test suite and standalone on any supported interpreter without torch or ferrodyn._C:

    python3.13 tests/bytecode_roundtrip.py        # prints the number of code objects checked

The package is loaded from python/ferrodyn/bytecode by path (it uses relative imports only)."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types

_HERE = os.path.dirname(os.path.abspath(__file__))
_PKG = os.path.join(_HERE, os.pardir, "python", "ferrodyn", "bytecode")

# a large, varied set: exceptions, with, generators, async, match, comprehensions, big functions
MODULES = ("argparse", "ast", "asyncio.base_events", "asyncio.tasks", "calendar", "collections",
           "contextlib", "csv", "dataclasses", "datetime", "decimal", "difflib", "dis", "email.message",
           "enum", "fractions", "functools", "glob", "gzip", "heapq", "http.client", "inspect",
           "ipaddress", "json.decoder", "json.encoder", "logging", "logging.handlers", "pathlib",
           "pickle", "pprint", "pydoc", "random", "re._compiler", "re._parser", "shutil",
           "socket", "statistics", "string", "subprocess", "tarfile", "tempfile", "textwrap",
           "threading", "tokenize", "traceback", "typing", "unittest.case", "urllib.parse",
           "uuid", "warnings", "zipfile", "zoneinfo._zoneinfo", "configparser", "optparse",
           "smtplib", "ftplib", "imaplib", "sre_constants", "selectors", "signal", "locale",
           "gettext", "codecs", "copy", "weakref", "abc", "bisect", "queue", "sched", "shlex",
           "xml.dom.minidom", "xml.etree.ElementTree", "sqlite3.dbapi2", "concurrent.futures._base",
           "multiprocessing.pool", "email.feedparser", "email._header_value_parser")


def load_bytecode_package(name: str = "ferrodyn_bytecode_standalone"):
    """ferrodyn.bytecode when importable, else the package loaded by path under `name`."""
    try:
        return importlib.import_module("ferrodyn.bytecode")
    except Exception:
        pass
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, os.path.join(_PKG, "__init__.py"),
                                                  submodule_search_locations=[_PKG])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def iter_codes(code: types.CodeType):
    yield code
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield from iter_codes(c)


def module_code(modname: str) -> types.CodeType:
    spec = importlib.util.find_spec(modname)
    path = spec.origin
    if not path or not os.path.isfile(path):  # frozen modules: read the stdlib file
        import sysconfig
        rel = modname.replace(".", os.sep)
        path = os.path.join(sysconfig.get_paths()["stdlib"], rel + ".py")
        if not os.path.isfile(path):
            path = os.path.join(sysconfig.get_paths()["stdlib"], rel, "__init__.py")
    with open(path, "rb") as f:
        return compile(f.read(), path, "exec")


def roundtrip(bc, code: types.CodeType) -> types.CodeType:
    return bc.assemble(bc.decode(code), code)


def check_code(bc, code: types.CodeType) -> list[str]:
    """Mismatches between `code` and its round trip (empty: identical)."""
    new = roundtrip(bc, code)
    where = f"{code.co_filename}:{code.co_firstlineno} {code.co_qualname}"
    bad = []
    for field in ("co_code", "co_exceptiontable", "co_stacksize", "co_linetable", "co_flags"):
        if getattr(new, field) != getattr(code, field):
            bad.append(f"{where}: {field} differs")
    if new != code:
        bad.append(f"{where}: code objects differ")
    return bad


def check_modules(bc, modules=MODULES) -> tuple[int, list[str]]:
    n, bad = 0, []
    for m in modules:
        for code in iter_codes(module_code(m)):
            n += 1
            bad += check_code(bc, code)
    return n, bad


if __name__ == "__main__":
    bc = load_bytecode_package()
    n, bad = check_modules(bc)
    print(f"{sys.version.split()[0]}: {n} code objects, {len(bad)} mismatches")
    for b in bad[:20]:
        print("  ", b)
    sys.exit(1 if bad else 0)
