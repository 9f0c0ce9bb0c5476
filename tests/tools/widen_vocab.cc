// widen_vocab: a tiny random-weight fixture checkpoint (tests/model/fixtures/hf, vocabulary 256) turned
// into a target whose vocabulary is that of a real tokenizer, so that the whole pipeline (prepare with the
// model's chat template, extract, vocab, train, export, eval) runs on it with real text. Used by
// tests/mpi/deepseek_chat_pipeline.sh at test time (nothing of its output is committed).
//
//   widen_vocab FIXTURE_DIR TOKENIZER_DIR VOCAB_SIZE OUTPUT_DIR
//
// FIXTURE_DIR   a Hugging Face checkpoint folder: config.json and model.safetensors, or shards with
//               model.safetensors.index.json; DeepSeek-V3 layout (model.embed_tokens.weight, lm_head.weight)
//               or Kimi-K2.5's wrapper (language_model.model.embed_tokens.weight,
//               language_model.lm_head.weight, config under text_config).
// TOKENIZER_DIR a folder with tokenizer.json (+ tokenizer_config.json), or Kimi's tiktoken.model +
//               tokenizer_config.json; its files are copied into OUTPUT_DIR, so that OUTPUT_DIR is the
//               model folder and the tokenizer folder at once (eval reads the tokenizer from --model).
// VOCAB_SIZE    rows of the widened embed_tokens and lm_head: the real model's vocab_size (DeepSeek-V3
//               129280, Kimi-K2 / K2.5 163840), at least the tokenizer's vocab_size().
//
// What changes; everything else is copied: a shard without these two tensors as the file it is, the other
// tensors of the shard that holds them with their bytes, dtypes and the file's __metadata__ (the header
// rewritten by save_safetensors), the shard layout and the index's weight_map, every config key not named
// here:
//  - embed_tokens and lm_head [V_old, H] become [VOCAB_SIZE, H] in their stored dtype (bf16 in the
//    fixtures): rows 0..V_old-1 are the fixture's, bit for bit; each new element is uniform in [-m, m],
//    m = the largest |value| of that fixture tensor (the fixtures draw these rows uniform in [-0.3, 0.3]),
//    rounded to the dtype, from splitmix64 seeded with the FNV-1a hash of the tensor name: the output is
//    the same on every run and machine;
//  - config.json: vocab_size (in text_config for Kimi-K2.5, also at the top level where the fixture has
//    one), and bos_token_id / eos_token_id / pad_token_id wherever the fixture has them (top level and
//    text_config), set to the tokenizer's BOS, EOS and tokenizer_config.json's pad_token (a key whose
//    token the tokenizer lacks is removed); the index's metadata.total_size is recomputed.
// Keys aerie does not read (e.g. Kimi-K2.5's media_placeholder_token_id) are left as they are.
//
// Exit status 0 on success; 1 with a message on stderr on any error (a missing file, a fixture without
// both tensors, tied embeddings, VOCAB_SIZE below the fixture's or the tokenizer's vocabulary).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "core/tensor.h"
#include "io/safetensors.h"
#include "tokenizer/tokenizer.h"

namespace {

namespace fs = std::filesystem;
using aerie::DType;
using aerie::Tensor;

const std::set<std::string> kVocabTensors = {"model.embed_tokens.weight", "lm_head.weight",
                                             "language_model.model.embed_tokens.weight",
                                             "language_model.lm_head.weight"};

/// splitmix64 (Steele, Lea, Flood 2014): the next 64 random bits of state `s`.
uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// 64-bit FNV-1a of `s`: the seed of a tensor's new rows.
uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

nlohmann::json read_json(const fs::path& p) {
  std::ifstream f(p);
  AERIE_CHECK(f, "cannot open " << p.string());
  try {
    return nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    AERIE_THROW("bad JSON in " << p.string() << ": " << e.what());
  }
}

void write_text(const fs::path& p, const std::string& text) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  AERIE_CHECK(f << text, "cannot write " << p.string());
}

/// `t` [V_old, H] (BF16 or F32, CPU) widened to [rows, H]: the old rows copied, the new ones uniform in
/// [-m, m] (m = max |t|) from splitmix64 seeded by fnv1a(name), rounded to t's dtype. Throws aerie::Error
/// naming the tensor on another rank or dtype, or rows < V_old.
Tensor widen_rows(const Tensor& t, int64_t rows, const std::string& name) {
  AERIE_CHECK(t.ndim() == 2, name << ": " << aerie::shape_str(t.shape()) << " is not [vocab, hidden]");
  AERIE_CHECK(t.dtype() == DType::BF16 || t.dtype() == DType::F32,
              name << ": dtype " << aerie::dtype_name(t.dtype()) << " (only BF16 and F32 are widened)");
  const int64_t old_rows = t.dim(0), H = t.dim(1);
  AERIE_CHECK(rows >= old_rows, name << ": VOCAB_SIZE " << rows << " is below the fixture's " << old_rows << " rows");
  const std::vector<float> v = t.to_float_vector();
  float m = 0;
  for (float x : v) m = std::max(m, std::fabs(x));
  std::vector<float> w(static_cast<size_t>(rows * H));
  std::copy(v.begin(), v.end(), w.begin());
  uint64_t s = fnv1a(name);
  for (size_t i = v.size(); i < w.size(); ++i) {
    const double u = static_cast<double>(splitmix64(s) >> 11) * 0x1.0p-53;  // [0, 1)
    w[i] = static_cast<float>((2 * u - 1) * m);
  }
  Tensor out = Tensor::from_vector(w, {rows, H});
  if (t.dtype() == DType::BF16) {
    out = out.to(DType::BF16);
    // The fixture's rows bit for bit (an f32 round trip of bf16 is exact; this keeps it explicit).
    std::copy(t.data<aerie::bf16>(), t.data<aerie::bf16>() + t.numel(), out.data<aerie::bf16>());
  }
  return out;
}

