// Speculative decoding on the real stories260K target (eagle3.md section 6): lossless for any draft, even
// an untrained one; the export format read back; the eval job's eval.json.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <algorithm>
#include <filesystem>
#include <tuple>
#include <numeric>
#include <map>
#include <iostream>
#include <fstream>

#include "comm/communicator.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "data/shard.h"
#include "model/sampling.h"
#include "train/eval.h"
#include "train/export.h"
#include "eval_testing.h"

namespace aerie {
namespace {

using testing::full_vocab_draft;

/// An untrained draft for the target: K = 200 selected ids (every other id of 0..399, so d2t is a real
/// offset map), lm_head from the target's rows.
LoadedDraft untrained_draft(const TargetModel& model, uint64_t seed) {
  LoadedDraft d;
  const int64_t V = model.config().vocab_size, K = 200;
  d.vocab.t2d.assign(V, 0);
  for (int64_t i = 0; i < K; ++i) {
    d.vocab.d2t.push_back(2 * i - i);
    d.vocab.t2d[2 * i] = 1;
  }
  d.cfg = DraftConfig::from_target(model.config(), K, default_aux_layers(model.config().num_hidden_layers));
  d.weights = init_draft_weights(d.cfg, model.lm_head(), d.vocab.selected(), seed);
  return d;
}

class EvalTest : public testing::StoriesTargetTest {};

TEST_F(EvalTest, SpeculativeDecodingIsLosslessEvenUntrained) {
  const std::vector<int32_t> stop{tok_->bos_id(), tok_->eos_id()};
  for (auto make : {untrained_draft, full_vocab_draft}) {
    LoadedDraft d = make(*model_, 0);
    for (const char* text : {"Once upon a time", "Lily and Tom went to the park.", "The cat"}) {
      auto p = prompt(text);
      auto greedy = greedy_generate(*model_, p, 48, stop);
      for (int n : {1, 3, 7}) {
        SpecDecodeResult r = speculative_generate(*model_, d, p, n, 48, stop);
        EXPECT_EQ(r.tokens, greedy) << "'" << text << "' n = " << n;
        EXPECT_EQ(r.generated, static_cast<int64_t>(greedy.size() - p.size()));
        // The prefill gives one token; every verification pass at least one more.
        EXPECT_EQ(r.verify_tokens, r.generated - 1);
        EXPECT_GE(r.verify_tokens, r.verify_passes);
        EXPECT_LE(r.verify_tokens, r.verify_passes * (n + 1));
        int64_t accepted = 0;
        for (int i = 0; i < n; ++i) {
          accepted += r.accepted_at[i];
          if (i > 0) {
            EXPECT_LE(r.accepted_at[i], r.accepted_at[i - 1]) << "position " << i << " needs position " << i - 1;
          }
        }
        // Tokens = accepted guesses + one target token per pass, less one for a last pass cut inside its
        // guesses (at max_new or a stop token).
        EXPECT_LE(r.verify_tokens, accepted + r.verify_passes);
        EXPECT_GE(r.verify_tokens, accepted + r.verify_passes - 1);
      }
    }
  }
}

/// Guesses from the known greedy output, wrong from chain position `wrong_at` on (-1: never): exercises
/// the accept/truncate/append bookkeeping with long accepted prefixes, which an untrained draft never has.
class OracleProposer : public Proposer {
 public:
  OracleProposer(std::vector<int32_t> greedy, int wrong_at) : greedy_(std::move(greedy)), wrong_at_(wrong_at) {}
  void append_verified(const Tensor& aux, const std::vector<int32_t>& next) override {
    EXPECT_EQ(aux.dim(0), static_cast<int64_t>(next.size()));
    for (size_t i = 0; i < next.size(); ++i) {
      // next token of position p must be the greedy token p+1: the caches only ever hold verified tokens.
      EXPECT_EQ(next[i], greedy_.at(len_ + i + 1)) << "position " << len_ + i;
    }
    len_ += static_cast<int64_t>(next.size());
  }
  std::vector<int32_t> propose(int n) override {
    std::vector<int32_t> g;
    for (int j = 0; j < n; ++j) {
      const size_t pos = static_cast<size_t>(len_ + 1 + j);
      int32_t t = pos < greedy_.size() ? greedy_[pos] : 0;
      if (j == wrong_at_) t = (t + 1) % 512;
      g.push_back(t);
    }
    return g;
  }

