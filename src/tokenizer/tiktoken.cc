#include "tokenizer/tiktoken.h"

#include <array>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string_view>
#include <unordered_map>

#include "core/error.h"
#include "core/log.h"

namespace aerie::tok {

const char* const kKimiPattern =
    "[\\p{Han}]+"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+"
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]*"
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|\\p{N}{1,3}"
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+"
    "|\\s+(?!\\S)"
    "|\\s+";

namespace {

namespace fs = std::filesystem;

// Standard base64 (RFC 4648, with '=' padding, as Python's base64.b64decode reads it by default).
// False on a character outside the alphabet or a bad length / padding.
bool base64_decode(std::string_view s, std::string& out) {
  static const std::array<int8_t, 256> value = [] {
    std::array<int8_t, 256> v{};
    v.fill(-1);
    const char* abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int i = 0; i < 64; ++i) v[static_cast<unsigned char>(abc[i])] = static_cast<int8_t>(i);
    return v;
  }();
  out.clear();
  if (s.empty() || s.size() % 4 != 0) return false;
  size_t pad = 0;
  while (pad < 2 && s[s.size() - 1 - pad] == '=') ++pad;
  uint32_t acc = 0;
  int bits = 0;
  for (size_t i = 0; i < s.size() - pad; ++i) {
    const int8_t v = value[static_cast<unsigned char>(s[i])];
    if (v < 0) return false;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xFF));
    }
  }
  return (acc & ((1u << bits) - 1)) == 0;  // the unused low bits of the last character are zero
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  AERIE_CHECK(f, "cannot open tokenizer file " << path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The special tokens of ids n .. n+255 as added_tokens of a tokenizer.json (tokenization_kimi.py's
// special_tokens): the config's added_tokens_decoder where it names the id, else <|reserved_token_ID|>.
nlohmann::json special_tokens(int32_t n, const nlohmann::json& cfg, const std::string& cfg_path) {
  constexpr int32_t kReserved = 256;  // tokenization_kimi.py num_reserved_special_tokens
  std::map<int32_t, nlohmann::json> named;
  if (cfg.is_object() && cfg.contains("added_tokens_decoder")) {
    const auto& dec = cfg["added_tokens_decoder"];
    AERIE_CHECK(dec.is_object(), cfg_path << ": added_tokens_decoder is not an object");
    for (const auto& [key, t] : dec.items()) {
      int32_t id = -1;
      try {
        size_t used = 0;
        id = std::stoi(key, &used);
        if (used != key.size()) id = -1;
      } catch (const std::exception&) {
      }
      AERIE_CHECK(id >= 0 && t.is_object() && t.contains("content") && t["content"].is_string() &&
                      !t["content"].get<std::string>().empty(),
                  cfg_path << ": added_tokens_decoder entry '" << key << "' is not {id: {\"content\": ...}}");
      if (id < n || id >= n + kReserved) {
        AERIE_LOG(warning) << cfg_path << ": added token " << id << " ('" << t["content"].get<std::string>()
                           << "') is outside the special ids " << n << ".." << n + kReserved - 1
                           << " of the tiktoken file; ignored, as tokenization_kimi.py does";
        continue;
      }
      named[id] = t;
    }
  }
  nlohmann::json added = nlohmann::json::array();
  for (int32_t id = n; id < n + kReserved; ++id) {
    auto it = named.find(id);
    const bool have = it != named.end();
    added.push_back({{"id", id},
                     {"content", have ? it->second["content"].get<std::string>()
                                      : "<|reserved_token_" + std::to_string(id) + "|>"},
                     {"special", have ? it->second.value("special", true) : true},
                     {"normalized", false}});  // tiktoken matches them in the raw text, no lstrip/rstrip
  }
  return added;
}

}  // namespace

std::vector<std::string> read_tiktoken_ranks(const std::string& path) {
  const std::string text = read_text(path);
  std::vector<std::string> by_rank;
  std::vector<size_t> line_of;  // line of each rank, 0 where not given yet
  std::string bytes;
  size_t line = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    std::string_view l(text.data() + pos, eol - pos);
    pos = eol + 1;
    ++line;
    if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
    if (l.empty()) continue;
    const size_t sp = l.find(' ');
    const std::string_view b64 = l.substr(0, sp), num = sp == std::string_view::npos ? "" : l.substr(sp + 1);
    const bool digits = !num.empty() && num.size() < 10 && num.find_first_not_of("0123456789") == std::string_view::npos;
    AERIE_CHECK(digits, path << ":" << line << ": not '<base64 token> <rank>': '" << l.substr(0, 80) << "'");
    AERIE_CHECK(base64_decode(b64, bytes) && !bytes.empty(),
                path << ":" << line << ": bad base64 token '" << b64.substr(0, 80) << "'");
    const auto rank = static_cast<size_t>(std::stoul(std::string(num)));
    if (rank >= by_rank.size()) {
      by_rank.resize(rank + 1);
      line_of.resize(rank + 1, 0);
    }
    AERIE_CHECK(line_of[rank] == 0, path << ":" << line << ": rank " << rank << " already given on line "
                                         << line_of[rank]);
    by_rank[rank] = bytes;
    line_of[rank] = line;
  }
  AERIE_CHECK(!by_rank.empty(), path << ": no tokens (not a tiktoken BPE file)");
  for (size_t r = 0; r < by_rank.size(); ++r)
    AERIE_CHECK(line_of[r] != 0, path << ": rank " << r << " is missing (ranks are 0.." << by_rank.size() - 1
                                      << ", each once)");
  return by_rank;
}