/// The id of tokenizer_config.json's pad_token (a string or an AddedToken object), -1 if none.
int32_t pad_id(const fs::path& tokenizer_dir, const aerie::Tokenizer& tok) {
  const fs::path p = tokenizer_dir / "tokenizer_config.json";
  if (!fs::exists(p)) return -1;
  const nlohmann::json c = read_json(p);
  if (!c.contains("pad_token") || c["pad_token"].is_null()) return -1;
  const nlohmann::json& pt = c["pad_token"];
  const std::string s = pt.is_string() ? pt.get<std::string>() : pt.value("content", "");
  return s.empty() ? -1 : tok.token_to_id(s);
}

/// Sets vocab_size and the special token ids in one config object (the top level or text_config):
/// vocab_size where `set_vocab` or present, the ids only where the fixture has them.
void patch_config(nlohmann::json& c, int64_t vocab, bool set_vocab, int32_t bos, int32_t eos, int32_t pad) {
  if (set_vocab || c.contains("vocab_size")) c["vocab_size"] = vocab;
  auto set = [&](const char* key, int32_t id) {
    if (!c.contains(key)) return;
    if (id >= 0)
      c[key] = id;
    else
      c.erase(key);
  };
  set("bos_token_id", bos);
  set("eos_token_id", eos);
  set("pad_token_id", pad);
}

void run(const fs::path& fixture, const fs::path& tokenizer_dir, int64_t vocab, const fs::path& out) {
  AERIE_CHECK(fs::is_regular_file(fixture / "config.json"), fixture.string() << ": no config.json");
  auto tok = aerie::Tokenizer::load(tokenizer_dir.string());
  AERIE_CHECK(vocab >= tok->vocab_size(), "VOCAB_SIZE " << vocab << " is below the tokenizer's vocabulary "
                                                        << tok->vocab_size() << " (" << tokenizer_dir.string() << ")");
  fs::create_directories(out);

  // The tensor files: the shards of the index, or model.safetensors.
  const fs::path index_path = fixture / "model.safetensors.index.json";
  std::vector<std::string> files;
  nlohmann::json index;
  if (fs::exists(index_path)) {
    index = read_json(index_path);
    std::set<std::string> seen;
    for (auto& [name, file] : index.at("weight_map").items())
      if (seen.insert(file.get<std::string>()).second) files.push_back(file.get<std::string>());
  } else {
    files.push_back("model.safetensors");
  }
  int widened = 0;
  uint64_t total = 0;
  for (const std::string& f : files) {
    // A file without embed_tokens / lm_head is copied as it is; one with them is rewritten.
    const aerie::SafetensorsReader rd((fixture / f).string());
    bool has_vocab = false;
    for (const auto& [name, e] : rd.entries()) {
      has_vocab = has_vocab || kVocabTensors.count(name) > 0;
      total += kVocabTensors.count(name) ? static_cast<uint64_t>(vocab) * e.shape.at(1) * aerie::dtype_size(e.dtype)
                                         : e.nbytes;
    }
    if (!has_vocab) {
      fs::copy_file(fixture / f, out / f, fs::copy_options::overwrite_existing);
      continue;
    }
    aerie::SafetensorsFile st = aerie::load_safetensors((fixture / f).string());
    for (auto& [name, t] : st.tensors)
      if (kVocabTensors.count(name)) {
        t = widen_rows(t, vocab, name);
        ++widened;
      }
    aerie::save_safetensors((out / f).string(), st);  // the fixtures hold no BOOL tensors
  }
  AERIE_CHECK(widened == 2, fixture.string() << ": found " << widened
                                             << " of embed_tokens and lm_head (tied embeddings are not widened)");
  if (!index.is_null()) {
    index["metadata"]["total_size"] = total;
    write_text(out / "model.safetensors.index.json", index.dump(2) + "\n");
  }

  nlohmann::json cfg = read_json(fixture / "config.json");
  const int32_t bos = tok->bos_id(), eos = tok->eos_id(), pad = pad_id(tokenizer_dir, *tok);
  const bool wrapped = cfg.contains("text_config");
  if (wrapped) patch_config(cfg["text_config"], vocab, true, bos, eos, pad);
  patch_config(cfg, vocab, !wrapped, bos, eos, pad);
  write_text(out / "config.json", cfg.dump(2) + "\n");

  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "tiktoken.model"})
    if (fs::exists(tokenizer_dir / name)) {
      fs::copy_file(tokenizer_dir / name, out / name, fs::copy_options::overwrite_existing);
      fs::permissions(out / name, fs::perms::owner_write, fs::perm_options::add);  // ../shared is read-only
    }
  std::cout << "widen_vocab: " << out.string() << ": vocab " << vocab << " (tokenizer " << tok->vocab_size()
            << ", bos " << bos << ", eos " << eos << ", pad " << pad << ")\n";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::cerr << "usage: widen_vocab FIXTURE_DIR TOKENIZER_DIR VOCAB_SIZE OUTPUT_DIR\n";
    return 1;
  }
  aerie::init_logging(0, "warning");  // the tokenizer's debug lines are not this tool's output
  try {
    char* end = nullptr;
    const long long vocab = std::strtoll(argv[3], &end, 10);
    AERIE_CHECK(end && *end == '\0' && vocab > 0, "VOCAB_SIZE '" << argv[3] << "' is not a positive integer");
    run(argv[1], argv[2], vocab, argv[4]);
  } catch (const std::exception& e) {
    std::cerr << "widen_vocab: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
