// Shared by the eval tests (eval_test.cc, eval_cuda_test.cc): drafts for the stories260K target and a
// fixture that loads the target (CPU, F32) and its tokenizer.
#pragma once
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "train/eval.h"
#include "train/export.h"

namespace aerie::testing {

/// A draft whose guesses are often right: the untrained draft with the vocabulary = all V ids (K = V).
inline LoadedDraft full_vocab_draft(const TargetModel& model, uint64_t seed) {
  LoadedDraft d;
  const int64_t V = model.config().vocab_size;
  d.vocab.t2d.assign(V, 1);
  d.vocab.d2t.assign(V, 0);
  d.cfg = DraftConfig::from_target(model.config(), V, default_aux_layers(model.config().num_hidden_layers));
  d.weights = init_draft_weights(d.cfg, model.lm_head(), d.vocab.selected(), seed);
  return d;
}

/// The stories260K target on the CPU in F32 (model_) and its tokenizer; skips without the converted model.
class StoriesTargetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    AERIE_REQUIRE_MODEL();
    world_ = MpiCommunicator::world();
    self_ = world_->split(world_->rank(), 0);
    model_ = std::make_unique<TargetModel>(model_dir(), *self_);
    tok_ = Tokenizer::load(model_dir());
  }
  /// BOS + the ids of `text`.
  std::vector<int32_t> prompt(const std::string& text) {
    std::vector<int32_t> p{tok_->bos_id()};
    for (int32_t id : tok_->encode(text)) p.push_back(id);
    return p;
  }
  /// full_vocab_draft(seed) exported to scratch_dir(name)/export, and eval options on it: 4 tinystories
  /// prompts, 32 new tokens, chains of 4, 3 TTT steps, no output file.
  EvalOptions small_eval(const std::string& name, uint64_t seed) {
    const std::string dir = scratch_dir(name);
    LoadedDraft d = full_vocab_draft(*model_, seed);
    write_export(dir + "/export", d.cfg, d.weights, d.vocab, model_->config());
    EvalOptions o;
    o.model_dir = model_dir();
    o.draft_path = dir + "/export";
    o.prompts_path = data_dir() + "/tinystories/tinystories_val.txt";
    o.output_path = "";
    o.num_prompts = 4;
    o.max_new_tokens = 32;
    o.num_draft_tokens = 4;
    o.ttt_steps = 3;
    return o;
  }
  std::unique_ptr<MpiCommunicator> world_, self_;
  std::unique_ptr<TargetModel> model_;
  std::unique_ptr<Tokenizer> tok_;
};

}  // namespace aerie::testing
