// Small text helpers of the chat templates: JSON written the way Python's json.dumps writes it (what the
// Jinja filter `tojson` of transformers produces), Python's str.strip, and a tiny INI reader.
#pragma once
#include <cstdint>
#include <istream>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

namespace aerie::chat {

/// `value` as Python's json.dumps(value, ensure_ascii=False, indent=indent) writes it (transformers' `tojson`):
/// separators ", " and ": " (indent < 0) or "," and ": " with newlines and `indent` spaces per level
/// (indent >= 0); keys in the order given; non-ASCII kept as UTF-8; '"', '\\', \b \f \n \r \t escaped and
/// other control characters as \u00XX. Integers as digits; floats in the shortest form that reads back
/// ("1.5", "1e-07"; Python writes exponents from 1e16 up and below 1e-4, like this). Source: CPython
/// Lib/json/encoder.py; transformers utils/chat_template_utils.py (tojson).
/// Integers beyond 64 bits (as parse_json_exact keeps them) are written as their digits, as Python does.
std::string python_json(const nlohmann::ordered_json& value, int indent = -1);

/// The binary subtype that marks an exact integer: its bytes are the decimal digits (optional '-').
inline constexpr std::uint64_t kExactIntegerSubtype = 0xA1E;

/// JSON text parsed as Python's json.loads reads it, as far as python_json writes it back: an integer
/// beyond int64/uint64 (Python's int is unbounded; nlohmann reads it as a double, "1.2345678901234568e+23")
/// keeps its digits, as a binary value of subtype kExactIntegerSubtype; everything else as
/// ordered_json::parse. A `discarded` value when the text is no valid JSON (allow_exceptions false).
/// Such a value is neither a number nor a string to the code that reads fields (a field that must be a
/// number refuses it as one that is not). Source: CPython Lib/json/decoder.py (int(integer) for integers).
nlohmann::ordered_json parse_json_exact(const std::string& text);
nlohmann::ordered_json parse_json_exact(std::istream& in);
/// An integer from its decimal text (optional '-', digits): an int64 / uint64 where it fits, else the
/// exact form of parse_json_exact. Throws aerie::Error when `digits` is no integer.
nlohmann::ordered_json exact_integer(const std::string& digits);
/// `value`.dump(-1, ' ', false, error_handler_t::replace) with the exact integers of parse_json_exact as
/// their digits: a record written back keeps them.
std::string dump_exact(const nlohmann::ordered_json& value);

/// Python's str.strip() / lstrip() / rstrip() without arguments: removes the Unicode whitespace that
/// str.isspace() accepts (ASCII \t\n\v\f\r, \x1c-\x1f, space, U+0085, U+00A0, U+1680, U+2000-U+200A,
/// U+2028, U+2029, U+202F, U+205F, U+3000) from the ends of UTF-8 `s`. Jinja's `trim` filter is strip().
std::string py_strip(const std::string& s);
/// Removes the characters of `chars` (bytes, ASCII) from the start / end of `s` (Python s.lstrip(chars)).
std::string strip_chars(const std::string& s, const std::string& chars, bool left, bool right);

/// A parsed INI file: "section.key" -> value. Lines: "[section]", "key = value", comments starting with ';'
/// or '#', blank lines. A value is the text after '=' with surrounding blanks removed; a value in double
/// quotes keeps its blanks and reads the escapes \n \t \r \\ \" \uXXXX. Keys before any section belong to
/// section "template". Throws aerie::Error naming path:line on a malformed line or a key given twice.
std::map<std::string, std::string> read_ini(const std::string& path);

}  // namespace aerie::chat
