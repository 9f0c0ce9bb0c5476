// HfCheckpoint: the safetensors shards of a Hugging Face directory, read one tensor (slice) at a time.
#include "model/hf_checkpoint.h"

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"

namespace aerie {

namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

HfCheckpoint::HfCheckpoint(const std::string& dir) : dir_(dir) {
  const fs::path single = fs::path(dir) / "model.safetensors";
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(single)) {
    files_.push_back(std::make_unique<SafetensorsReader>(single.string()));
    for (const auto& [name, e] : files_.back()->entries()) where_[name] = files_.back().get();
  } else if (fs::exists(index)) {
    index_path_ = index.string();
    std::ifstream in(index);
    AERIE_CHECK(in, "cannot open " << index_path_);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      AERIE_THROW(index_path_ << ": bad JSON: " << e.what());
    }
    AERIE_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
                index_path_ << ": no weight_map object");
    std::map<std::string, std::vector<std::string>> names_of;  // shard -> tensors the index puts there
    for (const auto& [name, file] : j["weight_map"].items()) {
      AERIE_CHECK(file.is_string(), index_path_ << ": weight_map[\"" << name << "\"] is not a file name");
      names_of[file.get<std::string>()].push_back(name);
    }
    for (const auto& [file, names] : names_of) {
      const fs::path p = fs::path(dir) / file;
      AERIE_CHECK(fs::exists(p), index_path_ << " names shard " << file << " (for \"" << names.front()
                                             << "\"), which does not exist in " << dir);
      files_.push_back(std::make_unique<SafetensorsReader>(p.string()));
      const SafetensorsReader* r = files_.back().get();
      for (const auto& n : names)
        AERIE_CHECK(r->contains(n), index_path_ << " puts tensor \"" << n << "\" in " << r->path()
                                                << ", which has no such tensor");
      for (const auto& [name, e] : r->entries()) {
        auto it = where_.find(name);
        AERIE_CHECK(it == where_.end(), "tensor \"" << name << "\" appears in both " << it->second->path()
                                                    << " and " << r->path());
        where_[name] = r;
      }
    }
  } else {
    AERIE_THROW("no model.safetensors or model.safetensors.index.json in " << dir);
  }
  find_decoder();
}

HfCheckpoint::HfCheckpoint(const std::string& label, std::map<std::string, SafetensorsEntry> entries) : dir_(label) {
  files_.push_back(std::make_unique<SafetensorsReader>(SafetensorsReader::listing(label, std::move(entries))));
  for (const auto& [name, e] : files_.back()->entries()) where_[name] = files_.back().get();
  find_decoder();
}

void HfCheckpoint::find_decoder() {
  for (const char* p : {"model.", "model.language_model.", "language_model.model."}) {
    if (contains(std::string(p) + "embed_tokens.weight")) {
      prefix_ = p;
      break;
    }
  }
  AERIE_CHECK(!prefix_.empty(), file_of("model.embed_tokens.weight")
                                    << ": no tensor \"model.embed_tokens.weight\" (nor under a multimodal "
                                       "wrapper's model.language_model. or language_model.model.)");
  for (const char* n : {"lm_head.weight", "language_model.lm_head.weight"}) {
    if (contains(n)) {
      lm_head_ = n;
      break;
    }
  }
  if (prefix_ != "model." && files_.front()->has_data())
    AERIE_LOG(info) << dir_ << ": language model found under \"" << prefix_ << "\"";
}

std::string HfCheckpoint::file_of(const std::string& name) const {
  auto it = where_.find(name);
  if (it != where_.end()) return it->second->path();
  if (!index_path_.empty()) return index_path_ + " (and its shards)";
  return files_.empty() ? dir_ : files_.front()->path();
}

Shape HfCheckpoint::shape_of(const std::string& name) const {
  auto it = where_.find(name);
  AERIE_CHECK(it != where_.end(), file_of(name) << ": no tensor \"" << name << "\"");
  return it->second->entries().at(name).shape;
}

DType HfCheckpoint::dtype_of(const std::string& name) const {
  auto it = where_.find(name);
  AERIE_CHECK(it != where_.end(), file_of(name) << ": no tensor \"" << name << "\"");
  return it->second->entries().at(name).dtype;
}

Tensor HfCheckpoint::read_raw(const std::string& name, int dim, int64_t begin, int64_t end) {
  auto it = where_.find(name);
  AERIE_CHECK(it != where_.end(), file_of(name) << ": no tensor \"" << name << "\"");
  const SafetensorsReader& r = *it->second;
  const Shape& shape = r.entries().at(name).shape;
  if (dim >= 0)
    AERIE_CHECK(static_cast<int64_t>(shape.size()) > dim && 0 <= begin && begin <= end && end <= shape[dim],
                r.path() << ": tensor \"" << name << "\" " << shape_str(shape) << ": no range [" << begin << ", "
                         << end << ") of dim " << dim);
  read_.insert(name);
  if (!r.has_data()) {
    Shape s = shape;
    if (dim >= 0) s[dim] = end - begin;
    return Tensor::shape_only(s, r.entries().at(name).dtype);
  }
  return dim < 0 ? r.read(name) : dim == 0 ? r.read_rows(name, begin, end) : r.read_cols(name, begin, end);
}

