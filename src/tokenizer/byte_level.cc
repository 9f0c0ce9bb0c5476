#include "tokenizer/byte_level.h"

#include <algorithm>
#include <utility>

#include "core/error.h"

namespace aerie::tok {

namespace {

// Appends `b` with every maximal invalid UTF-8 subsequence replaced by U+FFFD (Rust's
// String::from_utf8_lossy, the Unicode "maximal subpart" practice).
void append_lossy(const std::string& b, std::string& out) {
  for (size_t i = 0; i < b.size();) {
    const auto c = static_cast<unsigned char>(b[i]);
    if (c < 0x80) {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    size_t need = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // range of the second byte
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c == 0xE0) { need = 2; lo = 0xA0; }
    else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) need = 2;
    else if (c == 0xED) { need = 2; hi = 0x9F; }
    else if (c == 0xF0) { need = 3; lo = 0x90; }
    else if (c >= 0xF1 && c <= 0xF3) need = 3;
    else if (c == 0xF4) { need = 3; hi = 0x8F; }
    size_t k = 1;
    for (; need > 0 && k <= need && i + k < b.size(); ++k) {
      const auto d = static_cast<unsigned char>(b[i + k]);
      if (d < (k == 1 ? lo : 0x80) || d > (k == 1 ? hi : 0xBF)) break;
    }
    if (need > 0 && k == need + 1) {
      out.append(b, i, k);
    } else {
      out += "\xEF\xBF\xBD";
    }
    i += k;
  }
}

// Decodes the UTF-8 `s` into code points; false if it is not valid UTF-8.
bool code_points(const std::string& s, std::vector<uint32_t>& cps) {
  cps.clear();
  for (size_t i = 0; i < s.size();) {
    const size_t len = utf8_valid_len(s, i);
    if (len == 0) return false;
    uint32_t cp = static_cast<unsigned char>(s[i]);
    if (len > 1) {
      cp &= (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
      for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    }
    cps.push_back(cp);
    i += len;
  }
  return true;
}

}  // namespace

std::array<uint32_t, 256> gpt2_byte_to_unicode() {
  std::array<uint32_t, 256> m{};
  uint32_t n = 0;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    m[b] = printable ? b : 256 + n++;
  }
  return m;
}

ByteLevelBpe::ByteLevelBpe(const nlohmann::json& tj, const std::string& file)
    : ByteLevelBpe(BpeModel(tj.at("model"), file), tj, file) {}

ByteLevelBpe::ByteLevelBpe(BpeModel model, const nlohmann::json& tj, const std::string& file)
    : model_(std::move(model)),
      added_(tj.value("added_tokens", nlohmann::json()), file),
      normalizer_(tj.value("normalizer", nlohmann::json()), file),
      pre_(tj.value("pre_tokenizer", nlohmann::json()), file) {
  const auto& m = tj["model"];
  AERIE_CHECK(pre_.has_byte_level(), file << ": byte-level BPE needs a ByteLevel pre_tokenizer");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    AERIE_CHECK(!m.contains(key) || m[key].is_null() || m[key] == "",
                file << ": BPE " << key << " is not supported");
  AERIE_CHECK(!m.value("byte_fallback", false), file << ": byte_fallback with a ByteLevel pre_tokenizer is not supported");
  AERIE_CHECK(!m.contains("dropout") || m["dropout"].is_null(), file << ": BPE dropout is not supported");
  ignore_merges_ = m.value("ignore_merges", false);
  const auto map = gpt2_byte_to_unicode();
  char_byte_.assign(512, -1);
  int known_bytes = 0;
  for (int b = 0; b < 256; ++b) {
    append_utf8(map[b], byte_char_[b]);
    // -1: a byte the vocabulary lacks (SmolLM2 has no piece for 21 bytes that never occur in UTF-8
    // text, e.g. 0xC0, 0xF5-0xFF). tokenizers' BPE (no unk_token) drops such a byte; so does encode().
    byte_id_[b] = model_.id(byte_char_[b]);
    if (byte_id_[b] >= 0) ++known_bytes;
    char_byte_[map[b]] = static_cast<int16_t>(b);
  }
  AERIE_CHECK(known_bytes >= 128, file << ": the vocabulary has pieces for only " << known_bytes
                                       << " of the 256 byte characters: not a byte-level BPE vocabulary");
  vocab_size_ = model_.size();
  for (const auto& t : added_.tokens()) vocab_size_ = std::max<int64_t>(vocab_size_, t.id + 1);
  parse_post_processor(tj.value("post_processor", nlohmann::json()), file);
  parse_decoder(tj.value("decoder", nlohmann::json()), file);
}

