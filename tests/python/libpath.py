"""Locates libgradcomp.so for the tests, or skips them with the reason."""

import os
import unittest

import gradcomp
from gradcomp import _lib


def require_library():
    """Loads the library (GRADCOMP_LIB or next to the package); raises
    unittest.SkipTest naming what was tried when it is not built."""
    try:
        _lib.lib()
    except gradcomp.LibraryNotFoundError as e:
        raise unittest.SkipTest("libgradcomp.so not available (run `make plugin`): %s" % e)
    return os.environ.get(_lib.ENV_LIB) or _lib.candidates()[0]
