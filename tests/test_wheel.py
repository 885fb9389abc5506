"""The sdist and the release wheel: the sdist builds a manylinux_2_28 wheel for the running
interpreter's minor, which installs into a fresh virtual environment of that minor and works
there, source tree off the path (issue 2, section 1; issue 11, section 4).

The fixture does what `pip install ferrodyn-<v>.tar.gz` does, offline: `maturin sdist`, unpack
it, and build the wheel from the unpacked tree with the flags `make wheel` uses (zig as the
linker, targeting glibc 2.28: `--zig --compatibility manylinux_2_28`; zig comes from the pinned
`ziglang` package, or a `zig` on PATH). So one build per minor checks that the sdist is complete
and that the wheel's tag is honest (the extension needs no glibc symbol newer than 2.28). The
fresh environment sees the already-installed torch (and the other dependencies) through a .pth
file pointing at a directory of links to this environment's site-packages, with ferrodyn and
every .pth file left out, so the only ferrodyn it can import is the installed wheel.
"""

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
MINOR = sys.version_info[:2]
TAG = f"cp{MINOR[0]}{MINOR[1]}"
# The newest glibc a wheel may need: torch's own Linux wheels target manylinux_2_28.
GLIBC_MAX = (2, 28)
# Legacy manylinux tags and the glibc each stands for (PEP 600).
LEGACY_TAGS = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}


def _clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "VIRTUAL_ENV")}
    env.update(extra)
    return env


