"""tools/bench/sglang_bundle.sh writes a sitecustomize.py into the SGLang tree it packs. Its two jobs, checked here
without SGLang or transformers (stubs in a temporary folder stand in for them): a config registered twice under one
model_type replaces the first instead of raising (SGLang 0.5.17 under transformers 5.17: "'qwen3_asr' is already
used by a Transformers config"), and the _fallback folder goes last on sys.path. Standard library only."""
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tools", "bench", "sglang_bundle.sh")

# transformers' registry as 5.17 has it (configuration_auto.py: _LazyConfigMapping.register raises on a used key).
STUB = textwrap.dedent('''
    class _LazyConfigMapping(dict):
        def register(self, key, value, exist_ok=False):
            if key in self and not exist_ok:
                raise ValueError(f"'{key}' is already used by a Transformers config, pick another name.")
            self[key] = value

    CONFIG_MAPPING = _LazyConfigMapping(qwen3_asr="transformers' own")
''')


def sitecustomize_text():
    """The heredoc that sglang_bundle.sh writes as site/sitecustomize.py."""
    with open(SCRIPT, encoding="utf-8") as f:
        text = f.read()
    m = re.search(r"cat > sitecustomize.py <<'EOF'\n(.*?)\nEOF\n", text, re.S)
    assert m, "sglang_bundle.sh writes no sitecustomize.py heredoc"
    return m.group(1)


class BundleSitecustomize(unittest.TestCase):
    def run_site(self, with_transformers):
        with tempfile.TemporaryDirectory() as site:
            with open(os.path.join(site, "sitecustomize.py"), "w", encoding="utf-8") as f:
                f.write(sitecustomize_text())
            os.makedirs(os.path.join(site, "_fallback"))
            if with_transformers:
                auto = os.path.join(site, "stubs", "transformers", "models", "auto")
                os.makedirs(auto)
                for d in ("transformers", "transformers/models", "transformers/models/auto"):
                    open(os.path.join(site, "stubs", d, "__init__.py"), "w").close()
                with open(os.path.join(auto, "configuration_auto.py"), "w", encoding="utf-8") as f:
                    f.write(STUB)
            probe = textwrap.dedent('''
                import sys
                print(sys.path[-1].endswith("_fallback"))
                try:
                    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
                except ImportError:
                    print("no transformers")
                else:
                    CONFIG_MAPPING.register("qwen3_asr", "SGLang's")
                    print(CONFIG_MAPPING["qwen3_asr"])
            ''')
            path = [site] + ([os.path.join(site, "stubs")] if with_transformers else [])
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
            return subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=60)

    def test_a_second_registration_replaces_the_first(self):
        r = self.run_site(with_transformers=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.split(), ["True", "SGLang's"])

    def test_without_transformers_nothing_fails(self):
        r = self.run_site(with_transformers=False)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.split(), ["True", "no", "transformers"])


if __name__ == "__main__":
    unittest.main()