 private:
  std::vector<int32_t> greedy_;
  int wrong_at_;
  int64_t len_ = 0;
};

TEST_F(EvalTest, AcceptanceBookkeepingWithOracleDrafts) {
  auto p = prompt("Once upon a time");
  const int64_t max_new = 61;
  // The oracle knows the greedy continuation past max_new, so that the last pass's guesses are right too.
  auto longer = greedy_generate(*model_, p, max_new + 8, std::vector<int32_t>{});
  ASSERT_EQ(longer.size(), p.size() + max_new + 8);
  const std::vector<int32_t> greedy(longer.begin(), longer.end() - 8);
  const std::vector<int> aux = default_aux_layers(model_->config().num_hidden_layers);
  for (int n : {1, 4, 7})
    for (int wrong_at : {-1, 0, 2}) {
      OracleProposer oracle(longer, wrong_at);
      SpecDecodeResult r = speculative_generate(*model_, oracle, aux, p, n, max_new, {});
      EXPECT_EQ(r.tokens, greedy) << "n " << n << " wrong_at " << wrong_at;
      const int acc = wrong_at < 0 || wrong_at >= n ? n : wrong_at;  // accepted guesses per full pass
      // Each pass yields acc + 1 tokens; the last one may be cut at max_new.
      const int64_t passes = (max_new - 1 + acc) / (acc + 1);
      EXPECT_EQ(r.verify_passes, passes) << "n " << n << " wrong_at " << wrong_at;
      // The last pass emits `last` tokens (1 .. acc + 1); a guess it cuts off at max_new is not accepted.
      const int64_t last = max_new - 1 - (passes - 1) * (acc + 1);
      for (int i = 0; i < n; ++i)
        EXPECT_EQ(r.accepted_at[i], i < acc ? passes - 1 + (i < last ? 1 : 0) : 0)
            << "position " << i << " n " << n << " wrong_at " << wrong_at;
      int64_t accepted = 0;
      for (int i = 0; i < n; ++i) accepted += r.accepted_at[i];
      // Tokens = accepted guesses + a target token per pass, but for a last pass cut inside its guesses.
      EXPECT_EQ(r.verify_tokens, accepted + passes - (last <= acc ? 1 : 0));
    }
}

// SpecDecodeOptions::follow: the run emits the followed text, not the target's greedy one, accepts the guesses
// that equal it, and says where the target's own argmax parts from it; following the target's own greedy
// answer is the plain run.
TEST_F(EvalTest, FollowsAGivenContinuation) {
  auto p = prompt("Once upon a time");
  const std::vector<int> aux = default_aux_layers(model_->config().num_hidden_layers);
  const std::vector<int32_t> greedy = greedy_generate(*model_, p, 40, std::vector<int32_t>{});
  // Another engine's answer: the target's for 10 tokens, then another token, then the target's from there.
  std::vector<int32_t> parted(greedy.begin(), greedy.begin() + static_cast<int64_t>(p.size()) + 10);
  parted.push_back((greedy[p.size() + 10] + 1) % 512);
  parted = greedy_generate(*model_, parted, 40 - 11, std::vector<int32_t>{});
  ASSERT_EQ(parted.size(), greedy.size());
  const std::vector<int32_t> follow(parted.begin() + static_cast<int64_t>(p.size()), parted.end());
  for (int n : {1, 3, 5}) {
    SpecDecodeOptions so;
    so.num_draft_tokens = n;
    so.max_new = 64;  // the followed text is shorter: the run ends with it
    so.follow = follow;
    // An oracle of the followed text accepts every guess: passes of n + 1 tokens but a last cut one.
    OracleProposer oracle(parted, -1);
    SpecDecodeResult r = speculative_generate(*model_, oracle, aux, p, so);
    EXPECT_EQ(r.tokens, parted) << "n " << n;
    EXPECT_EQ(r.own_first_difference, 10) << "n " << n;
    EXPECT_EQ(r.verify_passes, (40 - 1 + n) / (n + 1)) << "n " << n;
    // An untrained draft: the same text, and its acceptance measured along it.
    LoadedDraft d = full_vocab_draft(*model_, 3);
    SpecDecodeResult u = speculative_generate(*model_, d, p, so);
    EXPECT_EQ(u.tokens, parted) << "n " << n;
    EXPECT_EQ(u.own_first_difference, 10) << "n " << n;
    // Following the target's own answer is the plain greedy chain, pass by pass.
    so.follow.assign(greedy.begin() + static_cast<int64_t>(p.size()), greedy.end());
    so.max_new = 40;
    SpecDecodeResult own = speculative_generate(*model_, d, p, so);
    SpecDecodeResult plain = speculative_generate(*model_, d, p, n, 40, {});
    EXPECT_EQ(own.tokens, plain.tokens);
    EXPECT_EQ(own.accepted_at, plain.accepted_at) << "n " << n;
    EXPECT_EQ(own.verify_passes, plain.verify_passes);
    EXPECT_EQ(own.own_first_difference, -1);
    EXPECT_EQ(plain.own_first_difference, -1);
  }
  SpecDecodeOptions tree;
  tree.follow = follow;
  tree.tree_topk = 2;
  EXPECT_NE(testing::error_of([&] { speculative_generate(*model_, full_vocab_draft(*model_, 3), p, tree); })
                .find("greedy chains"),
            std::string::npos);
}

TEST_F(EvalTest, StopsLikeGreedy) {
  LoadedDraft d = untrained_draft(*model_, 1);
  const std::vector<int32_t> p{tok_->bos_id()};  // llama2.c's greedy sample: a story that ends with BOS
  auto greedy = greedy_generate(*model_, p, 400, std::vector<int32_t>{tok_->bos_id(), tok_->eos_id()});
  ASSERT_LT(greedy.size(), p.size() + 400) << "the greedy story should end with a stop token";
  auto r = speculative_generate(*model_, d, p, 5, 400, {tok_->bos_id(), tok_->eos_id()});
  EXPECT_EQ(r.tokens, greedy);
  auto one = speculative_generate(*model_, d, p, 5, 1, {});
  EXPECT_EQ(one.tokens.size(), p.size() + 1);
  EXPECT_EQ(one.verify_passes, 0);
  EXPECT_THROW(speculative_generate(*model_, d, p, 5, 600, {}), Error) << "past max_position_embeddings";
}

// The export format of eagle3.md section 5 read back (bf16 weights, d2t I64, t2d BOOL), then eval.json
// from run_eval on real TinyStories prompts.
TEST_F(EvalTest, ExportRoundTripAndEvalJson) {
  LoadedDraft d = untrained_draft(*model_, 7);
  const std::string dir = testing::scratch_dir("eval_export");
  write_export(dir, d.cfg, d.weights, d.vocab, model_->config());  // helper d2's writer (train/export.h)
  LoadedDraft back = load_draft(dir, model_->config().num_hidden_layers);
  // The target's own folder given as the draft (eval --draft MODEL): named as a target model's folder.
  EXPECT_NE(testing::error_of([&] { load_draft(testing::model_dir(), model_->config().num_hidden_layers); })
                .find("looks like a target model's folder"),
            std::string::npos);
  EXPECT_EQ(back.vocab.d2t, d.vocab.d2t);
  EXPECT_EQ(back.vocab.t2d, d.vocab.t2d);
  EXPECT_EQ(back.cfg.to_json(), d.cfg.to_json());
  auto a = back.weights.named();
  auto b = d.weights.named();
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_EQ(a[i].second->to_float_vector(), b[i].second->to(DType::BF16).to_float_vector()) << a[i].first;

  EvalOptions o;
  o.model_dir = testing::model_dir();
  o.draft_path = dir;
  o.prompts_path = testing::data_dir() + "/tinystories/tinystories_val.txt";
  o.output_path = dir + "/eval.json";
  o.num_prompts = 3;
  o.max_new_tokens = 32;
  o.num_draft_tokens = 4;
  o.untrained = true;
  o.seed = 7;
  o.ttt_steps = 3;
  nlohmann::json j = run_eval(o);
  EXPECT_TRUE(j["lossless"].get<bool>());
  EXPECT_EQ(j["num_prompts"], 3);
  EXPECT_GE(j["acceptance_length"].get<double>(), 1.0);
  EXPECT_LE(j["acceptance_length"].get<double>(), 5.0);
  // Same seed and vocabulary: the "untrained" draft is this very draft (up to bf16 rounding of the export).
  EXPECT_NEAR(j["acceptance_length_untrained"].get<double>(), j["acceptance_length"].get<double>(), 0.5);
  EXPECT_EQ(j["acceptance_rate_per_position"].size(), 4u);
  EXPECT_EQ(j["acc_k"].size(), 3u);
  EXPECT_GE(j["tau_sim"].get<double>(), 1.0);
  EXPECT_GT(j["teacher_forced_samples"].get<int64_t>(), 0);
  EXPECT_GT(j["tokens_generated"].get<int64_t>(), 3);
  EXPECT_TRUE(std::filesystem::exists(o.output_path));
}

// Under mpirun -np 2 (tests/mpi/eval.cmake): tp = 2 and dp = 2 give the single-rank eval.json figures.
TEST_F(EvalTest, ParallelMatchesSingleRank) {
  if (world_->size() != 2) GTEST_SKIP() << "needs 2 ranks";
  const std::string dir = testing::scratch_root() + "/eval_mpi";
  if (world_->rank() == 0) {  // one writer; the other rank waits at the barrier
    testing::scratch_dir("eval_mpi");
    LoadedDraft d = full_vocab_draft(*model_, 5);
    write_export(dir + "/export", d.cfg, d.weights, d.vocab, model_->config());
  }
  world_->barrier();
  EvalOptions o;
  o.model_dir = testing::model_dir();
  o.draft_path = dir + "/export";
  o.prompts_path = testing::data_dir() + "/tinystories/tinystories_val.txt";
  o.output_path = "";
  o.num_prompts = 4;
  o.max_new_tokens = 24;
  o.num_draft_tokens = 3;
  o.ttt_steps = 3;
  o.tp = 1;  // dp = 2: prompts split over the replicas
  nlohmann::json dp2 = run_eval(o);
  o.tp = 2;  // one tp group of 2
  nlohmann::json tp2 = run_eval(o);
  // Single rank: every rank alone (a 1-rank world is not available inside mpirun; the figures come from
  // speculative_generate directly).
  LoadedDraft d = load_draft(dir + "/export", model_->config().num_hidden_layers);
  auto texts = read_prompts(o.prompts_path, 4);
  int64_t passes = 0, tokens = 0;
  for (const auto& t : texts) {
    auto r = speculative_generate(*model_, d, prompt(t), 3, 24, {tok_->bos_id(), tok_->eos_id()});
    passes += r.verify_passes;
    tokens += r.verify_tokens;
  }
  for (const auto& j : {dp2, tp2}) {
    EXPECT_TRUE(j["lossless"].get<bool>());
    EXPECT_EQ(j["num_prompts"], 4);
    EXPECT_EQ(j["verify_passes"], passes);
    EXPECT_DOUBLE_EQ(j["acceptance_length"].get<double>(), static_cast<double>(tokens) / passes);
  }
  EXPECT_EQ(dp2["acc_k"], tp2["acc_k"]);
  // Sampled runs (draws seeded by the prompt's index, made on tp rank 0) and the per-category figures
  // reduce over the replicas like the rest: dp 2 and tp 2 give the same runs.
  const std::string cats = dir + "/prompts.jsonl";
  if (world_->rank() == 0) {
    std::ofstream f(cats);
    for (const char* line : {R"({"category": "x", "prompt": "Once upon a time"})", R"({"category": "y", "prompt": "The dog"})",
                             R"({"category": "x", "prompt": "Tom had a red ball."})", R"({"prompt": "Lily saw a cat."})"})
      f << line << "\n";
  }
  world_->barrier();
  o.prompts_path = cats;
  o.temperature = 0.9;
  o.sample_seed = 2;
  o.tp = 1;
  const nlohmann::json s_dp = run_eval(o);
  o.tp = 2;
  const nlohmann::json s_tp = run_eval(o);
  EXPECT_EQ(s_dp["verify_passes"], s_tp["verify_passes"]);
  EXPECT_EQ(s_dp["acceptance_length"], s_tp["acceptance_length"]);
  ASSERT_EQ(s_dp["per_category"].size(), 3u);
  for (const char* c : {"x", "y", "(none)"}) {
    EXPECT_EQ(s_dp["per_category"][c]["verify_passes"], s_tp["per_category"][c]["verify_passes"]) << c;
    EXPECT_EQ(s_dp["per_category"][c]["acceptance_length"], s_tp["per_category"][c]["acceptance_length"]) << c;
  }
  EXPECT_EQ(s_dp["per_category"]["x"]["num_prompts"], 2);
}

// Teacher-forced metrics on extraction shards (the format `aerie extract` writes), and the aux-layer
// trap: a shard extracted with other aux layers is refused.
TEST_F(EvalTest, TeacherForcedOnShards) {
  LoadedDraft d = full_vocab_draft(*model_, 3);
  const std::string dir = testing::scratch_dir("eval_shards");
  write_export(dir + "/export", d.cfg, d.weights, d.vocab, model_->config());
  const std::vector<int> aux = default_aux_layers(model_->config().num_hidden_layers);
  std::vector<std::vector<int32_t>> seqs;
  std::vector<int64_t> lens;
  for (const char* text : {"The dog", "Tim had a ball.", "Sue"}) {
    seqs.push_back(greedy_generate(*model_, prompt(text), 40, std::vector<int32_t>{}));
    lens.push_back(static_cast<int64_t>(seqs.back().size()));
  }
  auto write_shard = [&](const std::string& sub, std::vector<int> layers) {
    std::filesystem::create_directories(dir + "/" + sub);
    ShardMeta meta;
    meta.target_model = testing::model_dir();
    meta.aux_layers = layers;
    meta.hidden_size = model_->config().hidden_size;
    meta.num_hidden_layers = model_->config().num_hidden_layers;
    meta.chunk = 0;
    ShardWriter w(dir + "/" + sub + "/" + shard_file_name(0), meta, lens);
    for (size_t i = 0; i < seqs.size(); ++i) {
      TargetOutput out = model_->forward(seqs[i], nullptr, aux, false);
      std::vector<uint8_t> mask(seqs[i].size(), 1);
      mask[0] = 0;
      w.add(static_cast<int64_t>(i), seqs[i], mask, out.aux_hidden, out.final_hidden);
    }
    w.close();
  };
  write_shard("shards", aux);
  write_shard("shards_other_aux", {1, 2, 3});
  EvalOptions o;
  o.model_dir = testing::model_dir();
  o.draft_path = dir + "/export";
  o.prompts_path = testing::data_dir() + "/tinystories/tinystories_val.txt";
  o.num_prompts = 1;
  o.max_new_tokens = 8;
  o.num_draft_tokens = 2;
  o.ttt_steps = 4;
  o.output_path = "";
  o.shards_dir = dir + "/shards";
  nlohmann::json j = run_eval(o);
  EXPECT_EQ(j["teacher_forced_samples"], 3);
  ASSERT_EQ(j["acc_k"].size(), 4u);
  double tau = 1, prod = 1;
  for (auto& a : j["acc_k"]) {
    EXPECT_GE(a.get<double>(), 0.0);
    EXPECT_LE(a.get<double>(), 1.0);
    prod *= a.get<double>();
    tau += prod;
  }
  EXPECT_NEAR(j["tau_sim"].get<double>(), tau, 1e-12);
  o.shards_dir = dir + "/shards_other_aux";
  EXPECT_THROW(run_eval(o), Error);
  // --data-split with --shards: the split's held-out samples are read from --shards' files of the same
  // names (the same chunks extracted again, e.g. as fp8), and a folder without them is refused naming the
  // file; without --shards, from where the split says.
  const std::string split = dir + "/data_split.json";
  std::ofstream(split) << nlohmann::json{{"format", "aerie-data-split"}, {"version", 1},
                                         {"shards", {{{"path", dir + "/shards/" + shard_file_name(0)}, {"num_samples", 3}}}},
                                         {"train_count", 1},
                                         {"eval", {{{"global", 0}, {"shard", 0}, {"index", 0}}, {{"global", 2}, {"shard", 0}, {"index", 2}}}}}
                               .dump();
  o.shards_dir = "";
  o.data_split_path = split;
  nlohmann::json js = run_eval(o);
  EXPECT_EQ(js["teacher_forced_samples"], 2);
  o.shards_dir = dir + "/shards_other_aux";  // the same file name, other aux layers: its samples are read
  EXPECT_THROW(run_eval(o), Error);
  std::filesystem::create_directories(dir + "/empty");
  o.shards_dir = dir + "/empty";
  EXPECT_NE(testing::error_of([&] { run_eval(o); }).find("has no " + shard_file_name(0)), std::string::npos);
}

// Eval prompts of a chat model end with the assistant header of the template's generation prompt, as the
// served model sees them (the bug this guards against: a prompt rendered as the bare user turn, ending
// with "<|im_end|>\n", which the target answers by opening a new turn rather than with an answer).
TEST(EvalPrompt, ChatPromptEndsWithTheAssistantHeader) {
  const std::string dir = testing::data_dir() + "/tokenizers/qwen3";  // has ChatML's special tokens
  if (!std::filesystem::exists(dir + "/tokenizer.json")) GTEST_SKIP() << "no tokenizer at " << dir;
  auto tok = Tokenizer::load(dir);
  const int32_t im_start = tok->token_to_id("<|im_start|>"), im_end = tok->token_to_id("<|im_end|>");
  ASSERT_GE(im_start, 0);
  ASSERT_GE(im_end, 0);
  std::vector<int32_t> header{im_start};
  for (int32_t id : tok->encode("assistant\n")) header.push_back(id);
  const std::string q = "Compose an engaging travel blog post about a recent trip to Hawaii.";
  for (const char* name : {"chatml", "smollm2", "qwen2.5"}) {
    SCOPED_TRACE(name);
    auto tmpl = make_chat_template(name, *tok);
    std::vector<int32_t> ids = eval_prompt_ids(*tmpl, q, *tok);
    ASSERT_GT(ids.size(), header.size());
    EXPECT_EQ(std::vector<int32_t>(ids.end() - static_cast<int64_t>(header.size()), ids.end()), header);
    // decode drops the special tokens (<|im_start|>, <|im_end|>): the text between them is what is left.
    const std::string text = tok->decode(ids);
    const std::string want_end = q + "\nassistant\n";
    ASSERT_GE(text.size(), want_end.size());
    EXPECT_EQ(text.substr(text.size() - want_end.size()), want_end) << text;
    // Nothing of the answer is in the prompt: no token is trained, and apply's tokens are a prefix.
    Conversation conv;
    conv.turns.push_back({ChatRole::User, q});
    TokenizedSample user_turn = tmpl->apply(conv, *tok);
    ASSERT_LT(user_turn.input_ids.size(), ids.size());
    EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.begin() + static_cast<int64_t>(user_turn.input_ids.size())),
              user_turn.input_ids);
  }
  // SmolLM2's default system prompt comes first; the special tokens are where ChatML puts them.
  auto smol = make_chat_template("smollm2", *tok);
  const std::vector<int32_t> ids = eval_prompt_ids(*smol, "Hi", *tok);
  EXPECT_EQ(tok->decode(ids), "system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face\n"
                              "user\nHi\nassistant\n");
  std::vector<int32_t> specials;
  for (int32_t id : ids)
    if (id == im_start || id == im_end) specials.push_back(id);
  EXPECT_EQ(specials, (std::vector<int32_t>{im_start, im_end, im_start, im_end, im_start}));
  EXPECT_EQ(ids.front(), im_start);
}

