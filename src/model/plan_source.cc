// PlanningSource (model/plan_source.h): the loader's checks over a tensor list, recording what each
// request would hold on tp rank 0.
#include "model/plan_source.h"

#include <algorithm>
#include <cctype>
#include <map>

#include "core/error.h"
#include "model/quant_weights.h"

namespace aerie {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The tensor list as a header-only checkpoint: each dtype as the loader reads it (a dtype it does not
// read is refused, as SafetensorsReader refuses such a file).
std::map<std::string, SafetensorsEntry> entries_of(const std::vector<TensorInfo>& tensors, const std::string& label) {
  std::map<std::string, SafetensorsEntry> out;
  for (const TensorInfo& t : tensors) {
    std::string d = t.dtype;
    std::transform(d.begin(), d.end(), d.begin(), [](unsigned char c) { return std::toupper(c); });
    AERIE_CHECK(safetensors_dtype_bytes(d) > 0, label << ": tensor '" << t.name << "' has unknown dtype '" << t.dtype << "'");
    SafetensorsEntry e;
    try {
      e.dtype = dtype_from_name(d);
    } catch (const Error&) {
      AERIE_THROW(label << ": tensor '" << t.name << "' has dtype " << t.dtype << ", not supported");
    }
    e.shape = t.shape;
    int64_t n = 1;
    for (int64_t s : t.shape) n *= s;
    e.nbytes = static_cast<uint64_t>(n) * dtype_size(e.dtype);
    out[t.name] = std::move(e);
  }
  return out;
}

// "model.layers.0.mlp.gate_up" for parts "...mlp.gate_proj" and "...mlp.up_proj"; one part: its name.
std::string linear_name(const std::vector<LinearTensor>& parts) {
  if (parts.size() == 1) return parts[0].name;
  const std::string& first = parts[0].name;
  std::string joined;
  for (const LinearTensor& p : parts) {
    std::string last = p.name.substr(p.name.rfind('.') + 1);
    if (last.size() > 5 && last.compare(last.size() - 5, 5, "_proj") == 0) last.resize(last.size() - 5);
    joined += (joined.empty() ? "" : "_") + last;
  }
  return first.substr(0, first.rfind('.') + 1) + joined;
}

}  // namespace

PlanningSource::PlanningSource(const std::vector<TensorInfo>& tensors, const std::string& label, int tp_size,
                               int plan_tp, const QuantConfig& quant)
    : WeightSource(0, tp_size, Device::CPU, DType::BF16), ck_(label, entries_of(tensors, label)), quant_(quant),
      plan_tp_(plan_tp), build_tp_(tp_size) {}

WeightCategory PlanningSource::category_of(ParamRole role) const {
  switch (role) {
    case ParamRole::Embedding: return WeightCategory::EmbedLmHead;
    case ParamRole::Norm: return WeightCategory::Norms;
    case ParamRole::Router:
    case ParamRole::RouterBias: return WeightCategory::Router;
    default: return context().block;
  }
}

int64_t PlanningSource::rank_elements(const Shape& stored, TpSplit split, const Shape& slice, bool& undivided) const {
  undivided = false;
  int64_t n = 1;
  if (plan_tp_ == build_tp_) {
    for (int64_t d : slice) n *= d;
    return n;
  }
  const int dim = split == TpSplit::Rows ? 0 : split == TpSplit::Cols && stored.size() >= 2 ? 1 : -1;
  for (size_t i = 0; i < stored.size(); ++i) {
    if (static_cast<int>(i) != dim) {
      n *= stored[i];
      continue;
    }
    undivided = stored[i] % plan_tp_ != 0;
    n *= ceil_div(stored[i], plan_tp_);
  }
  return n;
}

void PlanningSource::record(const std::string& name, TpSplit split, const Shape& slice, WeightCategory category,
                            int linear, bool dense_weight) {
  PlannedTensor t;
  t.name = name;
  t.category = category;
  t.layer = context().layer;
  t.shape = ck_.shape_of(name);
  t.element_bytes = static_cast<int64_t>(dtype_size(ck_.dtype_of(name)));
  t.split = split;
  t.rank_elements = rank_elements(t.shape, split, slice, t.undivided);
  t.linear = linear;
  t.dense_weight = dense_weight;
  if (t.layer >= 0) layers_found_.insert(t.layer);
  asked_.insert(name);
  tensors_.push_back(std::move(t));
}

void PlanningSource::note_missing(const std::string& message) { missing_.emplace_back(context().layer, message); }

Tensor PlanningSource::load(const std::string& name, const Shape& full, TpSplit split, ParamRole role) {
  Tensor t = Tensor::shape_only(slice_shape(full, split), dtype_of(role));
  load_into(name, full, split, role, t);
  return t;
}

void PlanningSource::load_into(const std::string& name, const Shape& full, TpSplit split, ParamRole role, Tensor dst) {
  try {
    const Tensor t = ck_.read_slice(name, full, split, tp_rank(), tp_size(), dtype_of(role));  // the loader's checks
    AERIE_CHECK(t.shape() == dst.shape() && t.dtype() == dst.dtype(),
                ck_.file_of(name) << ": tensor \"" << name << "\": slice " << shape_str(t.shape()) << " "
                                  << dtype_name(t.dtype()) << " for a parameter of " << shape_str(dst.shape()) << " "
                                  << dtype_name(dst.dtype()));
    record(name, split, t.shape(), category_of(role), -1, false);
  } catch (const Error& e) {
    if (ck_.contains(name)) throw;
    note_missing(e.what());  // the loader's "no tensor" message
  }
}

void PlanningSource::skip(const std::string& name, const Shape& full) {
  ck_.skip(name, full);
  skipped_.emplace_back(name, "tie_word_embeddings: embed_tokens is used");
}

int64_t PlanningSource::skip_prefix(const std::string& prefix, const std::string& why) {
  skipped_.emplace_back(prefix, why);
  return ck_.skip_prefix(prefix);
}

void PlanningSource::skip_linear(const std::vector<LinearTensor>& parts) {
  // Another rank's expert: in the checkpoint (every tensor of it), none of it on this rank.
  for (const LinearTensor& p : parts) {
    for (const char* suffix : {".weight", ".weight_scale_inv", ".weight_packed", ".weight_scale", ".weight_shape", ".bias"}) {
      const std::string name = p.name + suffix;
      if (!ck_.contains(name)) continue;
      record(name, TpSplit::None, {0}, context().block, -1, false);
      tensors_.back().rank_elements = 0;
      tensors_.back().undivided = false;
    }
    ck_.skip_prefix(p.name + ".");
  }
}

void PlanningSource::finish(const std::string& what) { ck_.check_all_read(what); }

std::pair<std::string, std::string> PlanningSource::skipped_as(const std::string& name) const {
  for (const auto& [prefix, why] : skipped_)
    if (name.compare(0, prefix.size(), prefix) == 0) return {prefix, why};
  return {"", ""};
}

Linear PlanningSource::missing_linear(const std::vector<LinearTensor>& parts, TpSplit split) {
  for (const LinearTensor& p : parts) {
    if (ck_.contains(p.name + ".weight") || ck_.contains(p.name + ".weight_packed")) continue;
    try {
      stored_format(ck_, quant_, p.name);
    } catch (const Error& e) {
      note_missing(e.what());  // the loader's "no tensor ... (nor ...weight_packed)"
    }
  }
  Linear L;
  for (const LinearTensor& p : parts) {
    const Shape s = slice_shape(p.full, split);
    L.out += s[0];
    L.in = s[1];
  }
  L.weight = Tensor::shape_only({L.out, L.in}, dtype());
  return L;
}

Linear PlanningSource::load_linear_parts(const std::vector<LinearTensor>& parts, TpSplit split) {
  AERIE_CHECK(!parts.empty(), "load_linear: no parts");
  for (const LinearTensor& t : parts) {
    AERIE_CHECK(t.full.size() == 2 && t.full[1] == parts[0].full[1],
                "load_linear: \"" << t.name << "\" " << shape_str(t.full) << " is not [out, " << parts[0].full[1] << "]");
    slice_shape(t.full, split);  // throws when tp does not divide the split dimension
  }
  for (const LinearTensor& t : parts)
    if (!ck_.contains(t.name + ".weight") && !ck_.contains(t.name + ".weight_packed")) return missing_linear(parts, split);
  const WeightFormat f = stored_format(ck_, quant_, parts);
  const int index = static_cast<int>(linears_.size());
  const WeightCategory category = context().block;
  Linear L;
  if (f == WeightFormat::Dense) {
    for (const LinearTensor& t : parts) {
      const std::string name = t.name + ".weight";
      const Tensor s = ck_.read_slice(name, t.full, split, tp_rank(), tp_size(), dtype());  // the loader's checks
      record(name, split, s.shape(), category, index, true);
      L.out += s.dim(0);
      L.in = s.dim(1);
    }
    L.weight = Tensor::shape_only({L.out, L.in}, dtype());
  } else {
    L = load_quantized_linear(ck_, f, parts, split, tp_rank(), tp_size(), Device::CPU);
    for (size_t i = 0; i < parts.size(); ++i) {
      const QuantPart& q = L.parts[i];
      const std::string& n = parts[i].name;
      const bool fp8 = f == WeightFormat::BlockFp8;
      record(n + (fp8 ? ".weight" : ".weight_packed"), split, q.weight.shape(), category, index, false);
      record(n + (fp8 ? ".weight_scale_inv" : ".weight_scale"), split, q.scale.shape(), category, index, false);
      // The [2] (N, K) of INT4: read on the host to check the shapes; counted whole on every rank, as the
      // plan has always counted it (8 bytes a Linear).
      if (!fp8) record(n + ".weight_shape", TpSplit::None, ck_.shape_of(n + ".weight_shape"), category, index, false);
    }
  }
  PlannedLinear p;
  p.name = linear_name(parts);
  p.category = category;
  p.layer = context().layer;
  p.format = f;
  p.out = L.out;
  p.in = L.in;
  if (plan_tp_ != build_tp_) {  // rank 0's share at plan_tp_, rounded up
    p.out = 0;
    for (const LinearTensor& t : parts) p.out += split == TpSplit::Rows ? ceil_div(t.full[0], plan_tp_) : t.full[0];
    p.in = split == TpSplit::Cols ? ceil_div(parts[0].full[1], plan_tp_) : parts[0].full[1];
  }
  linears_.push_back(std::move(p));
  return L;
}

}  // namespace aerie
