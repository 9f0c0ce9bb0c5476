#include "tokenizer/pretokenizer.h"

#include <algorithm>

#include <unicode/bytestream.h>
#include <unicode/unistr.h>

#include "core/error.h"
#include "tokenizer/bpe_model.h"

namespace aerie::tok {

const char* const kGpt2Regex = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

namespace {

// UTF-16 copy of `s` for ICU, with at[k] = byte offset of UTF-16 unit k (at[size] = s.size()).
void to_utf16(std::string_view s, icu::UnicodeString& u, std::vector<uint32_t>& at) {
  u.remove();
  at.clear();
  at.reserve(s.size() + 1);
  for (size_t i = 0; i < s.size();) {
    uint32_t cp;
    size_t len = decode_utf8(s, i, cp);
    if (len == 0) {
      cp = 0xFFFD;
      len = 1;
    }
    u.append(static_cast<UChar32>(cp));
    at.push_back(static_cast<uint32_t>(i));
    if (cp > 0xFFFF) at.push_back(static_cast<uint32_t>(i));
    i += len;
  }
  at.push_back(static_cast<uint32_t>(s.size()));
}

PreTokenizer::Behavior parse_behavior(const std::string& b, const std::string& file) {
  using B = PreTokenizer::Behavior;
  if (b == "Removed") return B::removed;
  if (b == "Isolated") return B::isolated;
  if (b == "MergedWithPrevious") return B::merged_with_previous;
  if (b == "MergedWithNext") return B::merged_with_next;
  if (b == "Contiguous") return B::contiguous;
  AERIE_THROW(file << ": unknown Split behavior '" << b << "'");
}

struct Span {
  size_t b, e;
  bool match;
};

// tokenizers' NormalizedString::split: the delimiters (match = true) and the text between them become
// pieces according to `behavior`; `removed` drops delimiters. Returns the non-empty pieces.
void apply_behavior(const std::vector<Span>& spans, PreTokenizer::Behavior behavior,
                    std::vector<std::pair<size_t, size_t>>& out) {
  using B = PreTokenizer::Behavior;
  std::vector<std::pair<size_t, size_t>> acc;
  bool prev = false;
  switch (behavior) {
    case B::removed:
      for (const Span& s : spans)
        if (!s.match) acc.push_back({s.b, s.e});
      break;
    case B::isolated:
      for (const Span& s : spans) acc.push_back({s.b, s.e});
      break;
    case B::contiguous:
      for (const Span& s : spans) {
        if (s.match == prev && !acc.empty()) {
          acc.back().second = s.e;
        } else {
          acc.push_back({s.b, s.e});
        }
        prev = s.match;
      }
      break;
    case B::merged_with_previous:
      for (const Span& s : spans) {
        if (s.match && !prev && !acc.empty()) {
          acc.back().second = s.e;
        } else {
          acc.push_back({s.b, s.e});
        }
        prev = s.match;
      }
      break;
    case B::merged_with_next:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->match && !prev && !acc.empty()) {
          acc.back().first = it->b;
        } else {
          acc.push_back({it->b, it->e});
        }
        prev = it->match;
      }
      std::reverse(acc.begin(), acc.end());
      break;
  }
  for (const auto& r : acc)
    if (r.second > r.first) out.push_back(r);
}

// Matches (from find_all) -> the spans covering [0, n), as tokenizers' Pattern::find_matches.
void spans_of(const std::vector<std::pair<size_t, size_t>>& m, size_t n, bool invert, std::vector<Span>& spans) {
  spans.clear();
  size_t prev = 0;
  for (const auto& [b, e] : m) {
    if (b != prev) spans.push_back({prev, b, invert});
    spans.push_back({b, e, !invert});
    prev = e;
  }
  if (prev != n) spans.push_back({prev, n, invert});
}

}  // namespace

// ---- Regex ----

std::string Regex::translate(const std::string& onig) {
  std::string out;
  int depth = 0;  // inside [...] when > 0
  for (size_t i = 0; i < onig.size(); ++i) {
    const char c = onig[i];
    if (c == '\\' && i + 1 < onig.size()) {
      const char d = onig[++i];
      if (d == 's') {
        out += "\\p{White_Space}";
      } else if (d == 'S') {
        out += "\\P{White_Space}";
      } else if (d == 'h') {
        out += depth > 0 ? "0-9A-Fa-f" : "[0-9A-Fa-f]";
      } else if (d == 'H' && depth == 0) {
        out += "[^0-9A-Fa-f]";
      } else {
        out += c;
        out += d;
      }
      continue;
    }
    if (c == '[') ++depth;
    if (c == ']' && depth > 0) --depth;
    out += c;
  }
  return out;
}