void ByteLevelBpe::parse_post_processor(const nlohmann::json& p, const std::string& file) {
  if (p.is_null()) return;
  const std::string type = p.value("type", "");
  if (type == "Sequence") {
    for (const auto& s : p.at("processors")) parse_post_processor(s, file);
  } else if (type == "TemplateProcessing") {
    // "single": [{"SpecialToken": {"id": "<|begin_of_text|>"}}, {"Sequence": {"id": "A"}}]: the special
    // tokens before the sequence, with their ids from "special_tokens".
    prefix_.clear();
    for (const auto& piece : p.at("single")) {
      if (piece.contains("Sequence")) break;
      AERIE_CHECK(piece.contains("SpecialToken"), file << ": TemplateProcessing piece " << piece.dump());
      const std::string name = piece["SpecialToken"].at("id").get<std::string>();
      const auto& st = p.at("special_tokens");
      AERIE_CHECK(st.contains(name), file << ": TemplateProcessing special token '" << name << "' has no entry");
      for (const auto& id : st[name].at("ids")) prefix_.push_back(id.get<int32_t>());
    }
  } else if (type != "ByteLevel") {  // ByteLevel's post-processing only trims offsets (trim_offsets)
    AERIE_THROW(file << ": post_processor type '" << type << "' is not supported by the byte-level BPE tokenizer");
  }
}

void ByteLevelBpe::parse_decoder(const nlohmann::json& d, const std::string& file) {
  if (d.is_null()) return;
  const std::string type = d.value("type", "");
  if (type == "Sequence") {
    for (const auto& s : d.at("decoders")) parse_decoder(s, file);
  } else if (type != "ByteLevel") {
    AERIE_THROW(file << ": decoder type '" << type << "' is not supported by the byte-level BPE tokenizer");
  }
}

int32_t ByteLevelBpe::token_to_id(const std::string& token) const {
  const int32_t a = added_.id(token);
  return a >= 0 ? a : model_.id(token);
}

std::vector<int32_t> ByteLevelBpe::encode(const std::string& text) const {
  std::vector<int32_t> ids;
  encode_impl(text, ids, nullptr);
  return ids;
}

Encoding ByteLevelBpe::encode_with_offsets(const std::string& text) const {
  Encoding e;
  encode_impl(text, e.ids, &e.offsets);
  return e;
}

