// Small text helpers of the chat templates: JSON written the way Python's json.dumps writes it (what the
// Jinja filter `tojson` of transformers produces), Python's str.strip, and a tiny INI reader.
#pragma once
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
std::string python_json(const nlohmann::ordered_json& value, int indent = -1);

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
