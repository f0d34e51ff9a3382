"""The README's install works on a machine without a Python package index:
``pip install --no-build-isolation ./plugin/python`` into a virtual
environment that sees Debian's packages (setuptools, torch) builds the
package from a copy of the source tree with pip's --no-index, and the
installed package, imported from elsewhere, loads the library that
``make plugin`` put next to it and compresses.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import libpath

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.join(HERE, "..", "..", "plugin", "python")


class Install(unittest.TestCase):
    def test_pip_install_without_an_index(self):
        libpath.require_library()
        if not os.path.exists(os.path.join(PACKAGE, "gradcomp", "libgradcomp.so")):
            raise unittest.SkipTest("plugin/python/gradcomp/libgradcomp.so not built (run `make plugin`)")
        with tempfile.TemporaryDirectory(prefix="gradcomp-install-") as tmp:
            src = os.path.join(tmp, "src")
            shutil.copytree(PACKAGE, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
            env_dir = os.path.join(tmp, "venv")
            subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", env_dir], check=True,
                           capture_output=True, timeout=120)
            python = os.path.join(env_dir, "bin", "python")
            env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GRADCOMP_LIB")}
            r = subprocess.run([python, "-m", "pip", "install", "--no-build-isolation", "--no-index", src],
                               capture_output=True, text=True, timeout=300, env=env)
            self.assertEqual(r.returncode, 0, "pip install failed:\n%s\n%s" % (r.stdout, r.stderr))
            probe = (
                "import gradcomp\n"
                "from gradcomp import _lib\n"
                "with gradcomp.Compressor('int8') as c:\n"
                "    print(_lib.path(), c.spec)\n"
            )
            r = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=120, env=env, cwd=tmp)
            self.assertEqual(r.returncode, 0, r.stderr)
            path, spec = r.stdout.split()
            self.assertTrue(path.startswith(env_dir), "the installed package loaded %s, not its own copy" % path)
            self.assertEqual(spec, "int8")


if __name__ == "__main__":
    unittest.main()
