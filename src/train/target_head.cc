#include "train/target_head.h"

#include "model/hf_checkpoint.h"

namespace aerie {

TargetHead load_target_head(const std::string& dir, const TargetConfig& cfg) {
  HfCheckpoint ck(dir);
  const Shape shape = {cfg.vocab_size, cfg.hidden_size};
  TargetHead h;
  h.embed_tokens = ck.get(ck.decoder_prefix() + "embed_tokens.weight", shape);
  if (cfg.tie_word_embeddings) {
    h.lm_head = h.embed_tokens;
    h.lm_head_stored = ck.dtype_of(ck.decoder_prefix() + "embed_tokens.weight");
  } else {
    AERIE_CHECK(!ck.lm_head_name().empty(), ck.file_of("lm_head.weight")
                                                << ": no tensor \"lm_head.weight\" and tie_word_embeddings is false");
    h.lm_head = ck.get(ck.lm_head_name(), shape);
    h.lm_head_stored = ck.dtype_of(ck.lm_head_name());
  }
  // A NaN or an infinity in the target's embedding or lm_head (a broken weight) would end training with a
  // non-finite gradient norm whose advice (lower --lr) is beside the point: named here instead.
  auto check_finite = [&](const std::string& name, const Tensor& t) {
    const std::string bad = first_nonfinite(t);
    AERIE_CHECK(bad.empty(), ck.file_of(name) << ": the target's weight " << name << " is not finite at " << bad
                                              << " (row = token id): the model's weights are broken; convert or "
                                              << "download " << dir << " again");
  };
  check_finite(ck.decoder_prefix() + "embed_tokens.weight", h.embed_tokens);
  if (!cfg.tie_word_embeddings) check_finite(ck.lm_head_name(), h.lm_head);
  return h;
}

}  // namespace aerie
