"""Finding and declaring the library. Everything that loads it runs in a
fresh interpreter; the header checks are pure text."""

import ctypes
import os
import re
import shutil
from types import SimpleNamespace

import pytest

from launch import BRIDGE, PYTHON, run_cmd

from gocoll import _buffer, _lib, errors

HEADER = os.path.join(os.path.dirname(os.path.dirname(BRIDGE)), "capi", "gocoll.h")


def py(code, env=None, cwd=BRIDGE, pythonpath=BRIDGE):
    e = dict(os.environ)
    e.pop(_lib.LIBRARY_ENV, None)
    e.pop("LD_LIBRARY_PATH", None)
    e["PYTHONPATH"] = pythonpath
    e.update(env or {})
    rc, out, err = run_cmd([PYTHON, "-c", code], timeout=60, env=e, cwd=cwd)
    return SimpleNamespace(returncode=rc, stdout=out, stderr=err)


def test_import_loads_neither_library_nor_torch():
    r = py("import sys, gocoll, gocoll._lib as L; "
           "assert L.loaded() is None; assert 'torch' not in sys.modules; print('ok')")
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


def test_explicit_path_that_does_not_exist():
    r = py("import gocoll\ntry:\n    gocoll.init()\nexcept gocoll.LibraryNotFound as e:\n    print(e)",
           env={"GOCOLL_LIBRARY": "/nonexistent/libgocoll.so"})
    assert r.returncode == 0, r.stderr
    assert "/nonexistent/libgocoll.so" in r.stdout and "GOCOLL_LIBRARY" in r.stdout


def test_not_found_names_every_place(tmp_path):
    shutil.copytree(os.path.join(BRIDGE, "gocoll"), tmp_path / "gocoll",
                    ignore=shutil.ignore_patterns("*.so*", "lib", "__pycache__"))
    r = py("import gocoll\ntry:\n    gocoll.load_library()\nexcept ImportError as e:\n    print(e)",
           cwd=str(tmp_path), pythonpath=str(tmp_path))
    assert r.returncode == 0, r.stderr
    for where in (str(tmp_path / "gocoll" / "libgocoll.so"), str(tmp_path / "gocoll" / "lib" / "libgocoll.so"),
                  os.path.join("build", "out", "lib", "libgocoll.so"), "dynamic linker"):
        assert where in r.stdout, (where, r.stdout)
    assert "build/build.sh" in r.stdout


