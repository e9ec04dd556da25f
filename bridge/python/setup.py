"""Wheel tags for gocoll (the metadata is in pyproject.toml).

The package is pure Python (ctypes), so a wheel of it alone is py3-none-any.
A wheel that ships a built libgocoll.so inside the package (gocoll/ or
gocoll/lib/) holds machine code for one platform: it must be tagged for that
platform, or pip would install it on any machine and the import would fail
there. No Python extension is compiled either way, so the tag stays py3-none.
"""

import pathlib

from setuptools import setup
from setuptools.dist import Distribution

HERE = pathlib.Path(__file__).resolve().parent


def _bundles_library():
    pkg = HERE / "gocoll"
    return any(pkg.glob("libgocoll.so*")) or any((pkg / "lib").glob("libgocoll.so*"))


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


if _bundles_library():
    setup(distclass=_PlatformDistribution, cmdclass={"bdist_wheel": _platform_wheel()})
else:
    setup()
