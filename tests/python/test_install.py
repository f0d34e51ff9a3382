"""The package installs as a user gets it, each way in a fresh place.

- The README's install block (``Install``): the ```sh block of README.md
  that holds ``pip install ./plugin/python``, run with bash (``set -e``) in
  a copy of the repository's files (tracked and untracked, without anything
  .gitignore names: no build outputs, no libraries next to the package)
  with the ``python3`` first on PATH and Go on PATH; then, from another
  directory, the new virtual environment's interpreter imports gradcomp and
  makes a codec round trip through the library pip's build hook built.
  pip builds in an isolated environment that it fills from the package
  index, so this test skips, saying so, where the index cannot be reached.
- The wheel (``Wheel``): ``make wheel`` in a copy of the repository with
  this Python's setuptools; the wheel's name, tag and files; then a fresh
  virtual environment of this Python, with Go on no PATH, installs it
  (pip, no index) and runs a DDP step on 2 gloo ranks with
  ``gradcomp.torch.State("int8")`` from it.
- The source (``SourceInstall``): ``pip install ./plugin/python`` in a
  copy of the repository fails, saying what to run, where Go is on no PATH
  and no library is next to the package; packages what ``make plugin``
  left there (never the fake-device library) without Go; and with Go
  builds a package that imports and loads its own library. These use this
  Python's setuptools (``--no-build-isolation``): no package index.
"""

import filecmp
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import unittest
import urllib.error
import urllib.request
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
README = os.path.join(ROOT, "README.md")

#: Wall-clock bounds, in seconds: the README's block (the venv, pip's
#: isolated build with the Go build; about 15 s with a warm Go build
#: cache), make wheel and a pip build or install (each a few seconds warm;
#: minutes with a cold Go build cache), the probes.
BLOCK_TIMEOUT = 900
BUILD_TIMEOUT = 900
PROBE_TIMEOUT = 120
#: The DDP run from the wheel: steps, of which warm-up (dense, exact).
DDP_STEPS = 5
DDP_WARMUP = 3

#: Where scripts/setup and the Makefile find Go when it is on no PATH.
GO_BIN = "/usr/local/go/bin"
#: The libraries a wheel holds (the CUDA one where cuda.h is), and the
#: fake-device test library it must not.
CPU_LIB, CUDA_LIB, FAKE_LIB = "libgradcomp.so", "libgradcomp_cuda.so", "libgradcomp_fake.so"

# Variables that would make a build or a probe use something other than
# what a user's fresh shell has: this checkout's package or library, an
# active virtual environment, another Go.
_DROP = ("PYTHONPATH", "PYTHONHOME", "GRADCOMP_LIB", "GRADCOMP_FAKE_DEVICE", "VIRTUAL_ENV",
         "PIP_REQUIRE_VIRTUALENV", "GO")


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


DDP_PROBE = """
import json, sys
sys.path.insert(0, %r)  # the tests' ranks and workers; gradcomp is the environment's
import ranks, workers
print(json.dumps(ranks.run(workers.ddp_average, 2, "int8", %d, %d, timeout=%d)))
"""


def env_with(path, **extra):
    """os.environ less _DROP, with PATH = path and the extra variables."""
    env = {k: v for k, v in os.environ.items() if k not in _DROP}
    env["PATH"] = path
    env.update(extra)
    return env


def path_with_go():
    """PATH with a Go on it: this one, else this one after GO_BIN (where the
    Makefile finds it); raises SkipTest when there is no Go."""
    path = os.environ.get("PATH", "")
    if shutil.which("go", path=path) is not None:
        return path
    if shutil.which("go", path=GO_BIN) is not None:
        return GO_BIN + os.pathsep + path
    raise unittest.SkipTest("no Go toolchain (on PATH or in %s) to build the library with" % GO_BIN)


def path_without_go():
    """PATH less every directory that holds a ``go`` (and GO_BIN)."""
    dirs = [d for d in os.environ.get("PATH", "").split(os.pathsep)
            if d and d != GO_BIN and shutil.which("go", path=d) is None]
    path = os.pathsep.join(dirs)
    assert shutil.which("go", path=path) is None, path
    return path