def test_copy_inside_the_package_is_found(library, tmp_path):
    shutil.copytree(os.path.join(BRIDGE, "gocoll"), tmp_path / "gocoll",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(library, tmp_path / "gocoll" / "libgocoll.so")
    r = py("import gocoll; print(gocoll.library_path()); print(gocoll.version())",
           cwd=str(tmp_path), pythonpath=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[0] == str(tmp_path / "gocoll" / "libgocoll.so")


def test_every_function_declared_and_nothing_missing(library):
    r = py("import gocoll; L = gocoll.load_library(); print(L.missing); "
           "print(all(getattr(L.cdll, n).argtypes is not None for n in __import__('gocoll')._lib.SIGNATURES))",
           env={"GOCOLL_LIBRARY": library})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["[]", "True"]


def _header():
    if not os.path.exists(HEADER):
        pytest.skip("capi/gocoll.h not in this checkout")
    with open(HEADER) as f:
        return re.sub(r"/\*.*?\*/", "", f.read(), flags=re.S)


def test_signatures_match_header():
    """Every function of gocoll.h is declared with the header's number of
    arguments, and nothing else is."""
    text = _header()
    protos = dict(re.findall(r"^\s*(?:gocollResult_t|const char\*)\s+(gocoll\w+)\(([^;]*)\);", text, re.M))
    assert set(protos) == set(_lib.SIGNATURES), set(protos) ^ set(_lib.SIGNATURES)
    for name, args in protos.items():
        n = 0 if args.strip() == "void" else args.count(",") + 1
        assert len(_lib.SIGNATURES[name][1]) == n, name


def test_enums_match_header():
    text = _header()

    def enum(prefix):
        return {k: int(v) for k, v in re.findall(r"\b%s(\w+)\s*=\s*(\d+)" % prefix, text)}

    res = enum("gocoll")
    for name, code in (("UnhandledError", errors.UNHANDLED_ERROR), ("SystemError", errors.SYSTEM_ERROR),
                       ("InternalError", errors.INTERNAL_ERROR), ("InvalidArgument", errors.INVALID_ARGUMENT),
                       ("InvalidUsage", errors.INVALID_USAGE), ("RemoteError", errors.REMOTE_ERROR),
                       ("InProgress", errors.IN_PROGRESS), ("Timeout", errors.TIMEOUT)):
        assert res[name] == code, name
    for code, name in _buffer.TYPE_NAMES.items():
        assert res[name[0].upper() + name[1:]] == code, name
    for op, code in (("Sum", 0), ("Prod", 1), ("Max", 2), ("Min", 3), ("Avg", 4)):
        assert res[op] == code
    assert "GOCOLL_UNIQUE_ID_BYTES 128" in text and "GOCOLL_SPLIT_NOCOLOR (-1)" in text


def test_config_matches_header():
    """_lib.Config is gocollConfig_t: the header's fields in its order, with
    its types (the header is checked against the engine's settings table
    by capi's TestConfigFields), its constants, and Config() leaves every
    setting unset as GOCOLL_CONFIG_INITIALIZER does."""
    text = _header()
    body = re.search(r"typedef struct gocollConfig_v\d+ \{(.*?)\} gocollConfig_t;", text, re.S)
    assert body, "gocollConfig_t not found in gocoll.h"
    ctypes_of = {"size_t": ctypes.c_size_t, "unsigned int": ctypes.c_uint, "int": ctypes.c_int,
                 "const char*": ctypes.c_char_p}
    fields = [(name, ctypes_of[ctype]) for ctype, name in
              re.findall(r"^\s*(size_t|unsigned int|int|const char\*)\s*(\w+);", body.group(1), re.M)]
    assert len(fields) == body.group(1).count(";"), "a field of a type this test does not know"
    assert list(_lib.Config._fields_) == fields
    for name, value in (("MAGIC", _lib.CONFIG_MAGIC), ("VERSION", _lib.CONFIG_VERSION)):
        m = re.search(r"#define GOCOLL_CONFIG_%s (0x[0-9a-f]+|\d+)u?" % name, text)
        assert m and int(m.group(1), 0) == value, name
    assert "GOCOLL_CONFIG_UNDEF_INT (-2147483647 - 1)" in text and _lib.CONFIG_UNDEF_INT == -2147483648
    c = _lib.Config()
    assert (c.size, c.magic, c.version) == (ctypes.sizeof(_lib.Config), _lib.CONFIG_MAGIC, _lib.CONFIG_VERSION)
    for name, ctype in _lib.Config._fields_[3:]:
        assert getattr(c, name) == (_lib.CONFIG_UNDEF_INT if ctype is ctypes.c_int else None), name


def test_exception_hierarchy():
    e = errors.from_code(8, "waited", "timed out", "allreduce")
    assert isinstance(e, TimeoutError) and isinstance(e, errors.Error) and e.code == 8
    assert isinstance(errors.from_code(4, "x"), ValueError)
    assert isinstance(errors.from_code(5, "x"), RuntimeError)
    assert isinstance(errors.from_code(6, "x"), ConnectionError)
    assert isinstance(errors.from_code(2, "x"), OSError)
    assert type(errors.from_code(77, "x")) is errors.Error


def _build_wheel(src, out):
    rc, stdout, stderr = run_cmd([PYTHON, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                                  "--no-index", "-q", "-w", str(out), str(src)], timeout=180)
    assert rc == 0, stdout + stderr
    wheels = [w for w in os.listdir(out) if w.endswith(".whl")]
    assert len(wheels) == 1, wheels
    return os.path.join(str(out), wheels[0])


def test_wheel_tags(library, tmp_path):
    """A wheel of the bridge alone is py3-none-any; one that ships
    libgocoll.so is tagged for this platform and holds the library."""
    pytest.importorskip("pip")  # build/deps.sh installs both on Debian
    pytest.importorskip("wheel")
    import sysconfig
    import zipfile
    ignore = shutil.ignore_patterns("__pycache__", "build", "*.egg-info", "tests", "bench", "examples")
    pure = tmp_path / "pure"
    shutil.copytree(BRIDGE, pure, ignore=ignore)
    for leftover in list((pure / "gocoll").glob("libgocoll.so*")):
        leftover.unlink()
    shutil.rmtree(pure / "gocoll" / "lib", ignore_errors=True)
    whl = _build_wheel(pure, tmp_path / "wheels-pure")
    assert whl.endswith("-py3-none-any.whl"), whl

    bundled = tmp_path / "bundled"
    shutil.copytree(pure, bundled)
    shutil.copy(library, bundled / "gocoll" / "libgocoll.so")
    whl = _build_wheel(bundled, tmp_path / "wheels-bundled")
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    assert whl.endswith("-py3-none-%s.whl" % plat), (whl, plat)
    with zipfile.ZipFile(whl) as z:
        assert "gocoll/libgocoll.so" in z.namelist()
    # Installed, it loads the library it ships.
    site = tmp_path / "site"
    rc, stdout, stderr = run_cmd([PYTHON, "-m", "pip", "install", "--no-deps", "--no-index", "-q",
                                  "--target", str(site), whl], timeout=120)
    assert rc == 0, stdout + stderr
    r = py("import gocoll; print(gocoll.library_path()); print(gocoll.version())",
           cwd=str(tmp_path), pythonpath=str(site))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[0] == str(site / "gocoll" / "libgocoll.so"), r.stdout


def test_no_worker_shadows_the_standard_library():
    # A worker runs with tests/workers first on sys.path: a file there named
    # like a standard module (types.py did) replaces it for torch, enum,
    # functools..., unless the interpreter happened to import the real one
    # at startup.
    import sys
    workers = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers")
    names = {os.path.splitext(f)[0] for f in os.listdir(workers) if f.endswith(".py")}
    assert not names & set(sys.stdlib_module_names), names & set(sys.stdlib_module_names)
