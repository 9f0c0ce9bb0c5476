#include "tokenizer/sentencepiece_bpe.h"

#include <cstdio>

#include "core/error.h"

namespace aerie::tok {

namespace {

const char* const kSpace = "\u2581";

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  if (from.empty()) return;
  std::string out;
  out.reserve(s.size() + s.size() / 4);
  size_t i = 0;
  for (size_t j; (j = s.find(from, i)) != std::string::npos; i = j + from.size()) {
    out.append(s, i, j - i);
    out += to;
  }
  out.append(s, i, std::string::npos);
  s.swap(out);
}

std::string string_pattern(const nlohmann::json& r, const std::string& file) {
  AERIE_CHECK(r.contains("pattern") && r["pattern"].contains("String"),
              file << ": Replace with a Regex pattern is not supported: " << r.dump());
  return r["pattern"]["String"].get<std::string>();
}

// Byte value of a "<0xNN>" piece, -1 for any other piece (tokenizers' ByteFallback decoder test).
int byte_piece(const std::string& p) {
  if (p.size() != 6 || p.compare(0, 3, "<0x") != 0 || p[5] != '>') return -1;
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  const int h = hex(p[3]), l = hex(p[4]);
  return h < 0 || l < 0 ? -1 : h * 16 + l;
}

}  // namespace

SentencePieceBpe::SentencePieceBpe(const nlohmann::json& tj, const std::string& file)
    : model_(tj.at("model"), file), added_(tj.value("added_tokens", nlohmann::json()), file) {
  const auto& m = tj["model"];
  byte_fallback_ = m.value("byte_fallback", false);
  fuse_unk_ = m.value("fuse_unk", false);
  if (m.contains("unk_token") && m["unk_token"].is_string()) unk_ = model_.id(m["unk_token"].get<std::string>());
  AERIE_CHECK(!m.contains("continuing_subword_prefix") || m["continuing_subword_prefix"].is_null(),
              file << ": BPE continuing_subword_prefix is not supported");
  AERIE_CHECK(!m.contains("end_of_word_suffix") || m["end_of_word_suffix"].is_null(),
              file << ": BPE end_of_word_suffix is not supported");
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    byte_ids_[b] = model_.id(name);
  }
  vocab_size_ = model_.size();
  for (const auto& t : added_.tokens()) vocab_size_ = std::max<int64_t>(vocab_size_, t.id + 1);
  parse_normalizer(tj.value("normalizer", nlohmann::json()), file);
  parse_pre_tokenizer(tj.value("pre_tokenizer", nlohmann::json()), file);
  parse_decoder(tj.value("decoder", nlohmann::json()), file);
}

void SentencePieceBpe::parse_normalizer(const nlohmann::json& n, const std::string& file) {
  if (n.is_null()) return;
  const std::string type = n.value("type", "");
  if (type == "Sequence") {
    for (const auto& s : n.at("normalizers")) parse_normalizer(s, file);
  } else if (type == "Prepend") {
    norm_.push_back({true, n.at("prepend").get<std::string>(), ""});
  } else if (type == "Replace") {
    norm_.push_back({false, string_pattern(n, file), n.at("content").get<std::string>()});
  } else {
    AERIE_THROW(file << ": normalizer type '" << type << "' is not supported by the sentencepiece BPE tokenizer");
  }
}

void SentencePieceBpe::parse_pre_tokenizer(const nlohmann::json& p, const std::string& file) {
  if (p.is_null()) return;
  const std::string type = p.value("type", "");
  if (type == "Sequence") {
    for (const auto& s : p.at("pretokenizers")) parse_pre_tokenizer(s, file);
  } else if (type == "Metaspace") {
    metaspace_ = true;
    ms_replacement_ = p.value("replacement", std::string(kSpace));
    if (p.contains("prepend_scheme")) {
      ms_prepend_ = p["prepend_scheme"].get<std::string>();
    } else {  // tokenizers < 0.19: add_prefix_space
      ms_prepend_ = p.value("add_prefix_space", true) ? "always" : "never";
    }
    ms_split_ = p.value("split", true);
  } else {
    AERIE_THROW(file << ": pre_tokenizer type '" << type << "' is not supported by the sentencepiece BPE tokenizer");
  }
}

