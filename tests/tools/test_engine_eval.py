"""Tests of tools/engine_eval: the pure parts, and the whole script through its fake engine (no GPU, no vLLM).

Run from the checkout's root: python3 -m unittest tests/tools/test_engine_eval.py -v
"""
import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import unittest
from types import SimpleNamespace

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tools", "engine_eval")


def load_tool():
    loader = importlib.machinery.SourceFileLoader("engine_eval", SCRIPT)
    spec = importlib.util.spec_from_loader("engine_eval", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


ee = load_tool()


def record(index, prompt_ids, category=None, stop_ids=(99999,), greedy_ids=(1, 2, 3)):
    return {"index": index, "category": category, "prompt_ids": list(prompt_ids), "stop_ids": list(stop_ids),
            "greedy_ids": list(greedy_ids)}


def fake_answer(prompt_ids, stop_ids, n):
    """The fake engine's plain output (its docstring's rule)."""
    out, t = [], prompt_ids[-1]
    while len(out) < n and not (out and out[-1] in stop_ids):
        t = (31 * t + 7) % 50000
        out.append(t)
    return out


class TempDir(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.dir = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()

    def write(self, name, text):
        path = os.path.join(self.dir, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return path

    def write_jsonl(self, name, rows):
        return self.write(name, "".join(json.dumps(r) + "\n" for r in rows))


class ReadPromptIds(TempDir):
    def test_reads_records_skips_blank_lines_and_cuts(self):
        path = self.write_jsonl("p.jsonl", [record(0, [1, 2], "coding"), record(5, [3], None)])
        with open(path, "a") as f:
            f.write("\n" + json.dumps(record(7, [4], 12)) + "\n")
        rs = ee.read_prompt_ids(path)
        self.assertEqual([r["index"] for r in rs], [0, 5, 7])
        self.assertEqual([r["category"] for r in rs], ["coding", None, "12"])  # a number as its JSON text, as aerie
        self.assertEqual(rs[0]["prompt_ids"], [1, 2])
        self.assertEqual(len(ee.read_prompt_ids(path, max_prompts=2)), 2)

    def test_bad_json_names_file_and_line(self):
        path = self.write("p.jsonl", json.dumps(record(0, [1])) + "\n\n{not json\n")
        with self.assertRaises(ee.InputError) as cm:
            ee.read_prompt_ids(path)
        self.assertIn(f"{path}:3: not JSON", str(cm.exception))

    def test_field_errors_name_the_line(self):
        cases = [({"index": 0, "prompt_ids": [1], "stop_ids": []}, 'no "greedy_ids"'),
                 (dict(record(0, [1]), prompt_ids=[]), '"prompt_ids" is empty'),
                 (dict(record(0, [1]), stop_ids=[1, "2"]), '"stop_ids" must be a list of integers'),
                 (dict(record(0, [1]), greedy_ids=[True]), '"greedy_ids" must be a list of integers'),
                 (dict(record(0, [1]), index=-1), '"index" must be an integer >= 0'),
                 ([1, 2], "a JSON object was expected")]
        for row, message in cases:
            path = self.write_jsonl("p.jsonl", [record(9, [1]), row])
            with self.assertRaises(ee.InputError, msg=message) as cm:
                ee.read_prompt_ids(path)
            self.assertIn(f"{path}:2: {message}", str(cm.exception))

    def test_duplicate_index_missing_and_empty_file(self):
        path = self.write_jsonl("p.jsonl", [record(3, [1]), record(3, [2])])
        with self.assertRaisesRegex(ee.InputError, r"p\.jsonl:2: index 3 again \(first on line 1\)"):
            ee.read_prompt_ids(path)
        with self.assertRaisesRegex(ee.InputError, "no such file"):
            ee.read_prompt_ids(os.path.join(self.dir, "absent.jsonl"))
        with self.assertRaisesRegex(ee.InputError, "no prompt"):
            ee.read_prompt_ids(self.write("empty.jsonl", "\n"))


class Categories(unittest.TestCase):
    def test_no_categories_is_one_group(self):
        self.assertEqual(ee.group_by_category([record(0, [1]), record(1, [2])]), [(None, [0, 1])])

    def test_sorted_with_none_last(self):
        rs = [record(0, [1], "writing"), record(1, [1]), record(2, [1], "coding"), record(3, [1], "writing")]
        self.assertEqual(ee.group_by_category(rs), [("coding", [2]), ("writing", [0, 3]), ("(none)", [1])])


class Metrics(unittest.TestCase):
    def test_figures(self):
        f = ee.figures({"drafts": 10, "draft_tokens": 30, "accepted": 12, "accepted_per_pos": [6, 4, 2]}, 3)
        self.assertAlmostEqual(f["acceptance_length"], 2.2)
        self.assertEqual(f["acceptance_rate_per_position"], [0.6, 0.4, 0.2])
        self.assertEqual(f["conditional_acceptance_rate_per_position"], [0.6, 4 / 6, 0.5])
        self.assertEqual(f["verify_passes"], 10)
        self.assertNotIn("engine_reported_acceptance_length", f)
        zero = ee.figures(ee.empty_counters(2), 2)
        self.assertEqual((zero["acceptance_length"], zero["acceptance_rate_per_position"]), (0.0, [0.0, 0.0]))

    def test_vllm_counters_sum_engines_and_pad(self):
        C = lambda name, value, idx="0": SimpleNamespace(name=name, labels={"engine": idx}, value=value)
        metrics = [C("vllm:spec_decode_num_drafts", 10), C("vllm:spec_decode_num_drafts", 5, "1"),
                   C("vllm:spec_decode_num_draft_tokens", 45), C("vllm:spec_decode_num_accepted_tokens", 20),
                   C("vllm:num_requests_running", 3),
                   SimpleNamespace(name="vllm:spec_decode_num_accepted_tokens_per_pos", labels={}, values=[9, 7]),
                   SimpleNamespace(name="vllm:spec_decode_num_accepted_tokens_per_pos", labels={}, values=[1, 1, 2])]
        self.assertEqual(ee.vllm_counters(metrics, 3),
                         {"drafts": 15, "draft_tokens": 45, "accepted": 20, "accepted_per_pos": [10, 8, 2]})

    def test_counter_differences_per_category(self):
        warm = {"drafts": 3, "draft_tokens": 9, "accepted": 4, "accepted_per_pos": [2, 1, 1]}
        after_a = {"drafts": 13, "draft_tokens": 39, "accepted": 24, "accepted_per_pos": [10, 8, 6]}
        after_b = {"drafts": 20, "draft_tokens": 60, "accepted": 27, "accepted_per_pos": [12, 9, 6]}
        a, b = ee.counter_diff(after_a, warm), ee.counter_diff(after_b, after_a)
        self.assertEqual(a, {"drafts": 10, "draft_tokens": 30, "accepted": 20, "accepted_per_pos": [8, 7, 5]})
        self.assertEqual(b, {"drafts": 7, "draft_tokens": 21, "accepted": 3, "accepted_per_pos": [2, 1, 0]})
        self.assertEqual(ee.counter_sum([a, b], 3), ee.counter_diff(after_b, warm))

    def test_sglang_meta_info(self):
        c = ee.empty_counters(3)
        # 5 passes: 1 accepted 0 drafts, 2 accepted 1, 2 accepted 3; 1 + 8 = 9 tokens... and the prefill's.
        ee.sglang_add_request(c, {"spec_verify_ct": 5, "spec_num_correct_drafts": 8, "completion_tokens": 14,
                                  "spec_correct_drafts_histogram": [1, 2, 0, 2]}, 3)
        ee.sglang_add_request(c, {"completion_tokens": 1}, 3)  # ended at its prefill: no verification pass
        self.assertEqual(c["accepted_per_pos"], [4, 2, 2])
        self.assertEqual((c["drafts"], c["accepted"], c["draft_tokens"], c["requests"]), (5, 8, 15, 1))
        f = ee.figures(c, 3)
        self.assertAlmostEqual(f["acceptance_length"], 2.6)
        self.assertAlmostEqual(f["engine_reported_acceptance_length"], 14 / 5)


class Comparisons(unittest.TestCase):
    def test_lossless(self):
        rs = [record(i, [1], "c") for i in range(4)]
        plain = [[1, 2, 3], [4, 5], [6, 7, 8], [9]]
        spec = [[1, 2, 3], [4, 5, 6], [6, 0, 8], [9]]
        failures, shown, where = ee.lossless_check(rs, plain, spec)
        self.assertEqual(failures, 2)
        self.assertEqual(where, {"median": 2, "min": 1, "max": 2})  # the differing outputs part at 2 and 1
        self.assertEqual(shown[0], {"index": 1, "category": "c", "position": 2, "plain_token": None, "spec_token": 6,
                                    "plain_length": 2, "spec_length": 3})
        self.assertEqual((shown[1]["position"], shown[1]["plain_token"], shown[1]["spec_token"]), (1, 7, 0))
        self.assertEqual(ee.lossless_check(rs, plain, spec, limit=1)[1][0]["index"], 1)
        self.assertEqual(ee.lossless_check(rs, plain, plain), (0, [], None))

    def test_spread(self):
        self.assertEqual(ee.spread([7, 1, 4]), {"median": 4, "min": 1, "max": 7})
        self.assertEqual(ee.spread(iter([3, 9])), {"median": 9, "min": 3, "max": 9})  # the upper median
        self.assertIsNone(ee.spread([]))

    def test_first_difference(self):
        self.assertEqual(ee.first_difference([1, 2, 3], [1, 2, 4]), 2)
        self.assertEqual(ee.first_difference([1, 2], [1, 2, 3]), 2)  # one extends the other
        self.assertEqual(ee.first_difference([5], [6]), 0)
        self.assertIsNone(ee.first_difference([5], [5]))

    def test_stopped_outside_stop_ids(self):
        rs = [record(0, [1], stop_ids=[2]), record(1, [1], stop_ids=[2]), record(2, [1], stop_ids=[2])]
        self.assertEqual(ee.stopped_outside(rs, [[5, 2], [5, 6, 7], [5, 6]], 3), 1)  # only [5, 6]

    def test_aerie_comparison(self):
        engine = {"acceptance_length": 2.03, "per_category": {"coding": {"acceptance_length": 3.3},
                                                              "writing": {"acceptance_length": 1.5}}}
        ev = {"acceptance_length": 2.0, "acceptance_rate_per_position": [0.5, 0.3], "dtype": "f32", "num_prompts": 8,
              "per_category": {"coding": {"acceptance_length": 3.0}, "math": {"acceptance_length": 2.0}}}
        out = ee.aerie_comparison(engine, ev)
        self.assertEqual(out["aerie"], {"acceptance_length": 2.0, "acceptance_rate_per_position": [0.5, 0.3],
                                        "dtype": "f32", "num_prompts": 8,
                                        "per_category": {"coding": {"acceptance_length": 3.0, "num_prompts": None},
                                                         "math": {"acceptance_length": 2.0, "num_prompts": None}}})
        rel = out["relative_difference"]
        self.assertAlmostEqual(rel["acceptance_length"], 0.015)
        self.assertAlmostEqual(rel["per_category"]["coding"], 0.1)
        self.assertIsNone(rel["per_category"]["math"])     # not run by the engine
        self.assertIsNone(rel["per_category"]["writing"])  # not in eval.json
        self.assertTrue(out["within_2_percent"])
        self.assertFalse(ee.aerie_comparison(dict(engine, acceptance_length=2.05), ev)["within_2_percent"])

    def test_refuses_mismatched_settings(self):
        ev = {"acceptance_length": 2.0, "num_draft_tokens": 5, "max_new_tokens": 256}
        ee.check_settings(ev, "eval.json", 5, 256)
        with self.assertRaises(ee.InputError) as cm:
            ee.check_settings(ev, "eval.json", 3, 256)
        self.assertIn("num_draft_tokens 5, this run has --num-draft-tokens 3", str(cm.exception))
        with self.assertRaisesRegex(ee.InputError, "max_new_tokens 256, this run has --max-new-tokens 128"):
            ee.check_settings(ev, "eval.json", 5, 128)
        with self.assertRaisesRegex(ee.InputError, "sampled"):
            ee.check_settings(dict(ev, sampling={"temperature": 0.7}), "eval.json", 5, 256)
        with self.assertRaisesRegex(ee.InputError, "trees"):
            ee.check_settings(dict(ev, tree={"topk": 4}), "eval.json", 5, 256)
        with self.assertRaisesRegex(ee.InputError, "no max_new_tokens"):
            ee.check_settings({"num_draft_tokens": 5}, "eval.json", 5, 256)


class EngineArguments(unittest.TestCase):
    """What each engine class passes its engine (stub vllm / sglang modules that record the keyword arguments)."""

    def job(self, **kw):
        return dict({"engine": "x", "model": "/m", "draft": "/d", "num_draft_tokens": 3, "max_new_tokens": 8,
                     "dtype": "bfloat16", "gpu_memory_utilization": 0.2, "cuda_graph": False,
                     "tensor_parallel_size": 1, "max_model_len": 4096, "multimodal_wrapper": False,
                     "attention_backend": None}, **kw)

    def stub(self, name, **attrs):
        mod = SimpleNamespace(__version__="0", **attrs)
        old = sys.modules.get(name)
        sys.modules[name] = mod
        self.addCleanup(lambda: sys.modules.__setitem__(name, old) if old else sys.modules.pop(name, None))

    def sglang_kwargs(self, **job):
        seen = {}
        self.stub("sglang", Engine=lambda **kw: seen.update(kw))
        ee.SglangEngine(self.job(**job))
        return seen

    def test_sglang_text_model_of_a_multimodal_wrapper(self):
        kw = self.sglang_kwargs(multimodal_wrapper=True, attention_backend="triton")
        self.assertEqual((kw["enable_multimodal"], kw["skip_tokenizer_init"], kw["attention_backend"]),
                         (False, True, "triton"))
        self.assertEqual((kw["speculative_algorithm"], kw["speculative_num_steps"], kw["speculative_eagle_topk"],
                          kw["speculative_num_draft_tokens"]), ("EAGLE3", 3, 1, 4))
        kw = self.sglang_kwargs(draft=None)
        self.assertNotIn("enable_multimodal", kw)
        self.assertNotIn("speculative_algorithm", kw)

    def test_vllm_text_model_of_a_multimodal_wrapper(self):
        seen = {}
        self.stub("vllm", LLM=lambda **kw: seen.update(kw))
        ee.VllmEngine(self.job(multimodal_wrapper=True))
        self.assertEqual((seen["language_model_only"], seen["skip_tokenizer_init"]), (True, True))
        self.assertEqual(seen["speculative_config"],
                         {"method": "eagle3", "model": "/d", "num_speculative_tokens": 3})


class Script(TempDir):
    """The whole script in subprocesses, with the fake engine (K 3, N 9: each prompt's 8 tokens after the prefill's
    fill whole passes of a + 1 tokens, a = prompt_ids[0] % 4)."""

    K, N = 3, 9

    def setUp(self):
        super().setUp()
        for d in ("target", "draft"):
            os.mkdir(os.path.join(self.dir, d))
        self.records = [record(0, [3, 10, 11], "coding"),  # a 3
                        record(1, [7, 5], "coding"),       # a 3
                        record(2, [1, 2], "writing"),      # a 1
                        record(4, [4, 9], None)]           # a 0
        self.records[0]["greedy_ids"] = fake_answer([3, 10, 11], [99999], self.N)
        self.prompts = self.write_jsonl("prompts.jsonl", self.records)
        self.eval_json = self.write("eval.json", json.dumps({
            "acceptance_length": 2.02, "acceptance_rate_per_position": [0.5, 0.25, 0.25], "dtype": "f32",
            "num_prompts": 4, "num_draft_tokens": self.K, "max_new_tokens": self.N,
            "per_category": {"coding": {"acceptance_length": 4.0}, "writing": {"acceptance_length": 2.5},
                             "(none)": {"acceptance_length": 1.0}}}))
        self.output = os.path.join(self.dir, "engine.json")

    def run_tool(self, *extra, env=None, prompts=None):
        cmd = [sys.executable, SCRIPT, "--engine", "fake", "--model", os.path.join(self.dir, "target"),
               "--draft", os.path.join(self.dir, "draft"), "--prompt-ids", prompts or self.prompts,
               "--num-draft-tokens", str(self.K), "--max-new-tokens", str(self.N), "--output", self.output, *extra]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                              env=dict(os.environ, **(env or {})))

    def test_end_to_end(self):
        r = self.run_tool("--aerie-eval", self.eval_json, env={"ENGINE_EVAL_FAKE_DIFFER": "2"})
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(self.output) as f:
            j = json.load(f)
        self.assertEqual((j["engine"], j["engine_version"], j["num_prompts"], j["num_draft_tokens"],
                          j["max_new_tokens"], j["dtype"]), ("fake", "fake", 4, 3, 9, "bfloat16"))
        # passes: coding 2 + 2 (a 3), writing 4 (a 1), (none) 8 (a 0); the warm-up's are not counted.
        self.assertEqual(j["verify_passes"], 16)
        self.assertAlmostEqual(j["acceptance_length"], 2.0)
        self.assertEqual(j["acceptance_rate_per_position"], [0.5, 0.25, 0.25])
        self.assertEqual(j["conditional_acceptance_rate_per_position"], [0.5, 0.5, 1.0])
        per = j["per_category"]
        self.assertEqual(list(per), ["coding", "writing", "(none)"])
        self.assertEqual([per[c]["acceptance_length"] for c in per], [4.0, 2.0, 1.0])
        self.assertEqual([per[c]["num_prompts"] for c in per], [2, 1, 1])
        self.assertEqual(per["writing"]["acceptance_rate_per_position"], [1.0, 0.0, 0.0])
        self.assertEqual((j["lossless"], j["lossless_mismatches"]), (False, 1))
        self.assertEqual(j["first_mismatches"][0]["index"], 2)
        self.assertEqual(j["first_mismatches"][0]["position"], 1)
        self.assertEqual(j["lossless_first_difference"], {"median": 1, "min": 1, "max": 1})
        self.assertIsNone(per["coding"]["lossless_first_difference"])
        self.assertEqual(per["writing"]["lossless"], False)
        self.assertEqual(per["coding"]["lossless"], True)
        self.assertEqual(j["matches_aerie_greedy"], 1)
        d = j["aerie_greedy_first_difference"]  # the other 3 part from aerie's greedy somewhere
        self.assertLessEqual(d["min"], d["median"])
        self.assertLessEqual(d["median"], d["max"])
        self.assertEqual(j["tokens_generated"], 4 * self.N)
        self.assertGreater(j["tokens_per_second_plain"], 0)
        self.assertAlmostEqual(j["speedup"], j["tokens_per_second_spec"] / j["tokens_per_second_plain"])
        self.assertEqual(j["stopped_outside_stop_ids"], {"plain": 0, "spec": 0})
        self.assertEqual({c: v["acceptance_length"] for c, v in j["aerie"]["per_category"].items()},
                         {"coding": 4.0, "writing": 2.5, "(none)": 1.0})
        self.assertAlmostEqual(j["relative_difference"]["acceptance_length"], 2.0 / 2.02 - 1)
        self.assertAlmostEqual(j["relative_difference"]["per_category"]["writing"], -0.2)
        self.assertTrue(j["within_2_percent"])
        self.assertIn("writing", r.stdout)
        self.assertIn("-20.00%", r.stdout)
        self.assertIn("1 speculative output(s) differ", r.stderr)

    def test_write_answers_holds_the_speculative_outputs(self):
        answers = os.path.join(self.dir, "answers.jsonl")
        r = self.run_tool("--write-answers", answers, env={"ENGINE_EVAL_FAKE_DIFFER": "2"})
        self.assertEqual(r.returncode, 0, r.stderr)
        rows = ee.read_prompt_ids(answers)  # what aerie eval --follow reads: the prompt-ids format
        self.assertEqual([x["index"] for x in rows], [0, 1, 2, 4])
        for x, rec in zip(rows, self.records):
            self.assertEqual((x["prompt_ids"], x["stop_ids"], x["category"]),
                             (rec["prompt_ids"], rec["stop_ids"], rec["category"]))
            self.assertEqual(len(x["greedy_ids"]), self.N)
        # The engine's own text, not the records' greedy_ids (prompt 1's holds aerie's [1, 2, 3]); prompt 2's is
        # the speculative output, which the fake makes differ from the plain one at position 1.
        self.assertEqual(rows[1]["greedy_ids"], fake_answer([7, 5], [99999], self.N))
        plain2 = fake_answer([1, 2], [99999], self.N)
        self.assertEqual(rows[2]["greedy_ids"], plain2[:1] + [plain2[1] + 1] + plain2[2:])
        r = self.run_tool("--write-answers", self.prompts)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--write-answers", r.stderr)
        self.assertIn("is also --prompt-ids", r.stderr)

    def test_no_categories_num_prompts_and_stops(self):
        rows = [dict(record(i, [4 + i, 3]), category=None) for i in range(3)]
        rows[1]["stop_ids"] = [fake_answer([5, 3], [], 3)[2]]  # ends after 3 tokens
        r = self.run_tool("--num-prompts", "2", prompts=self.write_jsonl("plain.jsonl", rows))
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(self.output) as f:
            j = json.load(f)
        self.assertNotIn("per_category", j)
        self.assertNotIn("aerie", j)
        self.assertEqual((j["num_prompts"], j["lossless"], j["tokens_generated"]), (2, True, self.N + 3))

    def test_plain_cache_is_reused_only_for_the_same_prompts(self):
        cache = os.path.join(self.dir, "plain.json")
        r = self.run_tool("--plain-cache", cache)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("fake, plain engine", r.stderr)
        with open(self.output) as f:
            first = json.load(f)
        r = self.run_tool("--plain-cache", cache)  # the plain engine does not run again
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotIn("fake, plain engine", r.stderr)
        self.assertIn("from --plain-cache", r.stderr)
        with open(self.output) as f:
            again = json.load(f)
        self.assertEqual((again["lossless"], again["acceptance_length"]), (first["lossless"], first["acceptance_length"]))
        # Other prompts (or lengths): the cache does not fit, the plain engine runs.
        rows = [dict(record(i, [4 + i, 3]), category=None) for i in range(2)]
        r = self.run_tool("--plain-cache", cache, prompts=self.write_jsonl("other.jsonl", rows))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("made with other settings or prompts", r.stderr)
        self.assertIn("fake, plain engine", r.stderr)

    def test_ids_outside_the_targets_vocabulary_are_refused(self):
        with open(os.path.join(self.dir, "target", "config.json"), "w") as f:
            json.dump({"model_type": "kimi_k25", "text_config": {"vocab_size": 11}}, f)
        r = self.run_tool()
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn(f"{self.prompts}:1: \"prompt_ids\" holds id 11, outside the target's vocabulary [0, 11)",
                      r.stderr)
        self.assertFalse(os.path.exists(self.output))
        with open(os.path.join(self.dir, "target", "config.json"), "w") as f:
            json.dump({"vocab_size": 100000}, f)
        r = self.run_tool()
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("stand-in", r.stderr)

    def test_attention_backend_is_sglangs_and_recorded(self):
        r = self.run_tool("--attention-backend", "triton")
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(self.output) as f:
            self.assertEqual(json.load(f)["attention_backend"], "triton")
        base = ["--model", os.path.join(self.dir, "target"), "--draft", os.path.join(self.dir, "draft"),
                "--prompt-ids", self.prompts, "--num-draft-tokens", "3", "--max-new-tokens", "9", "--output", self.output]
        with self.assertRaisesRegex(ee.InputError, "--attention-backend is SGLang's option"):
            ee.parse_args(["--engine", "vllm", "--attention-backend", "triton", *base])

    def test_engine_start_hint(self):
        self.assertIn("sglang_bundle.sh", ee.engine_start_hint(
            "'qwen3_asr' is already used by a Transformers config, pick another name."))
        self.assertEqual(ee.engine_start_hint("CUDA out of memory"), "")

    def test_refusals_exit_2(self):
        bad = self.write("bad.jsonl", json.dumps(self.records[0]) + "\n[1,\n")
        r = self.run_tool(prompts=bad)
        self.assertEqual(r.returncode, 2)
        self.assertIn(f"{bad}:2: not JSON", r.stderr)
        r = self.run_tool(prompts=os.path.join(self.dir, "absent.jsonl"))
        self.assertEqual((r.returncode, "no such file" in r.stderr), (2, True))
        ev = self.write("eval4.json", json.dumps({"acceptance_length": 2.0, "num_draft_tokens": 4,
                                                  "max_new_tokens": self.N}))
        r = self.run_tool("--aerie-eval", ev)
        self.assertEqual(r.returncode, 2)
        self.assertIn("num_draft_tokens 4, this run has --num-draft-tokens 3", r.stderr)
        r = self.run_tool("--aerie-eval", self.write("torn.json", '{"acceptance_length": 2.0,\n'))
        self.assertEqual(r.returncode, 2)
        self.assertIn("torn.json:2: not JSON", r.stderr)
        self.assertFalse(os.path.exists(self.output))
        # The files written are checked before any engine runs; a file that is not a plain cache is kept.
        r = self.run_tool("--plain-cache", self.eval_json)
        self.assertEqual(r.returncode, 2)
        self.assertIn("is not a plain-engine cache of this tool", r.stderr)
        with open(self.eval_json) as f:
            self.assertIn("acceptance_length", json.load(f))
        r = self.run_tool("--plain-cache", os.path.join(self.dir, "no", "plain.json"))
        self.assertEqual(r.returncode, 2)
        self.assertIn("does not exist", r.stderr)
        self.assertNotIn("plain engine", r.stderr)
        r = self.run_tool("--aerie-eval", self.eval_json, "--plain-cache", self.output)
        self.assertEqual(r.returncode, 2)
        self.assertIn("is also --output", r.stderr)
        with open(os.path.join(self.dir, "bin.jsonl"), "wb") as f:
            f.write(b"\xff\xfe{}\n")
        r = self.run_tool(prompts=os.path.join(self.dir, "bin.jsonl"))
        self.assertEqual(r.returncode, 2)
        self.assertIn("not UTF-8 text", r.stderr)


if __name__ == "__main__":
    unittest.main()