// "plain" (base models such as stories260K): BOS + the text, as before.
TEST_F(EvalTest, PlainPromptIsBosAndText) {
  auto tmpl = make_chat_template("plain", *tok_);
  EXPECT_EQ(eval_prompt_ids(*tmpl, "Once upon a time", *tok_), prompt("Once upon a time"));
}

// The target in bf16 (TargetModelOptions, here on the CPU): the draft reads its BF16 aux hidden states
// (widened to F32 by DraftDecoder). Greedy equality is required for all but at most one prompt: the
// (n+1)-row verification forward and the 1-row greedy forward may sum a GEMM in other orders, and a flipped
// bf16 rounding can flip an argmax where the two top logits nearly tie (tests/train/eval_cuda_test.cc).
TEST_F(EvalTest, Bf16TargetKeepsGreedyOutputs) {
  EvalOptions o = small_eval("eval_bf16", 5);
  o.device = "cpu";
  const nlohmann::json f32 = run_eval(o);
  o.dtype = "bf16";
  const nlohmann::json b16 = run_eval(o);
  EXPECT_EQ(f32["dtype"], "f32");
  EXPECT_EQ(b16["dtype"], "bf16");
  EXPECT_TRUE(f32["lossless"].get<bool>());
  EXPECT_LE(b16["lossless_failures"].get<int64_t>(), 1);
  EXPECT_GE(b16["acceptance_length"].get<double>(), 1.0);
  EXPECT_EQ(b16["verify_passes"].get<int64_t>() > 0, true);
  EXPECT_NEAR(b16["acceptance_length"].get<double>(), f32["acceptance_length"].get<double>(), 0.5);
  EXPECT_EQ(b16["example"]["prompt"].get<std::string>().empty(), false);
  o.dtype = "f16";
  EXPECT_NE(testing::error_of([&] { run_eval(o); }).find("--dtype 'f16'"), std::string::npos);
}


