"""The README's Python install block works as written, in a fresh copy of
the repository, with the ``python3`` that comes first on PATH.

The test takes the ```sh block of README.md that holds
``pip install ./plugin/python``, copies the repository's files (tracked and
untracked, without anything .gitignore names: no build outputs, no
libraries next to the package) into a temporary directory, runs the block
there with bash (``set -e``) and then, from another directory, imports
gradcomp with the virtual environment's interpreter and makes a codec round
trip through the library the block built. pip builds the package in an
isolated environment that it fills from the package index, so the test
skips, saying so, where the index cannot be reached.
"""

import os
import re
import shutil
import subprocess
import tempfile
import unittest
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
README = os.path.join(ROOT, "README.md")

#: Wall-clock bounds, in seconds: the block (make plugin, the venv, pip's
#: isolated build; about 15 s with a warm Go build cache) and the probe.
BLOCK_TIMEOUT = 900
PROBE_TIMEOUT = 120

# Variables that would make the block or the probe use something other than
# what a user's fresh shell has: this checkout's package or library, or an
# active virtual environment.
_DROP = ("PYTHONPATH", "PYTHONHOME", "GRADCOMP_LIB", "VIRTUAL_ENV", "PIP_REQUIRE_VIRTUALENV")


def install_block(text):
    """The body of the one ```sh block that installs the package with pip."""
    blocks = re.findall(r"^```(?:sh|bash|console)\n(.*?)^```", text, flags=re.M | re.S)
    found = [b for b in blocks if re.search(r"pip install .*\./plugin/python", b)]
    if len(found) != 1:
        raise AssertionError("README.md: want one ```sh block with `pip install ./plugin/python`, found %d" % len(found))
    return found[0]


def index_url():
    return os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/") + "/"


def index_reachable(timeout=15):
    """None when pip's index answers, else the reason it does not."""
    url = index_url() + "setuptools/"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            r.read(1)
        return None
    except (urllib.error.URLError, OSError) as e:
        return "%s: %s" % (url, e)


def copy_checkout(dst):
    """Copies the files of the checkout a fresh clone (plus uncommitted
    work) would have: git's tracked and untracked files, less the ignored."""
    r = subprocess.run(["git", "-C", ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                       capture_output=True, timeout=60)
    if r.returncode != 0:
        raise unittest.SkipTest("not a git checkout (git ls-files: %s)" % r.stderr.decode(errors="replace").strip())
    for rel in r.stdout.decode().split("\0"):
        src = os.path.join(ROOT, rel)
        if not rel or not os.path.lexists(src):  # deleted in the work tree
            continue
        target = os.path.join(dst, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copy2(src, target, follow_symlinks=False)


PROBE = """
import array, sys
import gradcomp
from gradcomp import _lib
g = array.array("f", [((i * 37) % 101 - 50) / 25.0 for i in range(4096)])
with gradcomp.Compressor("int8:round=nearest") as c:
    buf = bytearray(c.max_encoded_len(len(g)))
    n = c.compress(g, buf)
    out = array.array("f", [0.0]) * len(g)
    c.decompress(bytes(buf[:n]), out)
    err = max(abs(a - b) for a, b in zip(g, out))
    print(gradcomp.__file__)
    print(_lib.path())
    print(c.spec, n, err, "torch" in sys.modules)
"""


class Install(unittest.TestCase):
    def test_readme_install_block(self):
        with open(README, encoding="utf-8") as f:
            block = install_block(f.read())
        python3 = shutil.which("python3")
        if python3 is None:
            raise unittest.SkipTest("no python3 on PATH")
        if shutil.which("go") is None and not os.path.exists("/usr/local/go/bin/go"):
            raise unittest.SkipTest("no Go toolchain: the block's `make plugin` needs one")
        why = index_reachable()
        if why is not None:
            raise unittest.SkipTest("the Python package index is unreachable, and pip's isolated build "
                                    "fetches setuptools and wheel from it (%s)" % why)
        env = {k: v for k, v in os.environ.items() if k not in _DROP}
        with tempfile.TemporaryDirectory(prefix="gradcomp-install-") as tmp:
            src = os.path.join(tmp, "gradcomp")
            copy_checkout(src)
            r = subprocess.run(["bash", "-e", "-c", block], cwd=src, env=env, capture_output=True, text=True,
                               timeout=BLOCK_TIMEOUT)
            self.assertEqual(r.returncode, 0, "README's install block failed (python3 = %s):\n%s\n--- stdout\n%s\n"
                             "--- stderr\n%s" % (python3, block, r.stdout[-6000:], r.stderr[-6000:]))
            venv = os.path.join(src, "venv")
            python = os.path.join(venv, "bin", "python")
            self.assertTrue(os.path.exists(python), "the block made no virtual environment at ./venv")
            r = subprocess.run([python, "-c", PROBE], cwd=tmp, env=env, capture_output=True, text=True,
                               timeout=PROBE_TIMEOUT)
            self.assertEqual(r.returncode, 0, r.stderr)
            pkg, lib, summary = r.stdout.strip().split("\n")
            spec, n, err, torch_loaded = summary.split()
            self.assertTrue(pkg.startswith(venv + os.sep), "imported %s, not the venv's gradcomp" % pkg)
            self.assertTrue(lib.startswith(venv + os.sep), "the installed package loaded %s, not its own copy" % lib)
            self.assertEqual(spec, "int8:round=nearest")
            self.assertGreater(int(n), 0)
            # Nearest rounding: every value within half a step, (max - min)/255/2, of where it was.
            self.assertLessEqual(float(err), (2.0 - -2.0) / 255 / 2 * 1.001)
            self.assertEqual(torch_loaded, "False", "importing gradcomp loaded torch")


if __name__ == "__main__":
    unittest.main()
