"""Builds the gradcomp package with its C library (setuptools' build hook).

``pip install ./plugin/python`` and ``make wheel`` (``pip wheel``) run this
file; the metadata is in pyproject.toml. The package is Python over
libgradcomp.so (ctypes), so build_py puts the library into the built
package, by the first rule that applies:

1. Go is there (``$GO``, else ``go`` on PATH: Go 1.26 with cgo and a C
   compiler): ``go build -trimpath -buildmode=c-shared ./plugin`` in the
   repository root (the nearest directory above this file whose go.mod is
   gradcomp's) builds libgradcomp.so and, where the C compiler finds
   cuda.h (as ``make plugin`` decides), libgradcomp_cuda.so with
   ``-tags cuda``. Never the fake-device test library.
2. No Go, but ``make plugin`` has copied the libraries next to the package:
   those are packaged as they are.
3. Otherwise the build stops with an error that says what to run: never a
   package without its library.

The libraries are loaded by ctypes, not imported by CPython, so the wheel
is tagged ``py3-none-<platform>`` (e.g. linux_x86_64): any Python 3, this
platform only.
"""

import logging
import os
import shlex
import shutil
import subprocess
import tempfile

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py
from setuptools.errors import ExecError, PlatformError

try:
    from setuptools.command.bdist_wheel import bdist_wheel  # setuptools >= 70.1
except ImportError:
    from wheel.bdist_wheel import bdist_wheel  # older setuptools: the wheel package's

PACKAGE = "gradcomp"
#: The module path in gradcomp's go.mod, which marks the repository root.
MODULE = "github.com/gradcomp/gradcomp"
#: The libraries, named as gradcomp._lib loads them.
CPU_LIB = "libgradcomp.so"
CUDA_LIB = "libgradcomp_cuda.so"
#: Seconds one go build may take (a cold build cache on a slow machine).
GO_BUILD_TIMEOUT = 1800

HERE = os.path.dirname(os.path.abspath(__file__))
log = logging.getLogger("gradcomp.setup")

WHAT_TO_RUN = (
    "Either install Go 1.26 (https://go.dev/dl/) with cgo and a C compiler, put it on PATH (or name it in "
    "$GO) and install again from the repository; or, on a machine with Go, run `make wheel` in the "
    "repository and `pip install build/wheel/gradcomp-*.whl` here."
)


def repository_root():
    """The nearest directory above this file whose go.mod declares gradcomp's
    module, or None (an sdist, or a copy of plugin/python alone)."""
    d = HERE
    while True:
        try:
            with open(os.path.join(d, "go.mod"), encoding="utf-8") as f:
                if any(line.split() == ["module", MODULE] for line in f):
                    return d
        except OSError:
            pass
        parent = os.path.dirname(d)
        if parent == d:
            return None
        d = parent


def go_command():
    """The Go toolchain to build with: $GO (a name or a path), else ``go``
    on PATH; None when there is none."""
    return shutil.which(os.environ.get("GO") or "go")


def have_cuda_h():
    """Whether the C compiler ($CC, else cc) finds cuda.h: the Makefile's
    HAVE_CUDA_H probe, which decides whether libgradcomp_cuda.so is built."""
    cc = shlex.split(os.environ.get("CC") or "cc")
    try:
        r = subprocess.run(cc + ["-E", "-include", "cuda.h", "-x", "c", os.devnull],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def go_build(go, root, tags, dst):
    """Builds ./plugin in root as a C shared library at dst (go build
    -trimpath -buildmode=c-shared, with tags); raises ExecError with go's
    output when it fails."""
    cmd = [go, "build", "-trimpath", "-buildmode=c-shared"] + (["-tags", tags] if tags else [])
    with tempfile.TemporaryDirectory(prefix="gradcomp-lib-") as tmp:
        out = os.path.join(tmp, os.path.basename(dst))  # go writes a C header beside it
        cmd += ["-o", out, "./plugin"]
        log.info("gradcomp: %s (in %s)", " ".join(cmd), root)
        try:
            r = subprocess.run(cmd, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               timeout=GO_BUILD_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise ExecError("gradcomp: `%s` in %s took over %d s" % (" ".join(cmd), root, GO_BUILD_TIMEOUT))
        if r.returncode != 0:
            raise ExecError("gradcomp: `%s` in %s failed (exit %d); building the library needs Go 1.26 with cgo "
                            "(CGO_ENABLED=1) and a C compiler:\n%s" % (" ".join(cmd), root, r.returncode, r.stdout))
        shutil.copy2(out, dst)


class build_py_with_library(build_py):
    """build_py, then the C libraries into the built package (the module
    doc's rules)."""

    def run(self):
        super().run()
        pkg = os.path.join(os.path.abspath(self.build_lib), PACKAGE)
        self.mkpath(pkg)
        for name in (CPU_LIB, CUDA_LIB):  # a previous build's, which this one may not make
            if os.path.exists(os.path.join(pkg, name)):
                os.remove(os.path.join(pkg, name))
        root, go = repository_root(), go_command()
        if root is not None and go is not None:
            go_build(go, root, "", os.path.join(pkg, CPU_LIB))
            if have_cuda_h():
                go_build(go, root, "cuda", os.path.join(pkg, CUDA_LIB))
            else:
                log.warning("gradcomp: cuda.h not found: %s not built (the CPU library only)", CUDA_LIB)
            return
        src = os.path.join(HERE, PACKAGE)
        if os.path.exists(os.path.join(src, CPU_LIB)):
            for name in (CPU_LIB, CUDA_LIB):
                if os.path.exists(os.path.join(src, name)):
                    log.warning("gradcomp: no Go: packaging %s as `make plugin` left it", os.path.join(src, name))
                    shutil.copy2(os.path.join(src, name), os.path.join(pkg, name))
            return
        if root is None:
            why = ("no go.mod of %s above %s: this is not the gradcomp repository (an sdist, or a copy of "
                   "plugin/python alone), and no library built by `make plugin` is in %s" % (MODULE, HERE, src))
        else:
            why = ("no Go toolchain ($GO unset or not found, no `go` on PATH) to build it from %s, and no "
                   "library built by `make plugin` in %s" % (root, src))
        raise PlatformError("gradcomp: the package needs its C library, %s, and cannot have it: %s. %s"
                            % (CPU_LIB, why, WHAT_TO_RUN))


class PlatformDistribution(Distribution):
    """A distribution that holds a platform's code: installed into platlib,
    its wheel not pure (Root-Is-Purelib: false), though it has no extension
    module for setuptools to build."""

    def has_ext_modules(self):
        return True


class bdist_wheel_platform(bdist_wheel):
    """bdist_wheel for a package that holds a platform's shared libraries but
    no CPython extension: tagged py3-none-<platform>."""

    def get_tag(self):
        _, _, platform = super().get_tag()
        return "py3", "none", platform


setup(distclass=PlatformDistribution,
      cmdclass={"build_py": build_py_with_library, "bdist_wheel": bdist_wheel_platform})
