#include "data/vocab.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "core/version.h"
#include "io/h5.h"
#include "io/safetensors.h"

namespace aerie {

namespace {
constexpr const char* kFormat = "aerie.draft_vocab";
constexpr const char* kVersion = "1";
}  // namespace

std::vector<int64_t> DraftVocab::selected() const {
  std::vector<int64_t> s(d2t.size());
  for (size_t i = 0; i < d2t.size(); ++i) s[i] = static_cast<int64_t>(i) + d2t[i];
  return s;
}

DraftVocab spread_draft_vocab(int64_t V, int64_t K) {
  AERIE_CHECK(K > 0 && K <= V, "spread_draft_vocab: draft vocabulary " << K << " of " << V << " ids");
  DraftVocab vocab;
  vocab.t2d.assign(static_cast<size_t>(V), 0);
  for (int64_t i = 0; i < K; ++i) {
    const int64_t id = i * V / K;
    vocab.d2t.push_back(id - i);
    vocab.t2d[static_cast<size_t>(id)] = 1;
  }
  return vocab;
}

DraftVocab build_draft_vocab(const std::vector<int64_t>& counts, int64_t K) {
  const int64_t V = static_cast<int64_t>(counts.size());
  AERIE_CHECK(V > 0, "draft vocab: empty token counts (vocabulary size 0)");
  AERIE_CHECK(K > 0, "draft vocab: draft_vocab_size must be positive, got " << K);
  for (int64_t j = 0; j < V; ++j)
    AERIE_CHECK(counts[static_cast<size_t>(j)] >= 0, "draft vocab: negative count " << counts[static_cast<size_t>(j)]
                                                                                    << " for token " << j);
  K = std::min(K, V);
  // Ids ordered by count descending, ties by id ascending (eagle3.md 2). Ids that never occur (count 0)
  // sort after every occurring id and among themselves by id: exactly "fill with the smallest ids not
  // yet selected" (SpecForge #76).
  std::vector<int64_t> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](int64_t a, int64_t b) {
    int64_t ca = counts[static_cast<size_t>(a)], cb = counts[static_cast<size_t>(b)];
    return ca != cb ? ca > cb : a < b;
  });
  std::vector<int64_t> sel(order.begin(), order.begin() + K);
  std::sort(sel.begin(), sel.end());
  DraftVocab v;
  v.d2t.resize(static_cast<size_t>(K));
  v.t2d.assign(static_cast<size_t>(V), 0);
  for (int64_t i = 0; i < K; ++i) {
    v.d2t[static_cast<size_t>(i)] = sel[static_cast<size_t>(i)] - i;
    v.t2d[static_cast<size_t>(sel[static_cast<size_t>(i)])] = 1;
  }
  return v;
}

void save_draft_vocab(const std::string& path, const DraftVocab& vocab, const std::vector<int64_t>& counts,
                      const std::string& tmp) {
  const int64_t K = vocab.draft_vocab_size(), V = vocab.vocab_size();
  AERIE_CHECK(K > 0 && V > 0, "draft vocab " << path << ": empty mapping (K " << K << ", V " << V << ")");
  AERIE_CHECK(static_cast<int64_t>(counts.size()) == V, "draft vocab " << path << ": " << counts.size()
                                                                       << " token counts for vocabulary size " << V);
  SafetensorsFile f;
  f.tensors["d2t"] = Tensor::from_vector(vocab.d2t, {K});
  f.tensors["t2d"] = Tensor::from_vector(vocab.t2d, {V});
  f.tensors["token_counts"] = Tensor::from_vector(counts, {V});
  f.metadata["format"] = kFormat;
  f.metadata["format_version"] = kVersion;
  f.metadata["aerie_version"] = aerie_version_string();
  f.metadata["draft_vocab_size"] = std::to_string(K);
  f.metadata["vocab_size"] = std::to_string(V);
  save_safetensors(path, f, {"t2d"}, tmp);
}

