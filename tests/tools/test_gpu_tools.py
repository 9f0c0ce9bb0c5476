"""tools/bench/gpu_paths.sh and tools/bench/marlin_bundle.sh without a GPU: gpu_paths.sh over a build folder of fake
suites (shell scripts printing gtest's summary and their environment), marlin_bundle.sh's refusals of a bad WHEEL.
Standard library only."""
import os
import stat
import subprocess
import tempfile
import unittest
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GPU_PATHS = os.path.join(ROOT, "tools", "bench", "gpu_paths.sh")
MARLIN_BUNDLE = os.path.join(ROOT, "tools", "bench", "marlin_bundle.sh")
SUITES = ["test_kernels", "test_model", "test_train", "test_core", "test_data"]


def fake_build(folder, failing=()):
    for name in SUITES:
        path = os.path.join(folder, name)
        with open(path, "w") as f:
            f.write("#!/bin/sh\n")
            f.write('echo "emulate=$AERIE_CUDA_EMULATE scratch=$AERIE_TEST_SCRATCH noskip=$AERIE_NO_SKIP args=$*"\n')
            f.write('echo "kernels=$AERIE_ATTENTION_FORWARD_KERNEL/$AERIE_ATTENTION_BACKWARD_KERNEL"\n')
            f.write('echo "grouped=$AERIE_GROUPED_GEMM_KERNEL bm=$AERIE_GROUPED_GEMM_BM"\n')
            if name in failing:
                f.write('echo "[  FAILED  ] 1 test, listed below:"\necho "[  FAILED  ] Fake.Fails"\nexit 1\n')
            else:
                f.write('echo "[  PASSED  ] 3 tests."\n')
        os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)