def have_cuda_h():
    """Whether the C compiler finds cuda.h: the probe of the Makefile's
    HAVE_CUDA_H and of plugin/python/setup.py, which build
    libgradcomp_cuda.so where it holds."""
    cc = shlex.split(os.environ.get("CC") or "cc")
    try:
        r = subprocess.run(cc + ["-E", "-include", "cuda.h", "-x", "c", os.devnull],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def require_wheel_tools():
    """Raises SkipTest unless this Python's pip and setuptools can build a
    wheel without a package index (bdist_wheel: setuptools >= 70.1, or the
    wheel package; Debian's python3-wheel)."""
    r = subprocess.run([sys.executable, "-c", "import setuptools, pip\n"
                        "try:\n    import setuptools.command.bdist_wheel\nexcept ImportError:\n"
                        "    import wheel.bdist_wheel"], capture_output=True, text=True, timeout=PROBE_TIMEOUT)
    if r.returncode != 0:
        raise unittest.SkipTest("%s cannot build a wheel without a package index (pip, setuptools and "
                                "bdist_wheel): %s" % (sys.executable, r.stderr.strip().splitlines()[-1:]))


def run(cmd, timeout, **kw):
    """subprocess.run, text output captured."""
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)


def output(r):
    return "--- stdout\n%s\n--- stderr\n%s" % (r.stdout[-6000:], r.stderr[-6000:])


def check_codec_probe(test, python, home, env, cwd):
    """Runs PROBE with python in cwd: gradcomp and its library must come
    from under home, the round trip must be right, and torch not loaded."""
    r = run([python, "-c", PROBE], PROBE_TIMEOUT, cwd=cwd, env=env)
    test.assertEqual(r.returncode, 0, output(r))
    pkg, lib, summary = r.stdout.strip().split("\n")
    spec, n, err, torch_loaded = summary.split()
    test.assertTrue(pkg.startswith(home + os.sep), "imported %s, not the gradcomp installed in %s" % (pkg, home))
    test.assertTrue(lib.startswith(home + os.sep), "the installed package loaded %s, not its own copy" % lib)
    test.assertEqual(spec, "int8:round=nearest")
    test.assertGreater(int(n), 0)
    # Nearest rounding: every value within half a step, (max - min)/255/2, of where it was.
    test.assertLessEqual(float(err), (2.0 - -2.0) / 255 / 2 * 1.001)
    test.assertEqual(torch_loaded, "False", "importing gradcomp loaded torch")


class Install(unittest.TestCase):
    def test_readme_install_block(self):
        with open(README, encoding="utf-8") as f:
            block = install_block(f.read())
        python3 = shutil.which("python3")
        if python3 is None:
            raise unittest.SkipTest("no python3 on PATH")
        env = env_with(path_with_go())
        why = index_reachable()
        if why is not None:
            raise unittest.SkipTest("the Python package index is unreachable, and pip's isolated build "
                                    "fetches setuptools from it (%s)" % why)
        with tempfile.TemporaryDirectory(prefix="gradcomp-install-") as tmp:
            src, elsewhere = os.path.join(tmp, "gradcomp"), os.path.join(tmp, "run")
            copy_checkout(src)
            os.mkdir(elsewhere)
            r = run(["bash", "-e", "-c", block], BLOCK_TIMEOUT, cwd=src, env=env)
            self.assertEqual(r.returncode, 0, "README's install block failed (python3 = %s):\n%s\n%s"
                             % (python3, block, output(r)))
            venv = os.path.join(src, "venv")
            python = os.path.join(venv, "bin", "python")
            self.assertTrue(os.path.exists(python), "the block made no virtual environment at ./venv")
            check_codec_probe(self, python, venv, env, elsewhere)