std::unique_ptr<ByteLevelBpe> load_tiktoken_folder(const std::string& dir) {
  const std::string model_path = (fs::path(dir) / "tiktoken.model").string();
  const std::vector<std::string> ranks = read_tiktoken_ranks(model_path);
  const auto n = static_cast<int32_t>(ranks.size());

  // Merges: every split of a token into two tokens, with the rank of the whole (see the header).
  std::unordered_map<std::string_view, int32_t> rank_of;
  rank_of.reserve(ranks.size());
  for (int32_t r = 0; r < n; ++r) {
    const bool fresh = rank_of.emplace(ranks[r], r).second;
    AERIE_CHECK(fresh, model_path << ": ranks " << rank_of.at(ranks[r]) << " and " << r << " have the same bytes");
  }
  for (int b = 0; b < 256; ++b)
    AERIE_CHECK(rank_of.count(std::string_view(std::string(1, static_cast<char>(b)))),
                model_path << ": byte " << b << " is not a token (a tiktoken file has all 256 single bytes)");
  std::vector<BpeModel::Merge> merges;
  for (int32_t r = 0; r < n; ++r) {
    const std::string_view t = ranks[r];
    for (size_t k = 1; k < t.size(); ++k) {
      auto a = rank_of.find(t.substr(0, k));
      if (a == rank_of.end()) continue;
      auto b = rank_of.find(t.substr(k));
      if (b != rank_of.end()) merges.push_back({a->second, b->second, r, r});
    }
  }
  // Pieces as ByteLevelBpe stores them: every byte as its GPT-2 character.
  const auto map = gpt2_byte_to_unicode();
  std::vector<std::string> pieces(ranks.size());
  for (int32_t r = 0; r < n; ++r)
    for (unsigned char c : ranks[r]) append_utf8(map[c], pieces[r]);
  BpeModel model(std::move(pieces), merges, model_path);

  std::string pattern = kKimiPattern;
  const fs::path pat_path = fs::path(dir) / "pat_str.txt";
  if (fs::exists(pat_path)) {
    pattern = read_text(pat_path.string());
    while (!pattern.empty() && (pattern.back() == '\n' || pattern.back() == '\r')) pattern.pop_back();
    AERIE_CHECK(!pattern.empty() && pattern.find('\n') == std::string::npos,
                pat_path.string() << ": not one line holding the split regex");
  }
  nlohmann::json cfg;
  const fs::path cfg_path = fs::path(dir) / "tokenizer_config.json";
  if (fs::exists(cfg_path)) {
    try {
      cfg = nlohmann::json::parse(read_text(cfg_path.string()));
    } catch (const nlohmann::json::exception& e) {
      AERIE_THROW("bad JSON in " << cfg_path.string() << ": " << e.what());
    }
  }
  // Keep the regex matches only (tiktoken skips the text between them; Kimi's regex leaves none).
  const nlohmann::json tj = {
      {"model", {{"type", "BPE"}, {"ignore_merges", true}}},
      {"added_tokens", special_tokens(n, cfg, cfg_path.string())},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Removed"}, {"invert", true}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}}}};
  AERIE_LOG(debug) << model_path << ": " << n << " ranks, " << merges.size() << " merges, split regex from "
                   << (fs::exists(pat_path) ? pat_path.string() : std::string("tokenization_kimi.py"));
  return std::make_unique<ByteLevelBpe>(std::move(model), tj, model_path);
}

}  // namespace aerie::tok