class GpuPaths(unittest.TestCase):
    def run_paths(self, build, out, together, cwd=None, paths="native sm_120"):
        # a kernel choice in the caller's environment reaches no setting that does not name one
        env = dict(os.environ, TOGETHER=together, PATHS=paths, AERIE_ATTENTION_FORWARD_KERNEL="inherited")
        return subprocess.run(["bash", GPU_PATHS, build, out], env=env, cwd=cwd, capture_output=True, text=True,
                              timeout=60)

    def test_every_setting_has_its_own_scratch(self):
        with tempfile.TemporaryDirectory() as tmp:
            build = os.path.join(tmp, "build")
            os.makedirs(build)
            fake_build(build)
            for together in ["0", "1", "2"]:
                # a relative OUT_DIR: the suites run inside BUILD_DIR, their scratch must still be OUT_DIR's
                r = self.run_paths(build, "out" + together, together, cwd=tmp)
                self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
                out = os.path.join(tmp, "out" + together)
                summary = open(os.path.join(out, "summary.txt")).read()
                self.assertEqual(summary.count("rc=0 passed/failed=3"), 2 * len(SUITES), summary)
                for setting, emulate in [("native", ""), ("sm_120", "sm_120")]:
                    text = open(os.path.join(out, setting, "test_core.txt")).read()
                    self.assertIn(f"emulate={emulate} scratch={out}/{setting}/scratch noskip=1", text)
                    self.assertIn("args=--gtest_filter=DeviceSync.*:GpuLimitsCuda.*", text)
                    self.assertIn("kernels=/", text)

    def test_a_kernel_setting_sets_both_attention_kernels(self):
        with tempfile.TemporaryDirectory() as tmp:
            fake_build(tmp)
            out = os.path.join(tmp, "out")
            r = self.run_paths(tmp, out, "2", paths="native+mma sm_120+mma64")
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            text = open(os.path.join(out, "sm_120-mma64", "test_kernels.txt")).read()  # no "+" in the folder
            self.assertIn(f"emulate=sm_120 scratch={out}/sm_120-mma64/scratch", text)
            self.assertIn("kernels=mma64/mma64", text)
            text = open(os.path.join(out, "native-mma", "test_kernels.txt")).read()
            self.assertIn("emulate= ", text)
            self.assertIn("kernels=mma/mma", text)
            self.assertIn("sm_120+mma64 test_kernels rc=0", open(os.path.join(out, "summary.txt")).read())

    def test_name_value_parts_set_the_environment(self):
        with tempfile.TemporaryDirectory() as tmp:
            fake_build(tmp)
            out = os.path.join(tmp, "out")
            r = self.run_paths(tmp, out, "2", paths="sm_120+AERIE_GROUPED_GEMM_KERNEL=rsm+AERIE_GROUPED_GEMM_BM=64 "
                               "native+mma64+AERIE_GROUPED_GEMM_KERNEL=rs")
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            text = open(os.path.join(out, "sm_120-AERIE_GROUPED_GEMM_KERNEL-rsm-AERIE_GROUPED_GEMM_BM-64",
                                     "test_kernels.txt")).read()
            self.assertIn("emulate=sm_120 ", text)
            self.assertIn("grouped=rsm bm=64", text)
            self.assertIn("kernels=/", text)  # no attention kernel named, none inherited
            text = open(os.path.join(out, "native-mma64-AERIE_GROUPED_GEMM_KERNEL-rs", "test_kernels.txt")).read()
            self.assertIn("kernels=mma64/mma64", text)
            self.assertIn("grouped=rs bm=", text)
            r = self.run_paths(tmp, out, "2", paths="sm_120+gemm=rsm")
            self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
            self.assertIn("'gemm=rsm' is not NAME=VALUE", r.stderr)

    def test_a_failing_suite_fails_the_run_and_is_named(self):
        with tempfile.TemporaryDirectory() as tmp:
            fake_build(tmp, failing=("test_train",))
            r = self.run_paths(tmp, os.path.join(tmp, "out"), "2")
            self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
            self.assertIn("native test_train: [  FAILED  ] Fake.Fails", r.stdout)
            self.assertIn("sm_120 test_train: [  FAILED  ] Fake.Fails", r.stdout)

    def test_a_bad_together_is_refused(self):
        with tempfile.TemporaryDirectory() as tmp:
            fake_build(tmp)
            r = self.run_paths(tmp, os.path.join(tmp, "out"), "yes")
            self.assertEqual(r.returncode, 2)
            self.assertIn("TOGETHER must be 0, 1 or 2, got 'yes'", r.stderr)


class MarlinBundle(unittest.TestCase):
    def bundle(self, wheel, out):
        return subprocess.run(["bash", MARLIN_BUNDLE, out], env=dict(os.environ, WHEEL=wheel), capture_output=True,
                              text=True, timeout=60)

    def test_a_missing_wheel_is_named(self):
        with tempfile.TemporaryDirectory() as tmp:
            r = self.bundle(os.path.join(tmp, "nope.whl"), os.path.join(tmp, "out"))
            self.assertEqual(r.returncode, 2)
            self.assertIn("nope.whl: no such file", r.stderr)
            self.assertFalse(os.path.exists(os.path.join(tmp, "out")))

    def test_not_a_wheel_and_another_wheel_are_refused(self):
        with tempfile.TemporaryDirectory() as tmp:
            text = os.path.join(tmp, "vllm-0.26.0-x.whl")
            open(text, "w").write("not a zip")
            r = self.bundle(text, os.path.join(tmp, "out"))
            self.assertEqual(r.returncode, 2)
            self.assertIn("is not a wheel (zip)", r.stderr)
            other = os.path.join(tmp, "vllm-0.26.0-y.whl")
            with zipfile.ZipFile(other, "w") as z:
                z.writestr("vllm/scalar_type.py", "")
            r = self.bundle(other, os.path.join(tmp, "out2"))
            self.assertEqual(r.returncode, 2)
            self.assertIn("is not vllm 0.26.0's wheel (missing: vllm/_moe_C_stable_libtorch.abi3.so)", r.stderr)


if __name__ == "__main__":
    unittest.main()