class Wheel(unittest.TestCase):
    """make wheel's wheel, installed where there is no Go, runs DDP."""

    def test_wheel_runs_ddp_without_go(self):
        try:
            import torch
        except ImportError as e:
            raise unittest.SkipTest("no torch in this Python for the DDP step (%s)" % e)
        require_wheel_tools()
        build_path, bare_path = path_with_go(), path_without_go()
        with tempfile.TemporaryDirectory(prefix="gradcomp-wheel-") as tmp:
            src, venv, elsewhere = (os.path.join(tmp, d) for d in ("gradcomp", "venv", "run"))
            copy_checkout(src)
            os.mkdir(elsewhere)
            r = run(["make", "-C", src, "wheel", "WHEEL_PYTHON=" + sys.executable], BUILD_TIMEOUT,
                    env=env_with(build_path))
            self.assertEqual(r.returncode, 0, "make wheel failed:\n" + output(r))
            wheel = self.check_wheel(os.path.join(src, "build", "wheel"))

            bare = env_with(bare_path)
            r = run([sys.executable, "-m", "venv", venv], BUILD_TIMEOUT, env=bare)
            self.assertEqual(r.returncode, 0, "python -m venv failed:\n" + output(r))
            python = os.path.join(venv, "bin", "python")
            # torch (and what it needs) from this Python, without a download.
            site = run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], PROBE_TIMEOUT,
                       env=bare).stdout.strip()
            with open(os.path.join(site, "torch-from-the-tests.pth"), "w") as f:
                f.write(os.path.dirname(os.path.dirname(os.path.abspath(torch.__file__))) + "\n")
            r = run([python, "-m", "pip", "install", "--no-index", "--no-deps", "--disable-pip-version-check",
                     wheel], BUILD_TIMEOUT, cwd=elsewhere, env=bare)
            self.assertEqual(r.returncode, 0, "pip install of the wheel failed:\n" + output(r))

            r = run([python, "-c", DDP_PROBE % (HERE, DDP_STEPS, DDP_WARMUP, PROBE_TIMEOUT)], 2 * PROBE_TIMEOUT,
                    cwd=elsewhere, env=bare)
            self.assertEqual(r.returncode, 0, "DDP on 2 ranks from the installed wheel failed:\n" + output(r))
            results = json.loads(r.stdout.strip().splitlines()[-1])
        for rank, res in enumerate(results):
            with self.subTest(rank=rank):
                self.assertTrue(res["gradcomp"].startswith(venv + os.sep), "imported %s" % res["gradcomp"])
                self.assertEqual(os.path.dirname(res["library"]), os.path.dirname(res["gradcomp"]))
                self.assertEqual(os.path.basename(res["library"]), CPU_LIB)
                self.check_averages(res["steps"])
                self.assertEqual(res["stats"]["compressed"], DDP_STEPS - DDP_WARMUP, res["stats"])
                self.assertTrue(res["buckets"] and all(b["compressed"] for b in res["buckets"]), res["buckets"])

    def check_wheel(self, directory):
        """The one wheel in directory, checked: named and tagged
        py3-none-<this platform>, not pure, holding the CPU library (and the
        CUDA one where cuda.h is) but no fake-device library and no C
        header. Returns its path."""
        wheels = os.listdir(directory)
        platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
        self.assertEqual(len(wheels), 1, wheels)
        self.assertRegex(wheels[0], r"^gradcomp-[0-9.]+-py3-none-%s\.whl$" % re.escape(platform))
        path = os.path.join(directory, wheels[0])
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
            info = next(n for n in names if n.endswith(".dist-info/WHEEL"))
            meta = z.read(info).decode()
        self.assertIn("Root-Is-Purelib: false", meta)
        self.assertIn("Tag: py3-none-%s" % platform, meta)
        libs = sorted(os.path.basename(n) for n in names if n.endswith(".so"))
        self.assertEqual(libs, sorted([CPU_LIB] + ([CUDA_LIB] if have_cuda_h() else [])), names)
        self.assertIn("gradcomp/" + CPU_LIB, names)
        self.assertFalse([n for n in names if n.endswith(".h")], names)
        return path

    def check_averages(self, steps):
        """DDP's gradients against the exact average: the same during warm-up
        (dense), within int8's error after it. Stochastic rounding puts a
        value within one step, (max - min)/255 of its block, of where it
        was; error feedback adds the last step's residual, within one step
        of that step: 3 of the larger range's steps leave a margin."""
        for i, s in enumerate(steps):
            if i < DDP_WARMUP:
                self.assertLessEqual(s["max_err"], 1e-6 * s["range"], "warm-up step %d: %s" % (i, s))
            else:
                bound = 3 * max(s["range"], steps[i - 1]["range"]) / 255
                self.assertLessEqual(s["max_err"], bound, "compressed step %d: %s" % (i, s))


