"""The ctypes binding against libgradcomp.so: round trips, error feedback,
state, the cost model, every error path, and memory over 10,000 calls."""

import array
import os
import random
import subprocess
import sys
import unittest

import gradcomp
from gradcomp import Settle, Status

from libpath import require_library

N = 4096
SPECS = ["none", "fp16", "bf16", "topk:0.01", "topk:0.1:sampled", "randomk:0.05", "int8", "int4", "int2", "sign"]


def setUpModule():
    require_library()


def gaussian(n, seed):
    rng = random.Random(seed)
    return array.array("f", [rng.gauss(0.0, 1.0) for _ in range(n)])


def rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise unittest.SkipTest("no VmRSS in /proc/self/status")


class Library(unittest.TestCase):
    def test_versions(self):
        major, minor = gradcomp.abi_version()
        self.assertEqual(major, gradcomp.ABI_MAJOR)
        self.assertRegex(gradcomp.version(), r"^\d+\.\d+\.\d+")

    def test_missing_library_names_the_path(self):
        code = "import gradcomp; gradcomp.Compressor('int8')"
        env = dict(os.environ, GRADCOMP_LIB="/nonexistent/libgradcomp.so")
        p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("LibraryNotFoundError", p.stderr)
        self.assertIn("/nonexistent/libgradcomp.so (no such file)", p.stderr)

    def test_import_needs_no_torch(self):
        code = "import sys, gradcomp; gradcomp.Compressor('int8'); print('torch' in sys.modules)"
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout.strip(), "False")


class RoundTrip(unittest.TestCase):
    def test_every_codec(self):
        g = gaussian(N, 1)
        for spec in SPECS:
            with self.subTest(spec=spec), gradcomp.Compressor(spec, workers=1) as c:
                dst = bytearray(c.max_encoded_len(N) + 64)
                w = c.compress(g, dst, bucket=5, step=3)
                self.assertGreater(w, 56)
                self.assertLessEqual(w, c.max_encoded_len(N))
                self.assertEqual(gradcomp.payload_len(dst), w)  # padding after the payload is ignored
                out = array.array("f", [0.0]) * N
                c.decompress(bytes(dst[:w]), out)
                err = sum((a - b) ** 2 for a, b in zip(g, out)) / sum(a * a for a in g)
                if spec == "none":
                    self.assertEqual(out, g)
                elif spec in ("fp16", "bf16", "int8"):
                    self.assertLess(err, 1e-3, spec)
                else:
                    self.assertLess(err, 1.0, spec)  # lossy, but never worse than sending zeros
                twice = array.array("f", out)
                c.decompress(bytes(dst[:w]), twice, add=True)
                self.assertEqual(twice, array.array("f", [2 * x for x in out]))

    def test_canonical_spec(self):
        with gradcomp.Compressor("int8") as c:
            self.assertTrue(c.spec.startswith("int8"), c.spec)
        with gradcomp.Compressor("topk:0.01") as c:
            self.assertEqual(c.spec, "topk:0.01")
        # Any spec the engine takes, powersgd (no compressor's) included.
        self.assertEqual(gradcomp.canonical_spec("powersgd:2:warm=on:min_compression=2"), "powersgd:2")
        with gradcomp.Compressor("int4:round=stochastic") as c:
            self.assertEqual(gradcomp.canonical_spec("int4:round=stochastic"), c.spec)
        with self.assertRaisesRegex(ValueError, "rank"):
            gradcomp.canonical_spec("powersgd:0")
        with self.assertRaises(TypeError):
            gradcomp.canonical_spec(8)


