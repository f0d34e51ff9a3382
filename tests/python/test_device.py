"""The device calls of the binding (ABI 1.2): in the CPU library they refuse
with DeviceError (GC_ERR_NOCUDA); libgradcomp_cuda.so loads with ctypes'
RTLD_NOW and reports a missing GPU as DeviceError (GC_ERR_NODEVICE); which
library is chosen; and, with torch on a GPU, CUDA tensors compressed through
it give the host path's payloads. Tests that need a GPU skip, saying so."""

import array
import os
import subprocess
import sys
import textwrap
import unittest

import gradcomp
from gradcomp import Status, _lib

from libpath import require_library

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CUDA_LIB = os.path.join(ROOT, "build", _lib.CUDA_LIB_NAME)


def setUpModule():
    require_library()


def torch_cuda():
    """torch, when it sees a GPU; else SkipTest with the reason."""
    try:
        import torch
    except ImportError as e:
        raise unittest.SkipTest("torch not importable: %s" % e)
    if not torch.cuda.is_available():
        raise unittest.SkipTest("torch %s sees no CUDA device (no GPU here)" % torch.__version__)
    return torch


class CPULibrary(unittest.TestCase):
    """What the loaded library does with device calls when it is the CPU one."""

    def setUp(self):
        if gradcomp.has_cuda():
            self.skipTest("the loaded library is %s, the CUDA build" % _lib.path())

    def test_device_calls_refused(self):
        with gradcomp.Compressor("int8") as c:
            fake = 0x7F0000000000
            with self.assertRaises(gradcomp.DeviceError) as cm:
                c.compress_device(fake, 1000, fake, 4096, 0)
            self.assertEqual(cm.exception.status, Status.NOCUDA)
            self.assertIn("libgradcomp_cuda.so", str(cm.exception))
            with self.assertRaises(gradcomp.DeviceError):
                c.decompress_slots_device(fake, 1104, 2, fake, 1000, 0, add=True)
            with self.assertRaises(gradcomp.InvalidArgumentError) as cm:
                c.compress_device(0, 1000, fake, 4096, 0)
            self.assertIn("null grad", str(cm.exception))
            with self.assertRaises(ValueError):
                c.compress_device(fake, 1000, fake, 4096, 0, defer=True)
        with self.assertRaises(gradcomp.DeviceError) as cm:
            gradcomp.device_info(0)
        self.assertEqual(cm.exception.status, Status.NOCUDA)


class Choice(unittest.TestCase):
    """candidates(): the CUDA library first only when torch sees a GPU."""

    def test_candidates(self):
        saved_env = os.environ.pop(_lib.ENV_LIB, None)
        saved_torch = sys.modules.get("torch")
        try:
            sys.modules.pop("torch", None)
            self.assertEqual([os.path.basename(p) for p in _lib.candidates()], [_lib.CPU_LIB_NAME])

            class Cuda:
                available = False

                @classmethod
                def is_available(cls):
                    return cls.available

            sys.modules["torch"] = type("FakeTorch", (), {"cuda": Cuda})
            self.assertEqual([os.path.basename(p) for p in _lib.candidates()], [_lib.CPU_LIB_NAME])
            Cuda.available = True
            self.assertEqual([os.path.basename(p) for p in _lib.candidates()], [_lib.CUDA_LIB_NAME, _lib.CPU_LIB_NAME])
            os.environ[_lib.ENV_LIB] = "/x/libgradcomp_other.so"
            self.assertEqual(_lib.candidates(), ["/x/libgradcomp_other.so"])
        finally:
            os.environ.pop(_lib.ENV_LIB, None)
            if saved_env is not None:
                os.environ[_lib.ENV_LIB] = saved_env
            sys.modules.pop("torch", None)
            if saved_torch is not None:
                sys.modules["torch"] = saved_torch


class CUDALibrary(unittest.TestCase):
    """libgradcomp_cuda.so in a process of its own (one Go runtime each)."""

    def run_with_cuda_lib(self, code):
        if not os.path.exists(CUDA_LIB):
            self.skipTest("%s not built (make plugin builds it where cuda.h is)" % CUDA_LIB)
        env = dict(os.environ, GRADCOMP_LIB=CUDA_LIB, PYTHONPATH=os.pathsep.join(sys.path))
        return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True,
                              text=True, timeout=120)

    def test_loads_and_reports_the_device(self):
        r = self.run_with_cuda_lib("""
            import ctypes, gradcomp
            from gradcomp import _lib
            lib = _lib.lib()  # ctypes.CDLL: RTLD_NOW, every symbol resolved now
            print("features", gradcomp.has_cuda(), "abi", gradcomp.abi_version())
            try:
                print("device", tuple(gradcomp.device_info(0)))
            except gradcomp.DeviceError as e:
                print("nodevice", e.status.name, e)
            with gradcomp.Compressor("int8") as c:
                try:
                    c.compress_device(0x7F0000000000, 1000, 0x7F0000000000, 4096, 0)
                except gradcomp.Error as e:
                    print("compress", e.status.name)
        """)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("features True abi (%d, %d)" % (_lib.ABI_MAJOR, _lib.ABI_MINOR), r.stdout)
        if "nodevice" in r.stdout:
            self.assertIn("nodevice NODEVICE", r.stdout)
            self.assertIn("compress NODEVICE", r.stdout)
            print("\n  libgradcomp_cuda.so without a GPU: " + r.stdout.strip().splitlines()[1], file=sys.stderr)
        else:  # a GPU: a made-up address is not device memory
            self.assertIn("compress INVALID", r.stdout)


class DeviceTensors(unittest.TestCase):
    """With torch on a GPU: CUDA tensors through the CUDA library."""

    def test_payloads_match_host(self):
        torch = torch_cuda()
        if not gradcomp.has_cuda():
            self.skipTest("torch sees a GPU, but the loaded library is %s (not the CUDA build)" % _lib.path())
        n = 10007
        g = torch.randn(n, generator=torch.Generator().manual_seed(1))
        for spec in ("int8", "int4", "sign", "topk:0.01"):
            with gradcomp.Compressor(spec) as host, gradcomp.Compressor(spec) as dev:
                cap = host.max_encoded_len(n)
                hp = bytearray(cap)
                m = host.compress(array.array("f", g.tolist()), hp, bucket=1, feedback=True)
                gd, dd = g.cuda(), torch.empty(cap, dtype=torch.uint8, device="cuda")
                stream = torch.cuda.current_stream().cuda_stream
                md = dev.compress_device(gd.data_ptr(), n, dd.data_ptr(), cap, stream, bucket=1, feedback=True)
                self.assertEqual(md, m)
                self.assertEqual(bytes(dd.cpu().numpy().tobytes()[:md]), bytes(hp[:m]), spec)
                self.assertEqual(dev.save_state(), host.save_state(), spec)
                out = torch.zeros(n, device="cuda")
                dev.decompress_device(dd.data_ptr(), md, out.data_ptr(), n, stream)
                want = array.array("f", bytes(4 * n))
                host.decompress(hp[:m], want)
                self.assertEqual(out.cpu().numpy().tobytes(), want.tobytes(), spec)


if __name__ == "__main__":
    unittest.main()