void SentencePieceBpe::parse_decoder(const nlohmann::json& d, const std::string& file) {
  if (d.is_null()) return;
  const std::string type = d.value("type", "");
  if (type == "Sequence") {
    for (const auto& s : d.at("decoders")) parse_decoder(s, file);
  } else if (type == "Strip") {
    AERIE_CHECK(!metaspace_decoder_, file << ": Strip after a Metaspace decoder is not supported");
    AERIE_CHECK(d.value("content", " ") == " " && d.value("stop", 0) == 0,
                file << ": only Strip(' ', start, 0) is supported: " << d.dump());
    strip_leading_spaces_ = d.value("start", 0);
  } else if (type == "Metaspace") {
    AERIE_CHECK(!byte_fallback_decoder_ && !replace_decoder_,
                file << ": a Metaspace decoder after ByteFallback/Replace is not supported");
    ms_replacement_ = d.value("replacement", std::string(kSpace));
    const std::string scheme = d.contains("prepend_scheme")
                                   ? d["prepend_scheme"].get<std::string>()
                                   : (d.value("add_prefix_space", true) ? "always" : "never");
    metaspace_decoder_ = true;
    ms_drop_first_ = scheme != "never";
  } else if (type == "Replace") {
    AERIE_CHECK(string_pattern(d, file) == kSpace && d.value("content", "") == " ",
                file << ": only the Replace('\u2581', ' ') decoder is supported: " << d.dump());
    replace_decoder_ = true;
  } else if (type == "ByteFallback") {
    byte_fallback_decoder_ = true;
  } else if (type != "Fuse") {
    AERIE_THROW(file << ": decoder type '" << type << "' is not supported by the sentencepiece BPE tokenizer");
  }
}

int32_t SentencePieceBpe::token_to_id(const std::string& token) const {
  const int32_t a = added_.id(token);
  return a >= 0 ? a : model_.id(token);
}

std::vector<int32_t> SentencePieceBpe::encode(const std::string& text) const {
  std::vector<int32_t> out;
  encode_impl(text, out, nullptr);
  return out;
}

Encoding SentencePieceBpe::encode_with_offsets(const std::string& text) const {
  Encoding e;
  encode_impl(text, e.ids, &e.offsets);
  return e;
}

void SentencePieceBpe::encode_impl(const std::string& text, std::vector<int32_t>& out,
                                   std::vector<std::pair<size_t, size_t>>* offsets) const {
  bool at_start = true;
  for (const Segment& s : added_.split(text)) {
    if (s.token >= 0) {
      out.push_back(s.token);
      if (offsets) offsets->push_back({s.begin, s.end});
    } else {
      encode_segment(s.text, at_start, s.begin, out, offsets);
    }
    at_start = false;
  }
}

namespace {

// Aligned-text edits: the bytes of an inserted string stand for the empty input range at `at`, those
// of a replacement for the input range of what they replace.
void aligned_prepend(std::string& s, std::vector<uint32_t>& b, std::vector<uint32_t>& e, const std::string& p) {
  const uint32_t at = b.empty() ? 0 : b.front();
  s.insert(0, p);
  b.insert(b.begin(), p.size(), at);
  e.insert(e.begin(), p.size(), at);
}

void aligned_replace(std::string& s, std::vector<uint32_t>& b, std::vector<uint32_t>& e, const std::string& from,
                     const std::string& to) {
  if (from.empty() || s.find(from) == std::string::npos) return;
  std::string ns;
  std::vector<uint32_t> nb, ne;
  ns.reserve(s.size() + s.size() / 2);
  nb.reserve(ns.capacity());
  ne.reserve(ns.capacity());
  size_t i = 0;
  for (size_t j; (j = s.find(from, i)) != std::string::npos; i = j + from.size()) {
    ns.append(s, i, j - i);
    nb.insert(nb.end(), b.begin() + i, b.begin() + j);
    ne.insert(ne.end(), e.begin() + i, e.begin() + j);
    ns += to;
    nb.insert(nb.end(), to.size(), b[j]);
    ne.insert(ne.end(), to.size(), e[j + from.size() - 1]);
  }
  ns.append(s, i, std::string::npos);
  nb.insert(nb.end(), b.begin() + i, b.end());
  ne.insert(ne.end(), e.begin() + i, e.end());
  s.swap(ns);
  b.swap(nb);
  e.swap(ne);
}

}  // namespace

void SentencePieceBpe::encode_segment(const std::string& seg, bool at_start, size_t base, std::vector<int32_t>& out,
                                      std::vector<std::pair<size_t, size_t>>* offsets) const {
  Aligned a;
  a.s = seg;
  a.b.resize(seg.size());
  a.e.resize(seg.size());
  for (size_t k = 0; k < seg.size(); ++k) {
    a.b[k] = static_cast<uint32_t>(k);
    a.e[k] = static_cast<uint32_t>(k + 1);
  }
  for (const NormStep& n : norm_) {
    if (n.prepend) {
      if (!a.s.empty()) aligned_prepend(a.s, a.b, a.e, n.a);  // tokenizers' Prepend leaves "" empty
    } else {
      aligned_replace(a.s, a.b, a.e, n.a, n.b);
    }
  }
  std::vector<uint32_t> lens;
  auto word = [&](size_t begin, size_t end) {
    const size_t first = out.size();
    lens.clear();
    encode_word(a, begin, end, out, lens);
    if (!offsets) return;
    size_t pos = begin;
    for (size_t k = 0; k < out.size() - first; ++k) {
      const size_t l = lens[k];
      offsets->push_back({base + a.b[pos], base + (l > 0 ? a.e[pos + l - 1] : a.b[pos])});
      pos += l;
    }
  };
  if (!metaspace_) {
    word(0, a.s.size());
    return;
  }
  // tokenizers' pre_tokenizers/metaspace.rs
  aligned_replace(a.s, a.b, a.e, " ", ms_replacement_);
  const bool prepend = ms_prepend_ == "always" || (ms_prepend_ == "first" && at_start);
  if (prepend && a.s.compare(0, ms_replacement_.size(), ms_replacement_) != 0)
    aligned_prepend(a.s, a.b, a.e, ms_replacement_);
  if (!ms_split_) {
    word(0, a.s.size());
    return;
  }
  // Split with MergedWithNext: every replacement character starts a new word.
  size_t begin = 0;
  for (size_t i = a.s.find(ms_replacement_, 1); i != std::string::npos; i = a.s.find(ms_replacement_, i + 1)) {
    word(begin, i);
    begin = i;
  }
  word(begin, a.s.size());
}

