"""Wheel contents and tags for gocoll (the metadata is in pyproject.toml).

The package is pure Python (ctypes) and needs ``libgocoll.so`` at run time.
The wheel ships a built library inside the package (``gocoll/libgocoll.so``,
the first place the bridge looks) when one is found at build time:

1. ``$GOCOLL_WHEEL_LIBRARY``, when set (then it must exist; a variable of
   its own, so that GOCOLL_LIBRARY, which says where the bridge loads the
   library from at run time, does not change what a wheel holds);
2. a copy already inside the package directory (``gocoll/libgocoll.so`` or
   ``gocoll/lib/libgocoll.so``);
3. the repository's build output, ``build/out/lib/libgocoll.so`` (what
   ``build/build.sh`` makes), when building from a checkout.

A wheel with the library holds machine code for one platform, so it is
tagged for that platform (``py3-none-linux_x86_64``: no Python extension is
compiled, the tag stays py3-none) and pip will not install it elsewhere.
Without one the wheel is ``py3-none-any`` and the installed package finds
the library through ``GOCOLL_LIBRARY`` or the dynamic linker's path.

Offline (no package index): ``pip install --no-build-isolation`` uses the
setuptools and wheel already installed (Debian's python3-setuptools and
python3-wheel); see bridge/python/README.md.
"""

import os
import pathlib
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = pathlib.Path(__file__).resolve().parent
PKG = HERE / "gocoll"
REPO_BUILD = HERE.parent.parent / "build" / "out" / "lib" / "libgocoll.so"


def _in_package():
    return any(PKG.glob("libgocoll.so*")) or any((PKG / "lib").glob("libgocoll.so*"))


def _library_to_copy():
    """The built library to copy into the wheel (a real file, symbolic links
    resolved), or None when there is none or one is in the package already."""
    explicit = os.environ.get("GOCOLL_WHEEL_LIBRARY")
    if explicit:
        if not os.path.isfile(explicit):
            sys.exit("setup.py: GOCOLL_WHEEL_LIBRARY=%s is not a file" % explicit)
        return os.path.realpath(explicit)
    if _in_package():
        return None  # package data ships it
    if REPO_BUILD.exists():
        return str(REPO_BUILD.resolve())
    return None


class build_py_with_library(build_py):
    """build_py, plus the library copied into the built package as
    gocoll/libgocoll.so (never into the source tree)."""

    def run(self):
        super().run()
        src = _library_to_copy()
        if src is not None:
            dst = os.path.join(self.build_lib, "gocoll", "libgocoll.so")
            self.copy_file(src, dst, preserve_mode=True)


def _platform_wheel():
    try:
        from setuptools.command.bdist_wheel import bdist_wheel  # setuptools >= 70.1
    except ImportError:
        from wheel.bdist_wheel import bdist_wheel  # older setuptools with the wheel package

    class platform_wheel(bdist_wheel):
        def get_tag(self):
            _python, _abi, plat = super().get_tag()
            return "py3", "none", plat

    return platform_wheel


class _PlatformDistribution(Distribution):
    """Not pure: the wheel's files go to platlib, at the wheel's root."""

    def has_ext_modules(self):
        return True


if _in_package() or _library_to_copy() is not None:
    setup(distclass=_PlatformDistribution,
          cmdclass={"bdist_wheel": _platform_wheel(), "build_py": build_py_with_library})
else:
    print("setup.py: no built libgocoll.so found (GOCOLL_WHEEL_LIBRARY, gocoll/, %s): building a "
          "py3-none-any wheel without it; the installed package then needs GOCOLL_LIBRARY or "
          "the library on the dynamic linker's path" % REPO_BUILD, file=sys.stderr)
    setup()