Regex::Regex(const std::string& pattern, const std::string& file) {
  const std::string icu_pattern = translate(pattern);
  UErrorCode st = U_ZERO_ERROR;
  UParseError pe;
  pattern_.reset(icu::RegexPattern::compile(icu::UnicodeString::fromUTF8(icu_pattern), 0, pe, st));
  AERIE_CHECK(U_SUCCESS(st) && pattern_, file << ": cannot compile the regex '" << pattern << "' (as ICU '"
                                               << icu_pattern << "'): " << u_errorName(st) << " at offset "
                                               << pe.offset);
}

void Regex::find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const {
  if (s.empty()) return;
  thread_local icu::UnicodeString u;
  thread_local std::vector<uint32_t> at;
  to_utf16(s, u, at);
  UErrorCode st = U_ZERO_ERROR;
  std::unique_ptr<icu::RegexMatcher> m(pattern_->matcher(u, st));
  AERIE_CHECK(U_SUCCESS(st), "tokenizer regex: cannot create a matcher: " << u_errorName(st));
  while (m->find(st) && U_SUCCESS(st)) {
    const int32_t b = m->start(st), e = m->end(st);
    out.push_back({at[b], at[e]});
  }
  AERIE_CHECK(U_SUCCESS(st), "tokenizer regex: matching failed: " << u_errorName(st));
}

// ---- Normalizer ----

std::pair<size_t, size_t> Normalized::input_range(size_t b, size_t e, size_t input_size) const {
  if (begin.empty()) return {b, e};
  if (b == e) {
    const size_t p = b < text.size() ? begin[b] : input_size;
    return {p, p};
  }
  return {begin[b], end[e - 1]};
}

Normalizer::Normalizer(const nlohmann::json& n, const std::string& file) {
  if (n.is_null()) return;
  const std::string type = n.value("type", "");
  UErrorCode st = U_ZERO_ERROR;
  if (type == "Sequence") {
    for (const auto& s : n.at("normalizers")) {
      Normalizer sub(s, file);
      forms_.insert(forms_.end(), sub.forms_.begin(), sub.forms_.end());
    }
    return;
  }
  const icu::Normalizer2* f = nullptr;
  if (type == "NFC") f = icu::Normalizer2::getNFCInstance(st);
  else if (type == "NFD") f = icu::Normalizer2::getNFDInstance(st);
  else if (type == "NFKC") f = icu::Normalizer2::getNFKCInstance(st);
  else if (type == "NFKD") f = icu::Normalizer2::getNFKDInstance(st);
  else AERIE_THROW(file << ": normalizer type '" << type << "' is not supported by the byte-level BPE tokenizer");
  AERIE_CHECK(U_SUCCESS(st) && f, file << ": ICU has no " << type << " normalizer: " << u_errorName(st));
  forms_.push_back(f);
}

Normalized Normalizer::apply(const std::string& s) const {
  Normalized cur;
  cur.text = s;
  for (const icu::Normalizer2* f : forms_) {
    UErrorCode st = U_ZERO_ERROR;
    if (f->isNormalizedUTF8(icu::StringPiece(cur.text.data(), static_cast<int32_t>(cur.text.size())), st) &&
        U_SUCCESS(st))
      continue;
    // Chunk by chunk: text between two normalization boundaries normalizes independently.
    Normalized next;
    const bool ident = cur.begin.empty();
    auto in_b = [&](size_t k) { return ident ? static_cast<uint32_t>(k) : cur.begin[k]; };
    auto in_e = [&](size_t k) { return ident ? static_cast<uint32_t>(k + 1) : cur.end[k]; };
    auto emit_identity = [&](size_t a, size_t b) {
      for (size_t k = a; k < b; ++k) {
        next.text.push_back(cur.text[k]);
        next.begin.push_back(in_b(k));
        next.end.push_back(in_e(k));
      }
    };
    auto flush = [&](size_t a, size_t b) {
      if (a >= b) return;
      std::string r;
      icu::StringByteSink<std::string> sink(&r);
      UErrorCode e = U_ZERO_ERROR;
      f->normalizeUTF8(0, icu::StringPiece(cur.text.data() + a, static_cast<int32_t>(b - a)), sink, nullptr, e);
      AERIE_CHECK(U_SUCCESS(e), "tokenizer: Unicode normalization failed: " << u_errorName(e));
      if (r.size() == b - a && cur.text.compare(a, b - a, r) == 0) return emit_identity(a, b);
      for (char c : r) {
        next.text.push_back(c);
        next.begin.push_back(in_b(a));
        next.end.push_back(in_e(b - 1));
      }
    };
    size_t chunk = 0;
    for (size_t i = 0; i < cur.text.size();) {
      uint32_t cp;
      const size_t len = decode_utf8(cur.text, i, cp);
      if (len == 0) {  // an invalid byte: its own chunk, unchanged
        flush(chunk, i);
        emit_identity(i, i + 1);
        chunk = ++i;
        continue;
      }
      if (i > chunk && f->hasBoundaryBefore(static_cast<UChar32>(cp))) {
        flush(chunk, i);
        chunk = i;
      }
      i += len;
    }
    flush(chunk, cur.text.size());
    cur = std::move(next);
  }
  return cur;
}

