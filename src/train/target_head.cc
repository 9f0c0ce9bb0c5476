#include "train/target_head.h"

#include <cstring>

#include "kernels/loss.h"
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

namespace {

// The rows of `parts` (host tensors of one dtype and width) stacked into one host tensor.
Tensor stack_rows(const std::vector<const Tensor*>& parts) {
  int64_t rows = 0;
  for (const Tensor* t : parts) rows += t->dim(0);
  const Tensor& first = *parts.front();
  Tensor out = Tensor::empty({rows, first.dim(1)}, first.dtype());
  const size_t row_bytes = static_cast<size_t>(first.dim(1)) * dtype_size(first.dtype());
  char* dst = static_cast<char*>(out.raw());
  for (const Tensor* t : parts) {
    AERIE_CHECK(t->dtype() == first.dtype() && t->dim(1) == first.dim(1),
                "make_step_samples: a sample's hidden states are " << dtype_name(t->dtype()) << " " << shape_str(t->shape())
                                                                   << ", another's " << dtype_name(first.dtype()) << " "
                                                                   << shape_str(first.shape()));
    std::memcpy(dst, t->raw(), row_bytes * static_cast<size_t>(t->dim(0)));
    dst += row_bytes * static_cast<size_t>(t->dim(0));
  }
  return out;
}

}  // namespace

std::vector<TTTSample> make_step_samples(std::vector<HiddenSample> samples, const Tensor& lm_head,
                                         const std::vector<int64_t>& selected, Device device) {
  std::vector<TTTSample> out;
  out.reserve(samples.size());
  const Device head_dev = lm_head.device();
  if (head_dev == Device::CPU || samples.size() < 2) {
    for (HiddenSample& hs : samples) {
      out.push_back(make_ttt_sample(std::move(hs.ids), std::move(hs.loss_mask), std::move(hs.aux_hidden),
                                    hs.final_hidden, lm_head, selected));
      if (device != Device::CPU) out.back().aux_hidden = out.back().aux_hidden.to_device(device);
    }
    return out;
  }
  std::vector<const Tensor*> fins, auxes;
  std::vector<int64_t> start{0};
  for (const HiddenSample& hs : samples) {
    AERIE_CHECK(hs.final_hidden.device() == Device::CPU && hs.aux_hidden.device() == Device::CPU,
                "make_step_samples: the samples' hidden states must be on the host");
    AERIE_CHECK(static_cast<int64_t>(hs.ids.size()) == hs.final_hidden.dim(0) &&
                    hs.aux_hidden.dim(0) == hs.final_hidden.dim(0) && hs.loss_mask.size() == hs.ids.size(),
                "make_step_samples: a sample of " << hs.ids.size() << " ids has " << hs.loss_mask.size()
                                                  << " mask entries, final_hidden " << shape_str(hs.final_hidden.shape())
                                                  << " and aux_hidden " << shape_str(hs.aux_hidden.shape()));
    fins.push_back(&hs.final_hidden);
    auxes.push_back(&hs.aux_hidden);
    start.push_back(start.back() + hs.final_hidden.dim(0));
  }
  const int64_t rows = start.back(), V = lm_head.dim(0), K = static_cast<int64_t>(selected.size());
  lm_head.check_shape({V, fins.front()->dim(1)}, "make_step_samples: the target's lm_head");
  const Tensor z = stack_rows(fins).to_device(head_dev);
  Tensor probs = Tensor::empty({rows, K}, DType::F32, head_dev);
  Tensor argmax = Tensor::empty({rows}, DType::I64, head_dev);
  target_distribution(z, lm_head, Tensor::from_vector(selected, {K}).to_device(head_dev), probs, argmax, 512);
  const Tensor am = argmax.to_device(Device::CPU);  // the step's one wait for its targets
  Tensor aux = stack_rows(auxes);
  if (device != Device::CPU) aux = aux.to_device(device);
  for (size_t j = 0; j < samples.size(); ++j) {
    TTTSample t;
    t.ids = std::move(samples[j].ids);
    t.loss_mask = std::move(samples[j].loss_mask);
    t.aux_hidden = aux.slice(start[j], start[j + 1]);
    t.target_probs = probs.slice(start[j], start[j + 1]);
    t.target_argmax.assign(am.data<int64_t>() + start[j], am.data<int64_t>() + start[j + 1]);
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace aerie
