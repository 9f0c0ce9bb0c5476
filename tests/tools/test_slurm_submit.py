"""slurm/submit refuses a bad count or switch by its key before anything is submitted (no Slurm needed: the checks
come before sbatch). Standard library only."""
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SUBMIT = os.path.join(ROOT, "slurm", "submit")


class Refusals(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        d = self.tmp.name
        self.cfg = os.path.join(d, "run.ini")
        open(os.path.join(d, "input.txt"), "w").write("hello\n")
        os.mkdir(os.path.join(d, "model"))
        with open(self.cfg, "w") as f:
            f.write(f"output = {d}/out\nmodel = {d}/model\ninput = {d}/input.txt\naerie = /bin/true\n")

    def tearDown(self):
        self.tmp.cleanup()

    def submit(self, *kv):
        # A fake sbatch first on PATH (exit 99): nothing reaches a real Slurm, and a run that passed every check shows.
        bindir = os.path.join(self.tmp.name, "bin")
        os.makedirs(bindir, exist_ok=True)
        with open(os.path.join(bindir, "sbatch"), "w") as f:
            f.write("#!/bin/sh\necho fake sbatch >&2\nexit 99\n")
        os.chmod(os.path.join(bindir, "sbatch"), 0o755)
        env = dict(os.environ, PATH=bindir + ":/usr/bin:/bin")
        return subprocess.run(["bash", SUBMIT, self.cfg, *kv], capture_output=True, text=True, env=env)

    def test_bad_counts_are_named(self):
        for kv, msg in [("cpus-per-task=0", "cpus-per-task=0 is not a whole number from 1 to 999999"),
                        ("cpus-per-task=four", "cpus-per-task=four is not a whole number from 1"),
                        ("gpus-per-node=-1", "gpus-per-node=-1 is not a whole number from 0"),
                        ("gpus-per-node=", "gpus-per-node= is not a whole number from 0"),  # replaces the default
                        ("tp=0", "tp=0 is not a whole number from 1"),
                        ("tp=", "tp= is not a whole number from 1"),
                        ("nodes=1.5", "nodes=1.5 is not a whole number from 1"),
                        ("nodes=99999999999999999999", "nodes=99999999999999999999 is not a whole number from 1"),
                        ("tasks-per-node=", None),  # empty: the default, not an error here
                        ("signal-secs=5m", "signal-secs=5m is not a whole number from 0"),
                        ("target-ranks=0", "target-ranks=0 is not a whole number from 1"),
                        ("stream=yes", "stream=yes is not 0 or 1")]:
            r = self.submit(kv)
            self.assertNotEqual(r.returncode, 0, kv)
            if msg is None:
                self.assertNotIn("is not a whole number", r.stderr, kv)
                self.assertIn("fake sbatch", r.stderr, kv)  # every check passed: submitted (to the fake)
            else:
                self.assertIn("slurm/submit: " + msg, r.stderr, kv)
                self.assertEqual(r.returncode, 2, kv)
                self.assertFalse(os.path.exists(os.path.join(self.tmp.name, "out", "slurm", "jobs.txt")), kv)

    def test_leading_zeros_are_decimal(self):
        r = self.submit("cpus-per-task=08", "tp=3", "tasks-per-node=2")  # 08 is 8, not an octal error
        self.assertIn("slurm/submit: tp=3 must divide tasks-per-node=2", r.stderr)


if __name__ == "__main__":
    unittest.main()
