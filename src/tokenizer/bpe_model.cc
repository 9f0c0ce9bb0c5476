#include "tokenizer/bpe_model.h"

#include <queue>
#include <utility>

#include "core/error.h"

namespace aerie::tok {

BpeModel::BpeModel(const nlohmann::json& model, const std::string& file) {
  AERIE_CHECK(model.is_object() && model.contains("vocab") && model["vocab"].is_object(),
              file << ": model.vocab missing or not an object");
  for (const auto& [piece, idj] : model["vocab"].items()) {
    AERIE_CHECK(idj.is_number_integer() && idj.get<int64_t>() >= 0 && idj.get<int64_t>() < (1 << 30),
                file << ": vocab id of '" << piece << "' is not a valid id");
    const int32_t id = idj.get<int32_t>();
    vocab_[piece] = id;
    if (static_cast<size_t>(id) >= pieces_.size()) pieces_.resize(id + 1);
    pieces_[id] = piece;
  }
  if (!model.contains("merges") || model["merges"].is_null()) return;
  AERIE_CHECK(model["merges"].is_array(), file << ": model.merges is not an array");
  int32_t rank = 0;
  for (const auto& m : model["merges"]) {
    std::string a, b;
    if (m.is_string()) {  // "a b" (tokenizers < 0.20)
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ');
      AERIE_CHECK(sp != std::string::npos && sp > 0 && sp + 1 < s.size(),
                  file << ": merge " << rank << " '" << s << "' is not 'left right'");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else {
      AERIE_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(),
                  file << ": merge " << rank << " is not a pair of strings");
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    }
    const int32_t ia = id(a), ib = id(b), ic = id(a + b);
    AERIE_CHECK(ia >= 0 && ib >= 0, file << ": merge " << rank << " ('" << a << "', '" << b
                                         << "') has a part outside the vocabulary");
    AERIE_CHECK(ic >= 0, file << ": merge " << rank << " result '" << a << b << "' is not in the vocabulary");
    const uint64_t key = (static_cast<uint64_t>(ia) << 32) | static_cast<uint32_t>(ib);
    merges_.emplace(key, std::make_pair(rank, ic));  // first (lowest) rank wins on duplicates
    ++rank;
  }
}

BpeModel::BpeModel(std::vector<std::string> pieces, const std::vector<Merge>& merges, const std::string& file)
    : pieces_(std::move(pieces)) {
  vocab_.reserve(pieces_.size());
  for (size_t id = 0; id < pieces_.size(); ++id) {
    if (pieces_[id].empty()) continue;
    const bool fresh = vocab_.emplace(pieces_[id], static_cast<int32_t>(id)).second;
    AERIE_CHECK(fresh, file << ": token " << id << " has the same bytes as token " << vocab_.at(pieces_[id]));
  }
  merges_.reserve(merges.size());
  const auto n = static_cast<int64_t>(pieces_.size());
  for (const Merge& m : merges) {
    for (int32_t x : {m.left, m.right, m.merged})
      AERIE_CHECK(x >= 0 && x < n && !pieces_[x].empty(), file << ": merge of rank " << m.rank << " names id " << x
                                                                << ", which is not a token");
    const uint64_t key = (static_cast<uint64_t>(m.left) << 32) | static_cast<uint32_t>(m.right);
    auto [it, fresh] = merges_.emplace(key, std::make_pair(m.rank, m.merged));
    if (!fresh && m.rank < it->second.first) it->second = {m.rank, m.merged};  // lowest rank wins
  }
}

const std::string& BpeModel::piece(int32_t id) const {
  static const std::string empty;
  if (id < 0 || static_cast<size_t>(id) >= pieces_.size()) return empty;
  return pieces_[id];
}

void BpeModel::merge(std::vector<int32_t>& ids, std::vector<int32_t>& out, std::vector<uint32_t>* lens,
                     std::vector<uint32_t>* out_lens) const {
  const int n = static_cast<int>(ids.size());
  if (n <= 1) {
    out.insert(out.end(), ids.begin(), ids.end());
    if (lens) out_lens->insert(out_lens->end(), lens->begin(), lens->end());
    return;
  }
  // Doubly linked list of symbols; a min-heap of candidate merges keyed by (rank, position).
  std::vector<int> prev(n), next(n);
  for (int i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Cand {
    int32_t rank;
    int pos;  // index of the left symbol
    int32_t merged;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](int i) {
    const int j = next[i];
    if (i < 0 || j < 0) return;
    const uint64_t key = (static_cast<uint64_t>(ids[i]) << 32) | static_cast<uint32_t>(ids[j]);
    auto it = merges_.find(key);
    if (it != merges_.end()) heap.push({it->second.first, i, it->second.second});
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  std::vector<bool> dead(n, false);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    const int i = c.pos;
    const int j = next[i];
    if (dead[i] || j < 0) continue;
    // Stale candidate? Same test as tokenizers' word.rs: the pair now at `i` must merge to the same id.
    const uint64_t key = (static_cast<uint64_t>(ids[i]) << 32) | static_cast<uint32_t>(ids[j]);
    auto it = merges_.find(key);
    if (it == merges_.end() || it->second.second != c.merged) continue;
    ids[i] = c.merged;
    if (lens) (*lens)[i] += (*lens)[j];
    dead[j] = true;
    next[i] = next[j];
    if (next[j] >= 0) prev[next[j]] = i;
    if (prev[i] >= 0) push(prev[i]);
    push(i);
  }
  for (int i = 0; i >= 0; i = next[i]) {
    out.push_back(ids[i]);
    if (lens) out_lens->push_back((*lens)[i]);
  }
}

void append_utf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

size_t decode_utf8(std::string_view s, size_t i, uint32_t& cp) {
  const auto c = static_cast<unsigned char>(s[i]);
  size_t len;
  if (c < 0x80) {
    cp = c;
    return 1;
  }
  if ((c >> 5) == 0x6) { len = 2; cp = c & 0x1F; }
  else if ((c >> 4) == 0xE) { len = 3; cp = c & 0x0F; }
  else if ((c >> 3) == 0x1E) { len = 4; cp = c & 0x07; }
  else return 0;
  if (i + len > s.size()) return 0;
  for (size_t k = 1; k < len; ++k) {
    const auto d = static_cast<unsigned char>(s[i + k]);
    if ((d >> 6) != 0x2) return 0;
    cp = (cp << 6) | (d & 0x3F);
  }
  // Reject overlong forms, surrogates and code points above U+10FFFF.
  if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000)) return 0;
  if ((cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) return 0;
  return len;
}

}  // namespace aerie::tok