// ---- Speculative sampling (temperature > 0): the output must be distributed as the target's sampling ----

/// Pearson's chi-square statistic of `counts` against the probabilities `expected` (summing to 1) over
/// N = sum(counts) draws, cells of expected count < 5 pooled into one; df: the cells used - 1. A count in
/// a cell of probability 0 makes the statistic infinite.
double chi_square(const std::vector<int64_t>& counts, const std::vector<double>& expected, int* df) {
  int64_t N = 0;
  for (int64_t c : counts) N += c;
  double stat = 0, pooled_e = 0, pooled_c = 0;
  int cells = 0;
  bool impossible = false;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double e = expected[i] * static_cast<double>(N);
    if (expected[i] == 0) {
      impossible = impossible || counts[i] > 0;
      continue;
    }
    if (e < 5) {
      pooled_e += e;
      pooled_c += static_cast<double>(counts[i]);
      continue;
    }
    stat += (counts[i] - e) * (counts[i] - e) / e;
    ++cells;
  }
  if (pooled_e > 0) {
    stat += (pooled_c - pooled_e) * (pooled_c - pooled_e) / pooled_e;
    ++cells;
  }
  *df = cells - 1;
  return impossible ? std::numeric_limits<double>::infinity() : stat;
}

/// The chi-square value that a correct sampler exceeds with probability 1e-6 (Wilson-Hilferty: z = 4.753).
double chi_square_bound(int df) {
  const double k = df, z = 4.753, a = 2.0 / (9.0 * k);
  return k * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

/// Two tokens generated over V = 6 ids by chains of 2 guesses from a made-up target (P0, P1[x1], P2[x1][x2])
/// and draft (Q0, Q1[g0], Q2 alike) under `rule`, counted per (x1, x2) in 36 cells: the joint law must be
/// P0(x1) P1[x1](x2). The draft gives mass where the target has none and none where it has some, so that
/// acceptance, rejection, the residual and the bonus token all occur.
std::vector<int64_t> toy_two_tokens(const AcceptRule& rule, int64_t N, std::vector<double>* expected) {
  const int V = 6;
  SampleRng table_rng(17);
  auto dist = [&](int zero) {  // a random distribution with id `zero` (-1: none) at probability 0
    std::vector<double> d(V);
    double t = 0;
    for (int i = 0; i < V; ++i) t += d[i] = i == zero ? 0.0 : 0.2 + table_rng.uniform();
    for (double& x : d) x /= t;
    return d;
  };
  // Target: P[len][context] (context = x1, or 6 x1 + x2); id 5 never follows the start.
  std::vector<double> P0 = dist(5);
  std::vector<std::vector<double>> P1(V), P2(V * V), Q1(V), Q2(V * V);
  for (int a = 0; a < V; ++a) P1[a] = dist(a % 3 == 0 ? 1 : -1);
  for (int a = 0; a < V * V; ++a) P2[a] = dist(-1);
  std::vector<double> Q0 = dist(0);  // the draft never proposes id 0 first, but gives 5 mass
  for (int a = 0; a < V; ++a) Q1[a] = dist(2);
  for (int a = 0; a < V * V; ++a) Q2[a] = dist(-1);
  auto target = [&](const std::vector<int32_t>& ctx) -> const std::vector<double>& {
    return ctx.empty() ? P0 : ctx.size() == 1 ? P1[ctx[0]] : P2[ctx[0] * V + ctx[1]];
  };
  auto draft = [&](const std::vector<int32_t>& ctx) -> const std::vector<double>& {
    return ctx.empty() ? Q0 : ctx.size() == 1 ? Q1[ctx[0]] : Q2[ctx[0] * V + ctx[1]];
  };
  auto as_dist = [](const std::vector<double>& q) {
    DraftDist d;
    for (size_t i = 0; i < q.size(); ++i)
      if (q[i] > 0) d.ids.push_back(static_cast<int32_t>(i)), d.probs.push_back(q[i]);
    return d;
  };
  expected->assign(V * V, 0.0);
  for (int a = 0; a < V; ++a)
    for (int b = 0; b < V; ++b) (*expected)[a * V + b] = P0[a] * P1[a][b];
  std::vector<int64_t> counts(V * V, 0);
  SampleRng rng(5);
  for (int64_t run = 0; run < N; ++run) {
    std::vector<int32_t> out;
    while (out.size() < 2) {  // one verification pass from the tokens so far
      std::vector<int32_t> ctx = out, guesses;
      std::vector<DraftDist> q;
      std::vector<std::vector<double>> p;
      for (int i = 0; i < 2; ++i) {
        const std::vector<int32_t> c(ctx.begin(), ctx.begin() + std::min<size_t>(ctx.size(), 2));
        p.push_back(target(c));
        q.push_back(as_dist(draft(c)));
        const std::vector<double>& qd = draft(c);
        double u = rng.uniform(), cum = 0;
        int32_t g = V - 1;
        for (int k = 0; k < V; ++k)
          if ((cum += qd[k]) > u && qd[k] > 0) {
            g = k;
            break;
          }
        guesses.push_back(g);
        ctx.push_back(g);
      }
      p.push_back(target(std::vector<int32_t>(ctx.begin(), ctx.begin() + 2)));
      for (int32_t t : rule(p, q, guesses, rng)) out.push_back(t);
    }
    ++counts[out[0] * V + out[1]];
  }
  return counts;
}

TEST(SpeculativeSampling, RejectionRuleGivesTheTargetsDistribution) {
  std::vector<double> expected;
  int df = 0;
  const auto counts = toy_two_tokens(accept_speculative_sampling, 200000, &expected);
  const double stat = chi_square(counts, expected, &df);
  EXPECT_LT(stat, chi_square_bound(df)) << "df " << df;
  std::cout << "standard rule: chi2 " << stat << " (df " << df << ", bound " << chi_square_bound(df) << ")\n";
  // Two wrong rules, each a mistake one could make, fail the same bound by far: drawing the correction
  // from p instead of the residual, and accepting every guess (the output is then the draft's law).
  const AcceptRule resample_from_p = [](const std::vector<std::vector<double>>& p, const std::vector<DraftDist>& q,
                                        const std::vector<int32_t>& g, SampleRng& rng) {
    std::vector<int32_t> out;
    for (size_t i = 0; i <= g.size(); ++i) {
      double qg = 0;
      for (size_t k = 0; i < g.size() && k < q[i].ids.size(); ++k)
        if (q[i].ids[k] == g[i]) qg = q[i].probs[k];
      if (i < g.size() && rng.uniform() < p[i][g[i]] / qg) {
        out.push_back(g[i]);
        continue;
      }
      const double u = rng.uniform();  // the correction (or bonus) drawn from p itself
      double cum = 0;
      int32_t t = static_cast<int32_t>(p[i].size()) - 1;
      for (size_t k = 0; k < p[i].size(); ++k)
        if ((cum += p[i][k]) > u && p[i][k] > 0) {
          t = static_cast<int32_t>(k);
          break;
        }
      out.push_back(t);
      break;
    }
    return out;
  };
  const AcceptRule accept_all = [](const std::vector<std::vector<double>>&, const std::vector<DraftDist>&,
                                   const std::vector<int32_t>& g, SampleRng&) { return g; };
  for (const auto& [name, rule] : {std::pair<const char*, AcceptRule>{"correction from p", resample_from_p},
                                   std::pair<const char*, AcceptRule>{"accept every guess", accept_all}}) {
    std::vector<double> e;
    int d = 0;
    const double wrong = chi_square(toy_two_tokens(rule, 200000, &e), e, &d);
    EXPECT_GT(wrong, 10 * chi_square_bound(d)) << name;
    std::cout << name << ": chi2 " << wrong << " (df " << d << ")\n";
  }
}

TEST(SpeculativeSampling, RuleEdgesAndErrors) {
  SampleRng rng(1);
  // p >= q at the guess: always accepted; all accepted: the bonus comes from p_n (here one-hot on id 2).
  const std::vector<std::vector<double>> p{{0.5, 0.5, 0.0}, {0.0, 0.0, 1.0}};
  for (int i = 0; i < 50; ++i)
    EXPECT_EQ(accept_speculative_sampling(p, {DraftDist{{0, 1}, {0.5, 0.5}}}, {1}, rng), (std::vector<int32_t>{1, 2}));
  // p = 0 at the guess: always rejected, the correction from the residual max(0, p - q) = id 0 only.
  for (int i = 0; i < 50; ++i)
    EXPECT_EQ(accept_speculative_sampling({{1.0, 0.0, 0.0}, {0, 0, 1.0}}, {DraftDist{{1}, {1.0}}}, {1}, rng),
              (std::vector<int32_t>{0}));
  EXPECT_THROW(accept_speculative_sampling(p, {DraftDist{{0}, {1.0}}}, {1}, rng), Error) << "q(guess) = 0";
  EXPECT_THROW(accept_speculative_sampling(p, {}, {1}, rng), Error) << "sizes";
  EXPECT_THROW(accept_speculative_sampling(p, {DraftDist{{7}, {1.0}}}, {7}, rng), Error) << "guess outside V";
}

TEST_F(EvalTest, DraftProposesSampledChains) {
  LoadedDraft d = untrained_draft(*model_, 3);
  const auto p = prompt("Once upon a time");
  TargetOutput out = model_->forward(p, nullptr, default_aux_layers(model_->config().num_hidden_layers), false);
  Tensor aux = out.aux_hidden;
  DraftDecoder dec(d.cfg, d.weights, model_->embed_tokens(), d.vocab.d2t, 64);
  std::vector<int32_t> next(p.begin() + 1, p.end());
  next.push_back(42);
  dec.append_verified(aux, next);
  SampleRng a(9);
  std::vector<std::vector<double>> q;
  EXPECT_EQ(dec.propose_sampled(5, SamplingParams{0.0, 1.0}, a, &q), dec.propose(5)) << "temperature 0 is greedy";
  const auto g1 = dec.propose_sampled(5, SamplingParams{1.0, 1.0}, a, &q);  // a: no draw at temperature 0
  ASSERT_EQ(q.size(), 5u);
  const std::vector<int64_t> sel = d.vocab.selected();  // draft id k -> target id sel[k]
  for (int i = 0; i < 5; ++i) {
    const int64_t k = std::lower_bound(sel.begin(), sel.end(), g1[i]) - sel.begin();
    ASSERT_TRUE(d.vocab.t2d[g1[i]]) << "guess " << i << " is a draft-vocabulary id";
    EXPECT_GT(q[i][k], 0.0) << "guess " << i << " was drawn from q";
  }
  SampleRng c(9);
  EXPECT_EQ(dec.propose_sampled(5, SamplingParams{1.0, 1.0}, c, nullptr), g1) << "same seed, same chain";
  EXPECT_NE(dec.propose_sampled(5, SamplingParams{1.0, 1.0}, c, nullptr), g1) << "the next draws differ";
}

/// A proposer that knows the target: q = 0.6 p' + 0.4 uniform, p' the target's sampling distribution
/// without its most likely id (renormalised), so that guesses other than the favourite are mostly
/// accepted, the target's favourite only ever comes from the residual, and q has mass where p has none.
class MixtureProposer : public Proposer {
 public:
  MixtureProposer(TargetModel& m, std::vector<int32_t> prompt, const SamplingParams& sp)
      : m_(m), ids_(std::move(prompt)), sp_(sp) {}
  void append_verified(const Tensor&, const std::vector<int32_t>& next) override {
    // next[i] follows position len_ + i; the last one is the newest token.
    ids_.resize(static_cast<size_t>(len_ + 1));
    ids_.insert(ids_.end(), next.begin(), next.end());
    len_ += static_cast<int64_t>(next.size());
  }
  std::vector<int32_t> propose(int) override { ADD_FAILURE() << "greedy propose at temperature > 0"; return {}; }
  std::vector<int32_t> propose_sampled(int n, const SamplingParams&, SampleRng& rng, std::vector<DraftDist>& q) override {
    std::vector<int32_t> ctx = ids_, g;
    q.clear();
    for (int i = 0; i < n; ++i) {
      std::vector<double> d = dist(ctx);
      const int64_t top = std::max_element(d.begin(), d.end()) - d.begin();
      d[top] = 0;
      double t = 0;
      for (double x : d) t += x;
      DraftDist dd;
      for (size_t k = 0; k < d.size(); ++k) {
        dd.ids.push_back(static_cast<int32_t>(k));
        dd.probs.push_back(0.6 * d[k] / t + 0.4 / static_cast<double>(d.size()));
      }
      const double u = rng.uniform();
      double cum = 0;
      int32_t pick = static_cast<int32_t>(d.size()) - 1;
      for (size_t k = 0; k < d.size(); ++k)
        if ((cum += dd.probs[k]) > u) {
          pick = static_cast<int32_t>(k);
          break;
        }
      g.push_back(pick);
      ctx.push_back(pick);
      q.push_back(std::move(dd));
    }
    return g;
  }
  /// The target's sampling distribution after `ids`.
  std::vector<double> dist(const std::vector<int32_t>& ids) {
    TargetOutput o = m_.forward(ids, nullptr, {}, true);
    const int64_t L = static_cast<int64_t>(ids.size());
    const std::vector<float> l = o.logits.slice(L - 1, L).to_float_vector();
    return sampling_distribution(l.data(), static_cast<int64_t>(l.size()), sp_);
  }

 private:
  TargetModel& m_;
  std::vector<int32_t> ids_;  // the verified tokens: the prompt, then what followed
  SamplingParams sp_;
  int64_t len_ = 0;           // positions whose next token was appended, less the prompt's first
};

// The demo target at temperature 1.3 with a proposer that knows it (MixtureProposer: most guesses
// accepted where the target is not sure, corrections from the residual): over 2000 seeds the second new token (the first speculation
// decides) has the target's law, the marginal sum over x1 of p(x1) p(x2 | x1), and the third, after the most
// frequent (x1, x2), has p(x3 | x1, x2). Accepting every guess instead fails the same bound; the real
// draft decoder's sampled chains (K = 512 and 200) pass it too.
TEST_F(EvalTest, SampledSpeculationHasTheTargetsDistribution) {
  const auto p = prompt("Once upon a time");
  const int64_t V = model_->config().vocab_size, P = static_cast<int64_t>(p.size());
  const SamplingParams sp{1.3, 1.0};
  MixtureProposer target_law(*model_, p, sp);
  const std::vector<double> p1 = target_law.dist(p);
  std::vector<double> marginal(V, 0.0);
  for (int64_t x1 = 0; x1 < V; ++x1) {
    if (p1[x1] < 1e-9) continue;
    std::vector<int32_t> ids = p;
    ids.push_back(static_cast<int32_t>(x1));
    const std::vector<double> p2 = target_law.dist(ids);
    for (int64_t x = 0; x < V; ++x) marginal[x] += p1[x1] * p2[x];
  }
  double total = 0;
  for (double x : marginal) total += x;
  for (double& x : marginal) x /= total;  // the skipped x1 (< 1e-9 each)
  const int64_t N = 2000;
  const std::vector<int> aux = default_aux_layers(model_->config().num_hidden_layers);
  // Runs of 3 new tokens (prefill + guesses of chains of 3); `draft` null: the MixtureProposer.
  auto run = [&](const LoadedDraft* draft, const AcceptRule& rule, int64_t* accepted) {
    std::vector<std::vector<int32_t>> outs;
    *accepted = 0;
    for (int64_t seed = 0; seed < N; ++seed) {
      SpecDecodeOptions o;
      o.num_draft_tokens = 3;
      o.max_new = 3;
      o.sampling = sp;
      o.seed = seed;
      o.accept = rule;
      MixtureProposer mix(*model_, p, sp);
      const SpecDecodeResult r =
          draft ? speculative_generate(*model_, *draft, p, o) : speculative_generate(*model_, mix, aux, p, o);
      EXPECT_EQ(r.tokens.size(), static_cast<size_t>(P + 3));
      outs.emplace_back(r.tokens.begin() + P, r.tokens.end());
      *accepted += r.accepted_at[0];
    }
    return outs;
  };
  auto second_token = [&](const std::vector<std::vector<int32_t>>& outs) {
    std::vector<int64_t> c(V, 0);
    for (const auto& o : outs) ++c[o[1]];
    return c;
  };
  const AcceptRule accept_all = [](const std::vector<std::vector<double>>&, const std::vector<DraftDist>&,
                                   const std::vector<int32_t>& g, SampleRng&) { return g; };
  int64_t accepted = 0;
  int df = 0;
  const auto outs = run(nullptr, nullptr, &accepted);
  const double stat = chi_square(second_token(outs), marginal, &df);
  EXPECT_LT(stat, chi_square_bound(df)) << "second token, df " << df;
  EXPECT_GT(accepted, N / 10) << "guesses are accepted (the target's favourite, about 3/4 of its mass here, only by correction)";
  // The third token after the most frequent (x1, x2).
  std::map<std::pair<int32_t, int32_t>, std::vector<int64_t>> third;
  for (const auto& o : outs) {
    auto& c = third[{o[0], o[1]}];
    c.resize(V, 0);
    ++c[o[2]];
  }
  auto top = std::max_element(third.begin(), third.end(), [](const auto& a, const auto& b) {
    return std::accumulate(a.second.begin(), a.second.end(), int64_t{0}) <
           std::accumulate(b.second.begin(), b.second.end(), int64_t{0});
  });
  std::vector<int32_t> ctx = p;
  ctx.push_back(top->first.first);
  ctx.push_back(top->first.second);
  int df3 = 0;
  const double stat3 = chi_square(top->second, target_law.dist(ctx), &df3);
  const int64_t n3 = std::accumulate(top->second.begin(), top->second.end(), int64_t{0});
  EXPECT_GE(n3, 200);
  EXPECT_LT(stat3, chi_square_bound(df3)) << "third token after (" << top->first.first << ", " << top->first.second
                                          << "), df " << df3;
  int64_t unused = 0;
  int dfw = 0;
  const double wrong = chi_square(second_token(run(nullptr, accept_all, &unused)), marginal, &dfw);
  EXPECT_GT(wrong, chi_square_bound(dfw)) << "accepting every guess";
  std::cout << "mixture proposer: second token chi2 " << stat << " (df " << df << ", bound " << chi_square_bound(df)
            << "), first guesses accepted " << accepted << " of " << N << "; third token after the top pair chi2 "
            << stat3 << " (df " << df3 << ", " << n3 << " runs); every guess accepted: chi2 " << wrong << " (df "
            << dfw << ")\n";
  for (auto make : {full_vocab_draft, untrained_draft}) {
    const LoadedDraft d = make(*model_, 0);
    int dfd = 0;
    const double sd = chi_square(second_token(run(&d, nullptr, &accepted)), marginal, &dfd);
    EXPECT_LT(sd, chi_square_bound(dfd)) << "draft of K = " << d.cfg.draft_vocab_size << ", df " << dfd;
    std::cout << "draft K " << d.cfg.draft_vocab_size << ": chi2 " << sd << " (df " << dfd << "), accepted "
              << accepted << "\n";
  }
}

TEST_F(EvalTest, SampledEvalJson) {
  EvalOptions o = small_eval("eval_sampled", 4);
  o.temperature = 0.8;
  o.top_p = 0.95;
  o.sample_seed = 3;
  const nlohmann::json j = run_eval(o);
  EXPECT_FALSE(j.contains("lossless"));
  EXPECT_EQ(j["sampling"]["temperature"], 0.8);
  EXPECT_EQ(j["sampling"]["top_p"], 0.95);
  EXPECT_GE(j["acceptance_length"].get<double>(), 1.0);
  EXPECT_EQ(run_eval(o)["acceptance_length"], j["acceptance_length"]) << "the same seed gives the same run";
  o.sample_seed = 4;
  EXPECT_GE(run_eval(o)["verify_passes"].get<int64_t>(), 1);
  o.temperature = -1;
  EXPECT_THROW(run_eval(o), Error);
}

// Prompts with a "category" (as MT-Bench's and Spec-Bench's): eval.json's per_category splits the figures
// by it, prompts without one under "(none)", and the parts add up to the whole.
TEST_F(EvalTest, PerCategoryFigures) {
  EvalOptions o = small_eval("eval_per_category", 6);
  o.prompts_path = (std::filesystem::path(o.draft_path).parent_path() / "prompts.jsonl").string();
  {
    std::ofstream f(o.prompts_path);
    f << R"({"category": "b", "prompt": "Once upon a time"})" << "\n"
      << R"({"category": "a", "turns": ["The cat sat"]})" << "\n"
      << R"({"prompt": "Lily and Tom went to the park."})" << "\n"
      << R"({"category": "b", "prompt": "One day a little bird"})" << "\n"
      << R"({"category": null, "prompt": "The sun"})" << "\n"
      << R"({"category": 5, "prompt": "A big tree"})" << "\n"
      << R"js({"category": "(none)", "prompt": "Sam ran"})js" << "\n";
  }
  std::vector<std::string> cats;
  EXPECT_EQ(read_prompts(o.prompts_path, 0, &cats).size(), 7u);
  EXPECT_EQ(cats, (std::vector<std::string>{"b", "a", "", "b", "", "5", "(none)"})) << "null: none; 5: its JSON text";
  o.num_prompts = 0;
  const nlohmann::json j = run_eval(o);
  ASSERT_TRUE(j.contains("per_category"));
  const nlohmann::json& per = j["per_category"];
  EXPECT_EQ(per.size(), 4u);
  EXPECT_EQ(per["a"]["num_prompts"], 1);
  EXPECT_EQ(per["b"]["num_prompts"], 2);
  EXPECT_EQ(per["5"]["num_prompts"], 1);
  EXPECT_EQ(per["(none)"]["num_prompts"], 3) << "no category, null, and the category named (none)";
  int64_t passes = 0, tokens = 0;
  for (const auto& [name, c] : per.items()) {
    passes += c["verify_passes"].get<int64_t>();
    tokens += c["tokens_generated"].get<int64_t>();
    EXPECT_TRUE(c["lossless"].get<bool>()) << name;
  }
  EXPECT_EQ(passes, j["verify_passes"].get<int64_t>());
  EXPECT_EQ(tokens, j["tokens_generated"].get<int64_t>());
  o.prompts_path = testing::data_dir() + "/tinystories/tinystories_val.txt";
  o.num_prompts = 2;  // two of its lines suffice (0 would evaluate all of them)
  EXPECT_FALSE(run_eval(o).contains("per_category")) << "no categories, no table";
}

// ---- Tree drafts (greedy): lossless like chains, and the accepted path is the target's ----

TEST_F(EvalTest, DraftTreesAreWellFormed) {
  LoadedDraft d = untrained_draft(*model_, 2);
  const auto p = prompt("Once upon a time");
  TargetOutput out = model_->forward(p, nullptr, default_aux_layers(model_->config().num_hidden_layers), false);
  DraftDecoder dec(d.cfg, d.weights, model_->embed_tokens(), d.vocab.d2t, 64);
  std::vector<int32_t> next(p.begin() + 1, p.end());
  next.push_back(42);
  dec.append_verified(out.aux_hidden, next);
  const std::vector<int32_t> chain = dec.propose(5);
  const DraftTree one = dec.propose_tree(8, 1, 5);
  EXPECT_EQ(one.tokens, chain) << "topk 1 is the chain";
  EXPECT_EQ(one.parent, (std::vector<int32_t>{-1, 0, 1, 2, 3}));
  for (const auto& [budget, topk, depth] : {std::tuple{8, 3, 4}, std::tuple{16, 4, 6}, std::tuple{3, 4, 2}}) {
    const DraftTree t = dec.propose_tree(budget, topk, depth);
    SCOPED_TRACE("budget " + std::to_string(budget) + " topk " + std::to_string(topk));
    ASSERT_EQ(t.tokens.size(), static_cast<size_t>(budget));
    EXPECT_EQ(t.tokens[0], chain[0]) << "the draft's favourite leads depth 1";
    std::vector<int> dep(t.tokens.size());
    for (size_t i = 0; i < t.tokens.size(); ++i) {
      ASSERT_LT(t.parent[i], static_cast<int32_t>(i));
      dep[i] = t.parent[i] < 0 ? 1 : dep[t.parent[i]] + 1;
      if (i > 0) {
        EXPECT_GE(dep[i], dep[i - 1]) << "breadth-first";
      }
      EXPECT_LE(dep[i], depth);
      EXPECT_TRUE(d.vocab.t2d[t.tokens[i]]) << "node " << i << " is a draft-vocabulary id";
      int children = 0;
      for (size_t j = 0; j < t.tokens.size(); ++j) children += t.parent[j] == static_cast<int32_t>(i);
      EXPECT_LE(children, topk);
    }
  }
  EXPECT_THROW(dec.propose_tree(0, 2, 2), Error);
}

/// Guesses from the known greedy output as a tree whose first branch is wrong: the root's children are
/// a wrong token first, then the right one, each right node continuing with a wrong and a right child,
/// so that the accepted path runs through second children only.
class OracleTreeProposer : public Proposer {
 public:
  explicit OracleTreeProposer(std::vector<int32_t> greedy) : greedy_(std::move(greedy)) {}
  void append_verified(const Tensor&, const std::vector<int32_t>& next) override {
    len_ += static_cast<int64_t>(next.size());
  }
  std::vector<int32_t> propose(int) override { return {}; }
  DraftTree propose_tree(int budget, int, int depth) override {
    DraftTree t;
    int32_t right_parent = -1;
    for (int dd = 0; dd < depth && static_cast<int>(t.tokens.size()) + 2 <= budget; ++dd) {
      const size_t pos = static_cast<size_t>(len_ + 1 + dd);
      const int32_t good = pos < greedy_.size() ? greedy_[pos] : 0;
      t.tokens.push_back((good + 1) % 512);
      t.parent.push_back(right_parent);
      t.tokens.push_back(good);
      t.parent.push_back(right_parent);
      right_parent = static_cast<int32_t>(t.tokens.size()) - 1;
    }
    return t;
  }

 private:
  std::vector<int32_t> greedy_;
  int64_t len_ = 0;
};

TEST_F(EvalTest, TreeDecodingIsLosslessAndAcceptsTheTargetsPath) {
  const std::vector<int32_t> stop{tok_->bos_id(), tok_->eos_id()};
  for (auto make : {untrained_draft, full_vocab_draft}) {
    const LoadedDraft d = make(*model_, 0);
    for (const char* text : {"Once upon a time", "Lily and Tom went to the park."}) {
      const auto p = prompt(text);
      const auto greedy = greedy_generate(*model_, p, 40, stop);
      for (const auto& [n, topk, depth] : {std::tuple{6, 2, 0}, std::tuple{10, 4, 5}, std::tuple{4, 3, 2}}) {
        SpecDecodeOptions o;
        o.num_draft_tokens = n;
        o.max_new = 40;
        o.stop_ids = stop;
        o.tree_topk = topk;
        o.tree_depth = depth;
        const SpecDecodeResult r = speculative_generate(*model_, d, p, o);
        EXPECT_EQ(r.tokens, greedy) << "'" << text << "' n " << n << " topk " << topk;
        EXPECT_EQ(r.verify_tokens, r.generated - 1);
        EXPECT_EQ(r.accepted_at.size(), static_cast<size_t>(depth > 0 ? depth : n)) << "a tree accepts at most its depth";
        for (size_t i = 1; i < r.accepted_at.size(); ++i) EXPECT_LE(r.accepted_at[i], r.accepted_at[i - 1]);
      }
    }
  }
  // The oracle tree: every pass accepts its whole right path (depth nodes) through second children.
  const auto p = prompt("Once upon a time");
  const int64_t max_new = 41;
  auto longer = greedy_generate(*model_, p, max_new + 8, std::vector<int32_t>{});
  const std::vector<int32_t> greedy(longer.begin(), longer.end() - 8);
  OracleTreeProposer oracle(longer);
  SpecDecodeOptions o;
  o.num_draft_tokens = 8;  // 4 depths of two children
  o.max_new = max_new;
  o.tree_topk = 2;
  o.tree_depth = 4;
  const SpecDecodeResult r =
      speculative_generate(*model_, oracle, default_aux_layers(model_->config().num_hidden_layers), p, o);
  EXPECT_EQ(r.tokens, greedy);
  EXPECT_EQ(r.verify_passes, 8) << "40 tokens after the prefill, 5 per pass";
  ASSERT_EQ(r.accepted_at.size(), 4u) << "per depth";
  EXPECT_EQ(r.accepted_at[3], 8);
  o.sampling.temperature = 1.0;
  EXPECT_THROW(speculative_generate(*model_, oracle, default_aux_layers(model_->config().num_hidden_layers), p, o),
               Error)
      << "sampled trees are not implemented";
}

TEST_F(EvalTest, TreeEvalJson) {
  EvalOptions o = small_eval("eval_tree", 7);
  const nlohmann::json chain = run_eval(o);
  o.tree_topk = 3;
  o.tree_depth = 3;
  const nlohmann::json j = run_eval(o);
  EXPECT_TRUE(j["lossless"].get<bool>());
  EXPECT_EQ(j["tree"]["topk"], 3);
  EXPECT_EQ(j["tree"]["depth"], 3);
  EXPECT_EQ(j["tree"]["num_draft_tokens"], o.num_draft_tokens);
  EXPECT_EQ(j["acceptance_rate_per_position"].size(), 3u) << "one per depth";
  EXPECT_FALSE(chain.contains("tree"));
  EXPECT_EQ(j["tokens_generated"], chain["tokens_generated"]) << "the same greedy outputs";
  o.temperature = 0.5;
  EXPECT_THROW(run_eval(o), Error) << "sampled trees";
}
}  // namespace
}  // namespace aerie
