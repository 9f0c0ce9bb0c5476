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
  } else {
    AERIE_CHECK(!ck.lm_head_name().empty(), ck.file_of("lm_head.weight")
                                                << ": no tensor \"lm_head.weight\" and tie_word_embeddings is false");
    h.lm_head = ck.get(ck.lm_head_name(), shape);
  }
  return h;
}

}  // namespace aerie