class SourceInstall(unittest.TestCase):
    """pip install ./plugin/python in a copy of the repository: without Go,
    an error that says what to run, or make plugin's libraries where they
    are next to the package; with Go, the package with its library."""

    def setUp(self):
        require_wheel_tools()
        tmp = tempfile.TemporaryDirectory(prefix="gradcomp-source-")
        self.addCleanup(tmp.cleanup)
        self.src, self.target, self.elsewhere = (os.path.join(tmp.name, d) for d in ("gradcomp", "site", "run"))
        copy_checkout(self.src)
        os.mkdir(self.elsewhere)

    def pip_install(self, path):
        return run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-index", "--no-deps",
                    "--disable-pip-version-check", "--target", self.target, "./plugin/python"], BUILD_TIMEOUT,
                   cwd=self.src, env=env_with(path))

    def test_without_go_it_fails_saying_what_to_run(self):
        r = self.pip_install(path_without_go())
        self.assertNotEqual(r.returncode, 0, "pip installed the package without Go:\n" + output(r))
        text = " ".join((r.stdout + r.stderr).split())  # pip indents and may wrap the hook's message
        for want in ("the package needs its C library, libgradcomp.so", "no Go toolchain", "install Go 1.26",
                     "make wheel", "pip install build/wheel/gradcomp-*.whl"):
            self.assertIn(want, text, output(r))
        self.assertFalse(os.path.exists(os.path.join(self.target, "gradcomp")), "a package was installed")

    def test_without_go_it_packages_what_make_plugin_left(self):
        made = os.path.join(ROOT, "plugin", "python", "gradcomp")
        libs = [n for n in (CPU_LIB, CUDA_LIB, FAKE_LIB) if os.path.exists(os.path.join(made, n))]
        if CPU_LIB not in libs:
            raise unittest.SkipTest("no %s in %s (run `make plugin`)" % (CPU_LIB, made))
        for name in libs:
            shutil.copy2(os.path.join(made, name), os.path.join(self.src, "plugin", "python", "gradcomp", name))
        r = self.pip_install(path_without_go())
        self.assertEqual(r.returncode, 0, "pip install ./plugin/python with make plugin's libraries failed:\n"
                         + output(r))
        pkg = os.path.join(self.target, "gradcomp")
        self.assertEqual(sorted(n for n in os.listdir(pkg) if n.endswith(".so")),
                         sorted(n for n in libs if n != FAKE_LIB))
        self.assertTrue(filecmp.cmp(os.path.join(made, CPU_LIB), os.path.join(pkg, CPU_LIB), shallow=False))

    def test_with_go_it_builds_the_library(self):
        r = self.pip_install(path_with_go())
        self.assertEqual(r.returncode, 0, "pip install ./plugin/python with Go failed:\n" + output(r))
        pkg = os.path.join(self.target, "gradcomp")
        self.assertTrue(os.path.exists(os.path.join(pkg, CPU_LIB)), os.listdir(pkg))
        self.assertFalse(os.path.exists(os.path.join(pkg, FAKE_LIB)), os.listdir(pkg))
        check_codec_probe(self, sys.executable, self.target, env_with(path_without_go(), PYTHONPATH=self.target),
                          self.elsewhere)


if __name__ == "__main__":
    unittest.main()