void ByteLevelBpe::encode_impl(const std::string& text, std::vector<int32_t>& ids,
                               std::vector<std::pair<size_t, size_t>>* offsets) const {
  std::vector<PreToken> pieces;
  std::vector<uint32_t> lens;
  std::string word;
  for (const Segment& seg : added_.split(text, AddedMatch::raw)) {
    if (seg.token >= 0) {
      ids.push_back(seg.token);
      if (offsets) offsets->push_back({seg.begin, seg.end});
      continue;
    }
    const Normalized n = normalizer_.apply(seg.text);
    for (const Segment& sub : added_.split(n.text, AddedMatch::normalized)) {
      if (sub.token >= 0) {
        ids.push_back(sub.token);
        if (offsets) {
          const auto r = n.input_range(sub.begin, sub.end, seg.text.size());
          offsets->push_back({seg.begin + r.first, seg.begin + r.second});
        }
        continue;
      }
      pieces.assign(1, PreToken{sub.begin, sub.end, false});
      pre_.split(n.text, pieces);
      for (const PreToken& p : pieces) {
        word.clear();
        if (p.prefix_space) word += ' ';
        word.append(n.text, p.begin, p.end - p.begin);
        const size_t first = ids.size();
        lens.clear();
        encode_word(word, ids, lens);
        if (!offsets) continue;
        // Token k covers lens[k] bytes of `word`; the prefix space stands for no input byte.
        size_t skip = p.prefix_space ? 1 : 0, pos = p.begin;
        for (size_t k = 0; k < ids.size() - first; ++k) {
          const size_t take = std::min<size_t>(skip, lens[k]);
          skip -= take;
          const size_t real = lens[k] - take;
          const auto r = n.input_range(pos, pos + real, seg.text.size());
          offsets->push_back({seg.begin + r.first, seg.begin + r.second});
          pos += real;
        }
      }
    }
  }
}

void ByteLevelBpe::encode_word(const std::string& word, std::vector<int32_t>& ids, std::vector<uint32_t>& lens) const {
  if (word.empty()) return;
  const bool cacheable = word.size() < 256;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    auto it = cache_.find(word);
    if (it != cache_.end()) {
      ids.insert(ids.end(), it->second.ids.begin(), it->second.ids.end());
      lens.insert(lens.end(), it->second.lens.begin(), it->second.lens.end());
      return;
    }
  }
  Cached c;
  int32_t whole = -1;
  if (ignore_merges_) {  // tokenizers' BPE::tokenize: the whole word, if it is in the vocabulary
    std::string mapped;
    for (unsigned char b : word) mapped += byte_char_[b];
    whole = model_.id(mapped);
  }
  if (whole >= 0) {
    c.ids.push_back(whole);
    c.lens.push_back(static_cast<uint32_t>(word.size()));
  } else {
    std::vector<int32_t> syms;
    std::vector<uint32_t> ones;
    uint32_t dropped = 0;  // bytes without a piece: dropped, their length joins the next symbol's
    for (size_t i = 0; i < word.size(); ++i) {
      const int32_t id = byte_id_[static_cast<unsigned char>(word[i])];
      if (id < 0) {
        ++dropped;
        continue;
      }
      syms.push_back(id);
      ones.push_back(1 + dropped);
      dropped = 0;
    }
    if (dropped && !ones.empty()) ones.back() += dropped;
    if (!syms.empty()) model_.merge(syms, c.ids, &ones, &c.lens);
  }
  ids.insert(ids.end(), c.ids.begin(), c.ids.end());
  lens.insert(lens.end(), c.lens.begin(), c.lens.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cache_.size() >= (1u << 18)) cache_.clear();  // bound the memory on endless distinct input
    cache_.emplace(word, std::move(c));
  }
}

std::string ByteLevelBpe::decode(const std::vector<int32_t>& ids) const {
  std::string bytes;
  std::vector<uint32_t> cps;
  for (int32_t id : ids) {
    const AddedToken* a = added_.find(id);
    if (a && a->special) continue;
    const std::string& p = a ? a->content : model_.piece(id);
    if (p.empty()) continue;
    // All characters in the byte map -> their bytes; else the token's UTF-8 as it is.
    const size_t mark = bytes.size();
    bool mapped = code_points(p, cps);
    for (size_t k = 0; mapped && k < cps.size(); ++k) {
      const int b = cps[k] < char_byte_.size() ? char_byte_[cps[k]] : -1;
      if (b < 0) {
        mapped = false;
      } else {
        bytes.push_back(static_cast<char>(b));
      }
    }
    if (!mapped) {
      bytes.resize(mark);
      bytes += p;
    }
  }
  std::string out;
  out.reserve(bytes.size());
  append_lossy(bytes, out);
  return out;
}

}  // namespace aerie::tok