def _run(cmd, timeout, **kw):
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kw)
    assert proc.returncode == 0, (
        f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def _maturin():
    local = Path(sys.executable).parent / "maturin"
    return str(local) if local.exists() else shutil.which("maturin")


def _zig() -> str | None:
    """The zig compiler: the pinned `ziglang` package's, else a `zig` on PATH."""
    spec = importlib.util.find_spec("ziglang")
    if spec is not None and spec.submodule_search_locations:
        exe = Path(list(spec.submodule_search_locations)[0]) / "zig"
        if exe.is_file():
            return str(exe)
    return shutil.which("zig")


@pytest.fixture(scope="module")
def sdist(tmp_path_factory) -> Path:
    maturin = _maturin()
    assert maturin, "maturin is not installed (pip install -r requirements-dev.txt)"
    out = tmp_path_factory.mktemp("sdist")
    _run([maturin, "sdist", "--out", out], timeout=600, cwd=REPO, env=_clean_env())
    found = sorted(out.glob("ferrodyn-*.tar.gz"))
    assert len(found) == 1, f"expected one sdist in {out}, got {found}"
    return found[0]


@pytest.fixture(scope="module")
def wheel(sdist, tmp_path_factory) -> Path:
    maturin, zig = _maturin(), _zig()
    assert shutil.which("cargo"), "cargo is needed to build the wheel"
    assert zig, "zig not found: install the pinned ziglang (pip install -r requirements-dev.txt)"
    src = tmp_path_factory.mktemp("sdist-src")
    with tarfile.open(sdist) as tar:
        tar.extractall(src, filter="data")
    (tree,) = [p for p in src.iterdir() if p.is_dir()]
    out = tmp_path_factory.mktemp("wheels")
    env = _clean_env(CARGO_TARGET_DIR=str(REPO / "target" / f"wheel-py{MINOR[0]}{MINOR[1]}"),
                     CARGO_ZIGBUILD_ZIG_PATH=zig)
    _run([maturin, "build", "--release", "--zig", "--compatibility", "manylinux_2_28",
          "-i", sys.executable, "--out", out], timeout=1800, cwd=tree, env=env)
    found = sorted(out.glob(f"ferrodyn-*-{TAG}-*.whl"))
    assert len(found) == 1, f"expected one {TAG} wheel in {out}, got {found}"
    return found[0]


def test_sdist_has_the_sources_and_no_build_outputs(sdist):
    names = tarfile.open(sdist).getnames()
    rel = {n.split("/", 1)[1] for n in names if "/" in n}
    assert {"pyproject.toml", "Cargo.toml", "Cargo.lock", "build.rs", "rust/lib.rs",
            "rust/ffi/frame313.rs", "python/ferrodyn/__init__.py", "python/ferrodyn/_C.pyi",
            "PKG-INFO"} <= rel
    assert not [n for n in rel if n.endswith(".so") or n.startswith(("target/", ".venv"))]


def _glibc(tag: str) -> tuple[int, int] | None:
    m = re.fullmatch(r"manylinux_(\d+)_(\d+)_x86_64", tag)
    if m:
        return int(m.group(1)), int(m.group(2))
    return LEGACY_TAGS.get(tag.removesuffix("_x86_64"))


def test_wheel_tag_is_manylinux_2_28_or_older(wheel):
    python_tag, abi_tag, platforms = wheel.name[:-len(".whl")].split("-")[-3:]
    assert (python_tag, abi_tag) == (TAG, TAG)
    for platform in platforms.split("."):
        glibc = _glibc(platform)
        assert glibc is not None and glibc <= GLIBC_MAX, platform
    zf = zipfile.ZipFile(wheel)
    (meta,) = [n for n in zf.namelist() if n.endswith(".dist-info/WHEEL")]
    tags = re.findall(r"^Tag: (\S+)$", zf.read(meta).decode(), re.M)
    assert tags and all(_glibc(t.split("-")[2]) <= GLIBC_MAX for t in tags), tags
    # The tag is honest: no symbol of the extension needs a newer glibc.
    (native,) = [n for n in zf.namelist() if n.startswith("ferrodyn/_C.") and n.endswith(".so")]
    needed = {(2, int(v)) for v in re.findall(rb"GLIBC_2\.(\d+)", zf.read(native))}
    assert needed and max(needed) <= GLIBC_MAX, sorted(needed)


def test_wheel_contents(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    pkg = {n for n in names if n.startswith("ferrodyn/")}
    assert {"ferrodyn/__init__.py", "ferrodyn/_C.pyi", "ferrodyn/weak.py",
            "ferrodyn/_platform.py"} <= pkg
    native = [n for n in pkg if n.startswith("ferrodyn/_C.") and n.endswith(".so")]
    assert len(native) == 1 and f"-{MINOR[0]}{MINOR[1]}-" in native[0].replace("cpython", "")
    assert not [n for n in names if n.startswith(("tests/", "rust/", "benches/", "python/"))]


def _link_dependencies(dest: Path) -> Path:
    """A directory of links to this environment's site-packages, minus ferrodyn and .pth files."""
    dest.mkdir()
    seen = set()
    for key in ("purelib", "platlib"):
        site = Path(sysconfig.get_paths()[key])
        if not site.is_dir():
            continue
        for entry in site.iterdir():
            low = entry.name.lower()
            if (entry.name in seen or low.startswith(("ferrodyn", "_ferrodyn", "__editable__"))
                    or low.endswith(".pth") or entry.name == "__pycache__"):
                continue
            seen.add(entry.name)
            (dest / entry.name).symlink_to(entry)
    assert "torch" in seen, "torch is not installed in the environment running the tests"
    return dest


CHECK = textwrap.dedent(r"""
    import pathlib, sys
    venv, source = pathlib.Path(sys.argv[1]).resolve(), pathlib.Path(sys.argv[2]).resolve()
    assert all(pathlib.Path(p).resolve() != source for p in sys.path if p), sys.path

    import ferrodyn
    from ferrodyn import _C
    where = pathlib.Path(ferrodyn.__file__).resolve()
    assert venv in where.parents, f"ferrodyn imported from {where}, not from {venv}"
    assert _C.PYTHON_BUILT_FOR == sys.version_info[:2]
    assert (where.parent / "_C.pyi").is_file()
    exercised = ["import"]

    import gc
    import torch
    import ferrodyn.weak as weak
    d = weak.WeakTensorKeyDictionary()
    t, u = torch.zeros(2), torch.zeros(2)
    d[t], d[u] = "t", "u"
    assert (d[t], d[u], len(d)) == ("t", "u", 2)
    del t
    gc.collect()
    assert list(d.values()) == ["u"]
    e = weak.WeakKeyExactDictionary()
    e[u] = 1
    assert e[u] == 1 and 3 not in e
    exercised.append("weak")

    # the other parts of the core, where this build has them
    if hasattr(getattr(_C, "GuardBuilder", None), "type_is"):
        b = _C.GuardBuilder()
        b.type_is(b.local(0, "x"), int)
        tree = b.build()
        assert tree.check([1]) and not tree.check(["a"])
        exercised.append("guards")

        if hasattr(_C, "set_eval_frame") and hasattr(_C, "CacheEntry"):
            def f(x):
                return x + 1
            b = _C.GuardBuilder()
            b.type_is(b.local(0, "x"), str)
            str_tree = b.build()
            misses = []
            def callback(frame):
                if frame.f_code is f.__code__:
                    misses.append(frame.args)
                    guards = tree if type(frame.args[0]) is int else str_tree
                    return _C.CacheEntry(lambda x: x * 100, guards)
                return None
            prev = _C.set_eval_frame(callback)
            try:
                results = [f(1), f(2), f("a")]
            finally:
                _C.set_eval_frame(prev)
            # miss (entry inserted and run), hit, guard failure (a second entry, for str)
            assert results == [100, 200, "a" * 100], results
            assert misses == [(1,), ("a",)], misses
            exercised.append("hook")
    # the converter end to end: a function captured into one graph and run from the cache
    def step(x, w):
        return torch.relu(x @ w).sum(dim=-1) + 1
    graphs = []
    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward
    compiled = ferrodyn.compile(step, backend=backend, fullgraph=True)
    x, w = torch.randn(3, 4), torch.randn(4, 2)
    assert torch.allclose(compiled(x, w), step(x, w)) and torch.allclose(compiled(x, w), step(x, w))
    assert len(graphs) == 1, graphs
    exercised.append("compile")
    print("exercised:", " ".join(exercised))
""")


def test_wheel_installs_and_works_in_a_fresh_venv(wheel, tmp_path):
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], timeout=300)
    py = venv / "bin" / "python"
    site = Path(_run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     timeout=60).stdout.strip())
    deps = _link_dependencies(tmp_path / "deps")
    (site / "_ferrodyn_test_deps.pth").write_text(f"{deps}\n")

    _run([sys.executable, "-m", "pip", "--python", py, "install", "--no-deps", "--no-index",
          "--no-cache-dir", "--disable-pip-version-check", "-q", wheel],
         timeout=600, cwd=tmp_path, env=_clean_env())

    script = tmp_path / "check.py"
    script.write_text(CHECK)
    work = tmp_path / "cwd"
    work.mkdir()
    proc = _run([py, "-I", script, venv, REPO / "python"], timeout=600, cwd=work, env=_clean_env())
    # everything the in-place build of the same source offers must have been exercised
    from ferrodyn import _C

    expected = ["import", "weak"]
    if hasattr(getattr(_C, "GuardBuilder", None), "type_is"):
        expected.append("guards")
        if hasattr(_C, "set_eval_frame") and hasattr(_C, "CacheEntry"):
            expected.append("hook")
    expected.append("compile")
    assert f"exercised: {' '.join(expected)}" in proc.stdout, proc.stdout