void SentencePieceBpe::encode_word(const Aligned& a, size_t begin, size_t end, std::vector<int32_t>& out,
                                   std::vector<uint32_t>& out_lens) const {
  if (end <= begin) return;
  const std::string w = a.s.substr(begin, end - begin);
  // Initial symbols as in tokenizers' BPE::merge_word: one per character, else its bytes, else <unk>.
  std::vector<int32_t> syms;
  std::vector<uint32_t> lens;  // bytes of `w` per symbol
  syms.reserve(w.size());
  lens.reserve(w.size());
  bool last_unk = false;
  for (size_t i = 0; i < w.size();) {
    size_t len = utf8_valid_len(w, i);
    if (len == 0) len = 1;  // invalid UTF-8: the stray byte alone
    const int32_t id = model_.id(w.substr(i, len));
    bool done = false;
    if (id >= 0) {
      syms.push_back(id);
      lens.push_back(static_cast<uint32_t>(len));
      done = true;
    } else if (byte_fallback_) {
      bool all = true;
      for (size_t k = 0; k < len; ++k) all = all && byte_ids_[static_cast<unsigned char>(w[i + k])] >= 0;
      if (all) {
        for (size_t k = 0; k < len; ++k) {
          syms.push_back(byte_ids_[static_cast<unsigned char>(w[i + k])]);
          lens.push_back(1);
        }
        done = true;
      }
    }
    if (done) {
      last_unk = false;
    } else {
      AERIE_CHECK(unk_ >= 0, "tokenizer: character '" << w.substr(i, len)
                                                       << "' is not in the vocabulary and there is no unk token");
      if (fuse_unk_ && last_unk) {
        lens.back() += static_cast<uint32_t>(len);
      } else {
        syms.push_back(unk_);
        lens.push_back(static_cast<uint32_t>(len));
      }
      last_unk = true;
    }
    i += len;
  }
  model_.merge(syms, out, &lens, &out_lens);
}

std::string SentencePieceBpe::decode(const std::vector<int32_t>& ids) const {
  // tokenizers' decoders, on the pieces of the non-special ids: Replace("\u2581", " ") per piece;
  // ByteFallback: a run of <0xNN> pieces becomes its bytes if they are valid UTF-8, else one U+FFFD per
  // piece; Fuse; Strip(' ', n, 0) on the fused text. Metaspace instead: "\u2581" -> " " except in the
  // first piece, where every "\u2581" is dropped (decoders/metaspace.rs).
  std::string text, bytes;
  auto flush = [&]() {
    if (bytes.empty()) return;
    bool valid = true;
    for (size_t i = 0; i < bytes.size() && valid;) {
      const size_t len = utf8_valid_len(bytes, i);
      valid = len > 0;
      i += len;
    }
    if (valid) {
      text += bytes;
    } else {
      for (size_t i = 0; i < bytes.size(); ++i) text += "\xEF\xBF\xBD";
    }
    bytes.clear();
  };
  bool first = true;
  for (int32_t id : ids) {
    const AddedToken* a = added_.find(id);
    if (a && a->special) continue;
    std::string p = a ? a->content : model_.piece(id);
    if (p.empty()) continue;  // id outside the vocabulary
    if (metaspace_decoder_) {
      replace_all(p, ms_replacement_, first && ms_drop_first_ ? "" : " ");
    } else if (replace_decoder_) {
      replace_all(p, kSpace, " ");
    }
    first = false;
    const int b = byte_fallback_decoder_ ? byte_piece(p) : -1;
    if (b >= 0) {
      bytes.push_back(static_cast<char>(b));
      continue;
    }
    flush();
    text += p;
  }
  flush();
  size_t n = 0;
  while (n < static_cast<size_t>(strip_leading_spaces_) && n < text.size() && text[n] == ' ') ++n;
  return text.substr(n);
}

}  // namespace aerie::tok