const SafetensorsReader& HfCheckpoint::checked(const std::string& name, const Shape& shape) const {
  auto it = where_.find(name);
  AERIE_CHECK(it != where_.end(), file_of(name) << ": no tensor \"" << name << "\"");
  const SafetensorsReader& r = *it->second;
  const SafetensorsEntry& e = r.entries().at(name);
  bool ok = e.shape.size() == shape.size();
  for (size_t i = 0; ok && i < shape.size(); ++i) ok = e.shape[i] == shape[i];
  AERIE_CHECK(ok, r.path() << ": tensor \"" << name << "\": expected shape " << shape_str(shape) << ", got "
                           << shape_str(e.shape));
  AERIE_CHECK(e.dtype == DType::F32 || e.dtype == DType::BF16 || e.dtype == DType::F16,
              r.path() << ": tensor \"" << name << "\" is " << dtype_name(e.dtype) << ", not F32, BF16 or F16");
  return r;
}

Tensor HfCheckpoint::get(const std::string& name, const Shape& shape, int64_t begin, int64_t end) {
  const SafetensorsReader& r = checked(name, shape);
  read_.insert(name);
  if (!r.has_data()) {
    Shape s = shape;
    if (end >= 0 && !s.empty()) s[0] = end - begin;
    return Tensor::shape_only(s, DType::F32);
  }
  Tensor t = end >= 0 ? r.read_rows(name, begin, end) : r.read(name);
  return t.dtype() == DType::F32 ? t : t.to(DType::F32);
}

Tensor HfCheckpoint::read_slice(const std::string& name, const Shape& shape, TpSplit split, int tp_rank,
                                int tp_size, DType dtype) {
  const SafetensorsReader& r = checked(name, shape);
  AERIE_CHECK(dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16,
              "HfCheckpoint::read_slice: target dtype " << dtype_name(dtype) << " is not F32, BF16 or F16");
  const int dim = split == TpSplit::Rows ? 0 : split == TpSplit::Cols ? 1 : -1;
  Tensor t;
  if (dim < 0 || tp_size == 1) {
    t = r.has_data() ? r.read(name) : Tensor::shape_only(shape, dtype);
  } else {
    AERIE_CHECK(static_cast<int64_t>(shape.size()) > dim && shape[dim] % tp_size == 0,
                r.path() << ": tensor \"" << name << "\" " << shape_str(shape) << ": dim " << dim
                         << " does not split over tp " << tp_size);
    const int64_t part = shape[dim] / tp_size, b = tp_rank * part;
    Shape s = shape;
    s[dim] = part;
    t = !r.has_data() ? Tensor::shape_only(s, dtype)
        : dim == 0    ? r.read_rows(name, b, b + part)
                      : r.read_cols(name, b, b + part);
  }
  read_.insert(name);
  if (t.is_shape_only()) return Tensor::shape_only(t.shape(), dtype);
  return t.dtype() == dtype ? t : t.to(dtype);
}

void HfCheckpoint::skip(const std::string& name, const Shape& shape) {
  checked(name, shape);
  read_.insert(name);
}

int64_t HfCheckpoint::skip_prefix(const std::string& prefix) {
  int64_t n = 0;
  for (auto it = where_.lower_bound(prefix); it != where_.end() && it->first.compare(0, prefix.size(), prefix) == 0;
       ++it, ++n)
    read_.insert(it->first);
  return n;
}

void HfCheckpoint::check_all_read(const std::string& what) const {
  for (const auto& name : unread_language_model_tensors())
    AERIE_THROW(file_of(name) << ": tensor \"" << name << "\" " << shape_str(shape_of(name)) << " is not part of "
                              << what << " (another architecture, or a config field missing?)");
}

std::map<std::string, int64_t> HfCheckpoint::other_tensors() const {
  std::map<std::string, int64_t> out;
  for (const auto& [name, r] : where_) {
    const bool lm = prefix_ == "model." || name.compare(0, prefix_.size(), prefix_) == 0 ||
                    name == "lm_head.weight" || name == "language_model.lm_head.weight";
    if (!lm) ++out[name.substr(0, name.find('.'))];
  }
  return out;
}

std::vector<std::string> HfCheckpoint::unread_language_model_tensors() const {
  std::vector<std::string> out;
  for (const auto& [name, r] : where_) {
    if (read_.count(name) || ends_with(name, "rotary_emb.inv_freq")) continue;
    const bool lm = name.compare(0, prefix_.size(), prefix_) == 0 || name == "lm_head.weight" ||
                    name == "language_model.lm_head.weight" || prefix_ == "model.";
    if (lm) out.push_back(name);
  }
  return out;
}

}  // namespace aerie