DraftVocab load_draft_vocab(const std::string& path) {
  SafetensorsFile f = load_safetensors(path);
  auto meta = [&](const std::string& key) {
    auto it = f.metadata.find(key);
    return it == f.metadata.end() ? std::string("<missing>") : it->second;
  };
  AERIE_CHECK(meta("format") == kFormat, "draft vocab " << path << ": format '" << meta("format") << "', expected '"
                                                        << kFormat << "'");
  AERIE_CHECK(meta("format_version") == kVersion, "draft vocab " << path << ": format_version '"
                                                                 << meta("format_version") << "', this build reads "
                                                                 << kVersion);
  for (const char* name : {"d2t", "t2d"})
    AERIE_CHECK(f.tensors.count(name), "draft vocab " << path << ": no tensor '" << name << "'");
  const Tensor& d2t = f.tensors["d2t"];
  const Tensor& t2d = f.tensors["t2d"];
  AERIE_CHECK(d2t.dtype() == DType::I64 && d2t.ndim() == 1,
              "draft vocab " << path << ": d2t is " << dtype_name(d2t.dtype()) << " " << shape_str(d2t.shape())
                             << ", expected I64 [K]");
  AERIE_CHECK(t2d.dtype() == DType::U8 && t2d.ndim() == 1,
              "draft vocab " << path << ": t2d is " << dtype_name(t2d.dtype()) << " " << shape_str(t2d.shape())
                             << ", expected BOOL [V]");
  DraftVocab v;
  v.d2t.assign(d2t.data<int64_t>(), d2t.data<int64_t>() + d2t.numel());
  v.t2d.assign(t2d.data<uint8_t>(), t2d.data<uint8_t>() + t2d.numel());
  const int64_t K = v.draft_vocab_size(), V = v.vocab_size();
  AERIE_CHECK(K > 0 && K <= V, "draft vocab " << path << ": K " << K << " and V " << V << " (need 0 < K <= V)");
  // The selected ids must be strictly ascending, inside [0, V), and exactly the ids flagged in t2d.
  int64_t prev = -1, flagged = 0;
  for (int64_t i = 0; i < K; ++i) {
    int64_t s = i + v.d2t[static_cast<size_t>(i)];
    AERIE_CHECK(s > prev && s < V, "draft vocab " << path << ": d2t[" << i << "] = " << v.d2t[static_cast<size_t>(i)]
                                                  << " gives target id " << s
                                                  << " (ids must ascend and stay below V = " << V << ")");
    AERIE_CHECK(v.t2d[static_cast<size_t>(s)] == 1, "draft vocab " << path << ": target id " << s
                                                                   << " is in d2t but t2d[" << s << "] = 0");
    prev = s;
  }
  for (uint8_t b : v.t2d) {
    AERIE_CHECK(b <= 1, "draft vocab " << path << ": t2d holds a value other than 0/1");
    flagged += b;
  }
  AERIE_CHECK(flagged == K, "draft vocab " << path << ": t2d flags " << flagged << " ids, d2t has " << K);
  if (f.metadata.count("draft_vocab_size"))
    AERIE_CHECK(meta("draft_vocab_size") == std::to_string(K),
                "draft vocab " << path << ": metadata draft_vocab_size " << meta("draft_vocab_size") << ", d2t has " << K);
  if (f.metadata.count("vocab_size"))
    AERIE_CHECK(meta("vocab_size") == std::to_string(V),
                "draft vocab " << path << ": metadata vocab_size " << meta("vocab_size") << ", t2d has " << V);
  return v;
}

std::vector<int64_t> count_loss_tokens(const std::string& prepared_path, int64_t V) {
  AERIE_CHECK(V > 0, "count_loss_tokens: vocabulary size must be positive, got " << V);
  h5::File f = h5::File::open(prepared_path);
  AERIE_CHECK(f.has_attr("format") && f.string_attr("format") == "aerie.prepared",
              "prepared file " << prepared_path << ": not an aerie.prepared file (attribute format "
                               << (f.has_attr("format") ? "'" : "")
                               << (f.has_attr("format") ? f.string_attr("format") : std::string("missing"))
                               << (f.has_attr("format") ? "'" : "") << ")");
  int64_t version = f.int_attr("format_version");
  AERIE_CHECK(version == 1, "prepared file " << prepared_path << ": format_version " << version << ", this build reads 1");
  h5::Dataset ids = f.open_dataset("input_ids");
  h5::Dataset mask = f.open_dataset("loss_mask");
  const int64_t n = ids.rows();
  AERIE_CHECK(mask.rows() == n, "prepared file " << prepared_path << ": input_ids has " << n << " tokens, loss_mask "
                                                 << mask.rows());
  std::vector<int64_t> counts(static_cast<size_t>(V), 0);
  constexpr int64_t kChunk = int64_t{1} << 22;  // tokens per read
  Tensor tid = Tensor::empty({std::min(n, kChunk)}, DType::I32), tm = Tensor::empty({std::min(n, kChunk)}, DType::U8);
  for (int64_t b = 0; b < n; b += kChunk) {
    int64_t e = std::min(n, b + kChunk);
    Tensor ci = tid.slice(0, e - b), cm = tm.slice(0, e - b);
    ids.read_rows_into(b, ci);
    mask.read_rows_into(b, cm);
    const int32_t* pi = ci.data<int32_t>();
    const uint8_t* pm = cm.data<uint8_t>();
    for (int64_t t = 0; t < e - b; ++t) {
      AERIE_CHECK(pi[t] >= 0 && pi[t] < V, "prepared file " << prepared_path << ": token " << b + t << " has id "
                                                            << pi[t] << " outside the vocabulary [0, " << V << ")");
      if (pm[t]) ++counts[static_cast<size_t>(pi[t])];
    }
  }
  return counts;
}

}  // namespace aerie