// ---- PreTokenizer ----

PreTokenizer::PreTokenizer(const nlohmann::json& p, const std::string& file) { parse(p, file); }

void PreTokenizer::parse(const nlohmann::json& p, const std::string& file) {
  if (p.is_null()) return;
  const std::string type = p.value("type", "");
  if (type == "Sequence") {
    for (const auto& s : p.at("pretokenizers")) parse(s, file);
    return;
  }
  AERIE_CHECK(!byte_level_, file << ": pre_tokenizer " << type << " after ByteLevel is not supported");
  Step st;
  if (type == "Split") {
    st.kind = Step::split;
    const auto& pat = p.at("pattern");
    if (pat.contains("Regex")) {
      st.regex = std::make_shared<Regex>(pat["Regex"].get<std::string>(), file);
    } else {
      AERIE_CHECK(pat.contains("String"), file << ": Split pattern is neither Regex nor String: " << pat.dump());
      st.literal = pat["String"].get<std::string>();
    }
    st.behavior = parse_behavior(p.value("behavior", "Isolated"), file);
    st.invert = p.value("invert", false);
  } else if (type == "Digits") {
    st.kind = Step::digits;
    st.behavior = p.value("individual_digits", false) ? Behavior::isolated : Behavior::contiguous;
  } else if (type == "ByteLevel") {
    st.kind = Step::byte_level;
    st.add_prefix_space = p.value("add_prefix_space", true);
    if (p.value("use_regex", true)) st.regex = std::make_shared<Regex>(kGpt2Regex, file);
    byte_level_ = true;
  } else {
    AERIE_THROW(file << ": pre_tokenizer type '" << type << "' is not supported by the byte-level BPE tokenizer");
  }
  steps_.push_back(std::move(st));
}

void PreTokenizer::split(const std::string& text, std::vector<PreToken>& pieces) const {
  std::vector<PreToken> next;
  for (const Step& st : steps_) {
    next.clear();
    for (const PreToken& p : pieces) apply(st, text, p, next);
    pieces.swap(next);
  }
}

void PreTokenizer::apply(const Step& st, const std::string& text, const PreToken& in,
                         std::vector<PreToken>& out) const {
  PreToken piece = in;
  if (st.kind == Step::byte_level) {
    if (st.add_prefix_space && !piece.prefix_space && !(piece.end > piece.begin && text[piece.begin] == ' '))
      piece.prefix_space = true;
    if (!st.regex) {
      out.push_back(piece);
      return;
    }
  }
  // The piece's text as the step sees it: with the added space in front when prefix_space.
  std::string with_space;
  std::string_view view(text.data() + piece.begin, piece.end - piece.begin);
  const size_t shift = piece.prefix_space ? 1 : 0;
  if (shift) {
    with_space = " ";
    with_space.append(view);
    view = with_space;
  }
  std::vector<std::pair<size_t, size_t>> matches, ranges;
  std::vector<Span> spans;
  if (st.kind == Step::digits) {
    // A char predicate: every digit is its own match, the text between digits one non-match.
    for (size_t i = 0; i < view.size();) {
      if (view[i] >= '0' && view[i] <= '9') {
        spans.push_back({i, i + 1, true});
        ++i;
        continue;
      }
      size_t j = i;
      while (j < view.size() && !(view[j] >= '0' && view[j] <= '9')) ++j;
      spans.push_back({i, j, false});
      i = j;
    }
  } else {
    if (st.regex) {
      st.regex->find_all(view, matches);
    } else if (!st.literal.empty()) {
      for (size_t i = view.find(st.literal); i != std::string_view::npos;
           i = view.find(st.literal, i + st.literal.size()))
        matches.push_back({i, i + st.literal.size()});
    }
    spans_of(matches, view.size(), st.invert, spans);
  }
  apply_behavior(spans, st.kind == Step::byte_level ? Behavior::isolated : st.behavior, ranges);
  for (const auto& [b, e] : ranges) {
    if (shift && b == 0) {
      out.push_back({piece.begin, piece.begin + e - 1, true});
    } else {
      out.push_back({piece.begin + b - shift, piece.begin + e - shift, false});
    }
  }
}

}  // namespace aerie::tok
