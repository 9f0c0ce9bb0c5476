#include "data/chat_templates_json.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <utility>
#include <vector>

#include "core/error.h"

namespace aerie::chat {

namespace {

void put_string(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

// Python's float repr: the shortest digits that read back, positional for 1e-4 <= |v| < 1e16.
std::string py_float(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  std::string sci(buf, r.ptr);  // "-d.ddde+XX"
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exp = std::stoi(sci.substr(e + 1));
  if (exp < -4 || exp >= 16) {
    std::string m = digits.substr(0, 1);
    if (digits.size() > 1) m += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof(eb), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    return sign + m + eb;
  }
  std::string s;
  if (exp < 0) {
    s = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
  } else if (static_cast<size_t>(exp) + 1 >= digits.size()) {
    s = digits + std::string(static_cast<size_t>(exp) + 1 - digits.size(), '0') + ".0";
  } else {
    s = digits.substr(0, static_cast<size_t>(exp) + 1) + "." + digits.substr(static_cast<size_t>(exp) + 1);
  }
  return sign + s;
}

void put(std::string& out, const nlohmann::ordered_json& v, int indent, int level) {
  auto newline = [&](int lvl) {
    out += '\n';
    out.append(static_cast<size_t>(indent * lvl), ' ');
  };
  switch (v.type()) {
    case nlohmann::ordered_json::value_t::object: {
      if (v.empty()) {
        out += "{}";
        return;
      }
      out += '{';
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) out += indent >= 0 ? "," : ", ";
        first = false;
        if (indent >= 0) newline(level + 1);
        put_string(out, it.key());
        out += ": ";
        put(out, it.value(), indent, level + 1);
      }
      if (indent >= 0) newline(level);
      out += '}';
      return;
    }
    case nlohmann::ordered_json::value_t::array: {
      if (v.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      bool first = true;
      for (const auto& x : v) {
        if (!first) out += indent >= 0 ? "," : ", ";
        first = false;
        if (indent >= 0) newline(level + 1);
        put(out, x, indent, level + 1);
      }
      if (indent >= 0) newline(level);
      out += ']';
      return;
    }
    case nlohmann::ordered_json::value_t::string: put_string(out, v.get_ref<const std::string&>()); return;
    case nlohmann::ordered_json::value_t::boolean: out += v.get<bool>() ? "true" : "false"; return;
    case nlohmann::ordered_json::value_t::number_integer: out += std::to_string(v.get<int64_t>()); return;
    case nlohmann::ordered_json::value_t::number_unsigned: out += std::to_string(v.get<uint64_t>()); return;
    case nlohmann::ordered_json::value_t::number_float: out += py_float(v.get<double>()); return;
    case nlohmann::ordered_json::value_t::binary: {
      const auto& b = v.get_binary();
      AERIE_CHECK(b.has_subtype() && b.subtype() == kExactIntegerSubtype,
                  "python_json: a binary value that is no exact integer (parse_json_exact)");
      out.append(b.begin(), b.end());
      return;
    }
    default: out += "null"; return;
  }
}

// Length of the UTF-8 whitespace character (str.isspace()) at s[i], 0 if none.
size_t space_at(const std::string& s, size_t i) {
  const auto b = [&](size_t k) { return k < s.size() ? static_cast<unsigned char>(s[k]) : 0u; };
  unsigned c = b(i);
  if ((c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20)) return 1;
  if (c == 0xc2 && (b(i + 1) == 0x85 || b(i + 1) == 0xa0)) return 2;
  if (c == 0xe1 && b(i + 1) == 0x9a && b(i + 2) == 0x80) return 3;  // U+1680
  if (c == 0xe2 && b(i + 1) == 0x80 && ((b(i + 2) >= 0x80 && b(i + 2) <= 0x8a) || b(i + 2) == 0xa8 || b(i + 2) == 0xa9 ||
                                        b(i + 2) == 0xaf))
    return 3;  // U+2000-200A, U+2028, U+2029, U+202F
  if (c == 0xe2 && b(i + 1) == 0x81 && b(i + 2) == 0x9f) return 3;  // U+205F
  if (c == 0xe3 && b(i + 1) == 0x80 && b(i + 2) == 0x80) return 3;  // U+3000
  return 0;
}

using ojson = nlohmann::ordered_json;

// nlohmann's DOM builder, but an integer token beyond 64 bits (which the lexer hands on as a float with
// its text) becomes an exact integer. sax_parse calls the handler through its static type, so hiding
// number_float is enough.
struct ExactIntegers : nlohmann::detail::json_sax_dom_parser<ojson> {
  using Base = nlohmann::detail::json_sax_dom_parser<ojson>;
  using Base::Base;
  bool number_float(double v, const std::string& token) {
    if (token.find_first_of(".eE") != std::string::npos) return Base::number_float(v, token);
    ojson::binary_t digits(std::vector<std::uint8_t>(token.begin(), token.end()), kExactIntegerSubtype);
    return Base::binary(digits);
  }
};

template <typename Input>
ojson parse_exact(Input&& in) {
  ojson result;
  ExactIntegers sax(result, /*allow_exceptions=*/false);
  const bool ok = ojson::sax_parse(std::forward<Input>(in), &sax);
  if (!ok || sax.is_errored()) return ojson(ojson::value_t::discarded);
  return result;
}

bool is_exact_integer(const ojson& v) {
  return v.is_binary() && v.get_binary().has_subtype() && v.get_binary().subtype() == kExactIntegerSubtype;
}

// Every exact integer of `v` replaced by the string marker + digits; false if a string or key of `v`
// already holds the marker.
bool mark_exact(ojson& v, const std::string& marker) {
  if (is_exact_integer(v)) {
    const auto& b = v.get_binary();
    v = marker + std::string(b.begin(), b.end());
    return true;
  }
  if (v.is_string()) return v.get_ref<const std::string&>().find(marker) == std::string::npos;
  if (v.is_object())
    for (auto it = v.begin(); it != v.end(); ++it)
      if (it.key().find(marker) != std::string::npos || !mark_exact(it.value(), marker)) return false;
  if (v.is_array())
    for (auto& x : v)
      if (!mark_exact(x, marker)) return false;
  return true;
}

}  // namespace

ojson parse_json_exact(const std::string& text) { return parse_exact(text); }
ojson parse_json_exact(std::istream& in) { return parse_exact(in); }

ojson exact_integer(const std::string& digits) {
  const size_t start = !digits.empty() && digits[0] == '-' ? 1 : 0;
  AERIE_CHECK(digits.size() > start && digits.find_first_not_of("0123456789", start) == std::string::npos,
              "exact_integer: '" << digits << "' is no integer");
  const ojson parsed = parse_exact(digits);
  AERIE_CHECK(!parsed.is_discarded(), "exact_integer: '" << digits << "' is no JSON integer (a leading zero?)");
  return parsed;
}

std::string dump_exact(const ojson& value) {
  const auto dump = [](const ojson& v) { return v.dump(-1, ' ', false, ojson::error_handler_t::replace); };
  bool any = false;
  const std::function<void(const ojson&)> scan = [&](const ojson& v) {
    if (is_exact_integer(v)) any = true;
    if (v.is_object() || v.is_array())
      for (const auto& x : v) scan(x);
  };
  scan(value);
  if (!any) return dump(value);
  // Each exact integer as a marked string, dumped, then the quoted markers replaced by the digits. The
  // marker starts with U+0001 (dumped as \u0001) and is one that no string or key of the value holds.
  for (int k = 0;; ++k) {
    const std::string marker = "\x01" "aerie-exact-integer-" + std::to_string(k) + ":";
    ojson marked = value;
    if (!mark_exact(marked, marker)) continue;
    const std::string text = dump(marked);
    const std::string quoted = "\"\\u0001aerie-exact-integer-" + std::to_string(k) + ":";
    std::string out;
    size_t at = 0;
    for (size_t p = text.find(quoted); p != std::string::npos; p = text.find(quoted, at)) {
      out.append(text, at, p - at);
      const size_t digits = p + quoted.size(), end = text.find('"', digits);
      out.append(text, digits, end - digits);
      at = end + 1;
    }
    out.append(text, at, std::string::npos);
    return out;
  }
}

std::string python_json(const nlohmann::ordered_json& value, int indent) {
  std::string out;
  put(out, value, indent, 0);
  return out;
}

std::string py_strip(const std::string& s) {
  size_t b = 0;
  while (b < s.size()) {
    size_t n = space_at(s, b);
    if (n == 0) break;
    b += n;
  }
  // From the right: find the end of the last non-space character by scanning forward.
  size_t e = b, i = b;
  while (i < s.size()) {
    size_t n = space_at(s, i);
    if (n) {
      i += n;
    } else {
      ++i;
      while (i < s.size() && (static_cast<unsigned char>(s[i]) & 0xc0) == 0x80) ++i;
      e = i;
    }
  }
  return s.substr(b, e - b);
}

std::string strip_chars(const std::string& s, const std::string& chars, bool left, bool right) {
  size_t b = 0, e = s.size();
  if (left)
    while (b < e && chars.find(s[b]) != std::string::npos) ++b;
  if (right)
    while (e > b && chars.find(s[e - 1]) != std::string::npos) --e;
  return s.substr(b, e - b);
}

namespace {

std::string trim_blanks(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

void put_utf8(std::string& out, unsigned cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

}  // namespace

std::map<std::string, std::string> read_ini(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  AERIE_CHECK(in, "cannot open chat template file " << path);
  std::map<std::string, std::string> out;
  std::string line, section = "template";
  int no = 0;
  while (std::getline(in, line)) {
    ++no;
    const std::string t = trim_blanks(line);
    if (t.empty() || t[0] == ';' || t[0] == '#') continue;
    if (t[0] == '[') {
      AERIE_CHECK(t.back() == ']' && t.size() > 2, path << ":" << no << ": bad section header '" << t << "'");
      section = trim_blanks(t.substr(1, t.size() - 2));
      continue;
    }
    const size_t eq = t.find('=');
    AERIE_CHECK(eq != std::string::npos && eq > 0, path << ":" << no << ": expected 'key = value', got '" << t << "'");
    const std::string key = section + "." + trim_blanks(t.substr(0, eq));
    std::string raw = trim_blanks(t.substr(eq + 1)), value;
    if (raw.size() >= 2 && raw.front() == '"' && raw.back() == '"') {
      for (size_t i = 1; i + 1 < raw.size(); ++i) {
        char c = raw[i];
        if (c != '\\') {
          value += c;
          continue;
        }
        AERIE_CHECK(i + 2 < raw.size(), path << ":" << no << ": a value ends with a lone backslash");
        char n = raw[++i];
        if (n == 'n') value += '\n';
        else if (n == 't') value += '\t';
        else if (n == 'r') value += '\r';
        else if (n == '\\') value += '\\';
        else if (n == '"') value += '"';
        else if (n == 'u' && i + 4 < raw.size()) {
          put_utf8(value, static_cast<unsigned>(std::stoul(raw.substr(i + 1, 4), nullptr, 16)));
          i += 4;
        } else {
          AERIE_THROW(path << ":" << no << ": unknown escape '\\" << n << "'");
        }
      }
    } else {
      value = raw;
    }
    AERIE_CHECK(!out.count(key), path << ":" << no << ": key '" << key << "' given twice");
    out[key] = value;
  }
  return out;
}

}  // namespace aerie::chat