class ErrorFeedback(unittest.TestCase):
    def test_sum_of_decoded_tracks_sum_of_gradients(self):
        # e ← e + g; c ← C(e); e ← e − D(c): after T steps Σ D(c) = Σ g − e_T,
        # and e_T is what one more compress of a zero gradient would send.
        with gradcomp.Compressor("topk:0.05", workers=1) as c:
            total = [0.0] * N
            decoded = array.array("f", [0.0]) * N
            dst = bytearray(c.max_encoded_len(N))
            for step in range(6):
                g = gaussian(N, 10 + step)
                total = [t + x for t, x in zip(total, g)]
                w = c.compress(g, dst, bucket=1, step=step, feedback=True, defer=True)
                c.settle(1, Settle.COMMIT)
                c.decompress(bytes(dst[:w]), decoded, add=True)
            with_ef = sum((a - b) ** 2 for a, b in zip(total, decoded))
            plain = array.array("f", [0.0]) * N
            for step in range(6):
                w = c.compress(gaussian(N, 10 + step), dst, bucket=2, step=step)
                c.decompress(bytes(dst[:w]), plain, add=True)
            without = sum((a - b) ** 2 for a, b in zip(total, plain))
            self.assertLess(with_ef, without)

    def test_settle_modes(self):
        g = gaussian(N, 2)
        with gradcomp.Compressor("int4", workers=1) as c:
            dst = bytearray(c.max_encoded_len(N))
            c.compress(g, dst, bucket=0, step=0, feedback=True, defer=True)
            c.settle(0, Settle.COMMIT)
            committed = c.save_state()
            c.compress(g, dst, bucket=0, step=1, feedback=True, defer=True)
            c.settle(0, Settle.DISCARD)  # e unchanged
            self.assertEqual(c.save_state(), committed)
            c.compress(g, dst, bucket=0, step=1, feedback=True, defer=True)
            c.settle(0, Settle.RETAIN)  # e ← e + g: nothing was sent
            retained = c.save_state()
            self.assertNotEqual(retained, committed)
            c.compress(g, dst, bucket=0, step=2, feedback=True, defer=True)
            c.settle(0, Settle.COMMIT)
            self.assertNotEqual(c.save_state(), retained)
            with self.assertRaises(RuntimeError) as cm:
                c.settle(0, Settle.COMMIT)
            self.assertEqual(cm.exception.status, Status.STATE)
            self.assertIn("gc_settle", str(cm.exception))

    def test_state_round_trip_is_exact(self):
        with gradcomp.Compressor("topk:0.01", workers=1) as a, gradcomp.Compressor("topk:0.01", workers=1) as b:
            dst = bytearray(a.max_encoded_len(N))
            for step in range(3):
                a.compress(gaussian(N, step), dst, bucket=7, step=step, feedback=True)
            b.load_state(a.save_state())
            self.assertEqual(b.save_state(), a.save_state())
            pa, pb = bytearray(len(dst)), bytearray(len(dst))
            g = gaussian(N, 99)
            wa = a.compress(g, pa, bucket=7, step=3, feedback=True)
            wb = b.compress(g, pb, bucket=7, step=3, feedback=True)
            self.assertEqual(pa[:wa], pb[:wb])

    def test_corrupt_state_changes_nothing(self):
        with gradcomp.Compressor("int8", workers=1) as c:
            c.compress(gaussian(N, 3), bytearray(c.max_encoded_len(N)), bucket=0, feedback=True)
            saved = c.save_state()
            bad = bytearray(saved)
            bad[len(bad) // 2] ^= 0xFF
            with self.assertRaises(gradcomp.Error) as cm:
                c.load_state(bytes(bad))
            self.assertIn(cm.exception.status, (Status.CORRUPT, Status.INVALID, Status.SIZE))
            self.assertEqual(c.save_state(), saved)


class CostModel(unittest.TestCase):
    def test_decide_follows_the_link(self):
        if not gradcomp._lib.has("gc_decide"):
            self.skipTest("the library does not export gc_decide yet")
        with gradcomp.Compressor("topk:0.01", workers=1) as c:
            slow = c.decide(1 << 20, 4, bandwidth=125e6, latency=50e-6)
            self.assertTrue(slow.compress, slow)
            self.assertGreater(slow.dense_seconds, slow.compressed_seconds)
            fast = c.decide(1 << 20, 4, bandwidth=1e13, latency=1e-7)
            self.assertFalse(fast.compress, fast)
            with self.assertRaises(ValueError):
                c.decide(1 << 20, 4, bandwidth=1e9, strategy="no-such-strategy")


class Errors(unittest.TestCase):
    def test_bad_specs_raise_value_error_with_the_library_message(self):
        for spec, words in [("nope", "unknown codec"), ("topk:2", "topk:2"), ("", ""), ("int8 ", "byte 4 is 0x20"),
                            ("topk:0x1p-3", "not a plain decimal"), ("topk:1e-2", "not a plain decimal")]:
            with self.subTest(spec=spec):
                with self.assertRaises(ValueError) as cm:
                    gradcomp.Compressor(spec)
                self.assertIsInstance(cm.exception, gradcomp.InvalidArgumentError)
                self.assertEqual(cm.exception.status, Status.SPEC)
                self.assertIn(words, str(cm.exception))
                self.assertIn("[GC_ERR_SPEC]", str(cm.exception))

    def test_nul_in_a_spec_is_refused_before_c_sees_it(self):
        # C would read "int8\0garbage" as "int8".
        with self.assertRaises(ValueError) as cm:
            gradcomp.Compressor("int8\0garbage")
        self.assertNotIsInstance(cm.exception, gradcomp.InvalidArgumentError)
        self.assertIn("NUL character at index 4", str(cm.exception))

    def test_small_destination(self):
        with gradcomp.Compressor("int8", workers=1) as c:
            with self.assertRaises(ValueError) as cm:
                c.compress(gaussian(N, 4), bytearray(100))
            self.assertEqual(cm.exception.status, Status.SIZE)

    def test_wrong_length_or_codec_payload(self):
        g = gaussian(N, 5)
        with gradcomp.Compressor("int8", workers=1) as c, gradcomp.Compressor("sign", workers=1) as other:
            dst = bytearray(c.max_encoded_len(N))
            w = c.compress(g, dst)
            with self.assertRaises(gradcomp.Error):
                c.decompress(bytes(dst[:w]), array.array("f", [0.0]) * (N - 1))
            with self.assertRaises(RuntimeError) as cm:
                other.decompress(bytes(dst[:w]), array.array("f", [0.0]) * N)
            self.assertEqual(cm.exception.status, Status.MISMATCH)
            corrupt = bytearray(dst[:w])
            corrupt[w - 10] ^= 0x55
            with self.assertRaises(RuntimeError) as cm:
                c.decompress(bytes(corrupt), array.array("f", [0.0]) * N)
            self.assertEqual(cm.exception.status, Status.CORRUPT)
            with self.assertRaises(gradcomp.Error):
                gradcomp.payload_len(bytes(20))

    def test_nonfinite_leaves_memory_untouched(self):
        with gradcomp.Compressor("topk:0.1", workers=1) as c:
            dst = bytearray(c.max_encoded_len(N))
            c.compress(gaussian(N, 6), dst, bucket=3, feedback=True)
            before = c.save_state()
            g = gaussian(N, 7)
            g[100] = float("nan")
            with self.assertRaises(gradcomp.NonFiniteError) as cm:
                c.compress(g, dst, bucket=3, feedback=True, defer=True)
            self.assertIn("100", str(cm.exception))
            self.assertEqual(c.save_state(), before)
            with self.assertRaises(RuntimeError):  # nothing is pending after a failed compress
                c.settle(3, Settle.COMMIT)

    def test_closed_and_destroyed_handles(self):
        c = gradcomp.Compressor("int8")
        h = c.handle
        c.close()
        c.close()  # idempotent
        with self.assertRaises(ValueError):
            c.max_encoded_len(10)
        with self.assertRaises(RuntimeError) as cm:
            gradcomp._lib.call("gc_compressor_destroy", h)
        self.assertEqual(cm.exception.status, Status.HANDLE)

    def test_python_side_checks(self):
        with gradcomp.Compressor("int8") as c:
            with self.assertRaises(TypeError):
                c.compress(array.array("d", [1.0] * 8), bytearray(1024))
            with self.assertRaises(ValueError):
                c.compress(gaussian(8, 1), bytes(1024))  # read-only destination
            with self.assertRaises(ValueError):
                c.compress(gaussian(8, 1), bytearray(1024), defer=True)
        with self.assertRaises(TypeError):
            gradcomp.Compressor(b"int8")


class Names(unittest.TestCase):
    def test_names_are_the_librarys(self):
        # gradcomp.names reads each list from the library (gc_name, i = 0,
        # 1, ... until NULL): the one list of strategies, decisions,
        # origins, cautions and guard states, in value order.
        lib = gradcomp._lib.lib()
        for which in gradcomp.Names:
            want = []
            while lib.gc_name(int(which), len(want)) is not None:
                want.append(lib.gc_name(int(which), len(want)).decode())
            self.assertEqual(gradcomp.names(which), tuple(want), which)
            self.assertEqual(len(set(want)), len(want), which)
        strategies = gradcomp.names(gradcomp.Names.STRATEGY)
        self.assertEqual(strategies[0], "auto")
        for name in ("low-rank", "hier", "sra"):
            self.assertIn(name, strategies)
        self.assertEqual(gradcomp.names(gradcomp.Names.DECISION), ("auto", "compressed", "dense"))
        self.assertEqual(gradcomp.names(gradcomp.Names.GUARD)[0], "off")
        self.assertEqual(gradcomp.names(gradcomp.Names.CAUTION)[0], "none")
        self.assertIsNone(lib.gc_name(len(gradcomp.Names), 0))
        self.assertIsNone(lib.gc_name(int(gradcomp.Names.STRATEGY), -1))

    def test_the_package_keeps_no_list_of_its_own(self):
        # Nothing but the library's list names a strategy or decision in
        # the package's code (docstrings aside), and nothing reads the
        # engine's prose reason for what the verdicts carry.
        import re
        here = os.path.dirname(gradcomp.__file__)
        for name in sorted(os.listdir(here)):
            if not name.endswith(".py"):
                continue
            with open(os.path.join(here, name)) as f:
                src = f.read()
            with self.subTest(module=name):
                self.assertNotRegex(src, r"\(\s*\"auto\",\s*\"(dense|compressed)\"")
                self.assertNotRegex(src, r"reason\s*\[|reason\.index\(|reason\.find\(|in b\.reason")


class Memory(unittest.TestCase):
    CALLS = 10000

    def test_rss_flat_over_10000_calls(self):
        g = gaussian(N, 8)
        out = array.array("f", [0.0]) * N
        live = gradcomp.live_handles()
        with gradcomp.Compressor("topk:0.01", workers=1) as c:
            dst = bytearray(c.max_encoded_len(N))

            def calls(k):
                for i in range(k):
                    w = c.compress(g, dst, bucket=i % 4, step=i, feedback=True, defer=True)
                    c.settle(i % 4, Settle.COMMIT)
                    c.decompress(memoryview(dst)[:w], out, add=True)

            calls(self.CALLS)  # warm: every residual exists, the Go heap has reached its working size
            before = rss_kib()
            calls(self.CALLS)
            after = rss_kib()
        with gradcomp.Compressor("int8") as d:
            pass
        self.assertEqual(gradcomp.live_handles(), live)
        sys.stderr.write("\n[memory] RSS %d KiB before, %d KiB after %d rounds of compress+settle+decompress_add (%+d KiB)\n"
                         % (before, after, self.CALLS, after - before))
        self.assertLess(after - before, 2048)


if __name__ == "__main__":
    unittest.main()
