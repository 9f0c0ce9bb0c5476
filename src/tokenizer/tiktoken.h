// Tokenizers in tiktoken form (OpenAI's tiktoken; Moonshot AI's Kimi-K2, K2-Thinking, K2.5 and K2.6 ship
// one as tiktoken.model): a file of token bytes by rank, a split regex and special tokens after the ranks.
// tiktoken encodes so (tiktoken src/lib.rs, CoreBPE::encode): special tokens are cut out of the text
// first; every match of the split regex is a piece (text between matches is skipped); a piece that is a
// token is that token, else its bytes are merged pair by pair, the adjacent pair whose concatenation has
// the lowest rank first (leftmost on ties), until no adjacent pair is a token.
//
// That is byte-level BPE with merges (a, b) -> a+b of rank rank(a+b) and ignore_merges, so the folder is
// loaded into ByteLevelBpe (tokenizer/byte_level.h): the bytes go through GPT-2's byte -> unicode map
// there and back on decode, a bijection that changes no id. Internal to src/tokenizer; use
// Tokenizer::load.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "tokenizer/byte_level.h"

namespace aerie::tok {

/// The split regex of Kimi's tokenization_kimi.py (TikTokenTokenizer.pat_str, the same in every public
/// copy): Han runs, letter runs with an optional leading non-letter and English contractions (cased
/// letter classes without Han, by class intersection "&&"), 1-3 digits, punctuation runs, whitespace.
extern const char* const kKimiPattern;

/// Token bytes by rank from a tiktoken BPE file (tiktoken's load_tiktoken_bpe): one line
/// "<base64 of the token's bytes> <rank>" per token, empty lines skipped. Returns the bytes of rank r at
/// [r]. Throws aerie::Error naming `path` and the line on a line that is not "<base64> <decimal rank>",
/// bad base64, an empty token, a rank given twice; naming `path` on a missing rank (ranks are 0..n-1).
std::vector<std::string> read_tiktoken_ranks(const std::string& path);

/// The tokenizer of folder `dir`: dir/tiktoken.model, dir/pat_str.txt when present (the split regex,
/// one line; else kKimiPattern) and dir/tokenizer_config.json when present. Special tokens as Kimi's
/// tokenization_kimi.py makes them: ids n .. n+255 after the n ranks, named by the config's
/// "added_tokens_decoder" ({"163584": {"content": "[BOS]", "special": true, ...}}), the other ids
/// "<|reserved_token_ID|>" (special). All of them are matched in the text (tiktoken's
/// allowed_special="all", as tokenization_kimi.py encodes); decode drops those with "special": true
/// (the tool-call tokens of Kimi-K2 are not). BOS/EOS are left to the caller (Tokenizer::load reads
/// bos_token / eos_token of the config). Throws aerie::Error naming the file on a bad file or a vocabulary
/// without the 256 single bytes.
std::unique_ptr<ByteLevelBpe> load_tiktoken_folder(const std::string& dir);

}  // namespace aerie::tok
