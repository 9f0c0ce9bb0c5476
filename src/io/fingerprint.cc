// Provenance fingerprints (see fingerprint.h).
#include "io/fingerprint.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace aerie {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------- SHA-256

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  AERIE_CHECK(ctx_ != nullptr && EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(ctx_), EVP_sha256(), nullptr) == 1,
              "SHA-256: OpenSSL cannot start a digest");
}

Sha256::~Sha256() { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_)); }

void Sha256::update(const void* data, size_t n) {
  AERIE_CHECK(EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), data, n) == 1, "SHA-256: update failed");
}

std::string Sha256::hex() {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  AERIE_CHECK(EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(ctx_), md, &n) == 1, "SHA-256: final failed");
  std::string out;
  char buf[3];
  for (unsigned int i = 0; i < n; ++i) {
    std::snprintf(buf, sizeof buf, "%02x", md[i]);
    out += buf;
  }
  return out;
}

std::string sha256_hex(const std::string& bytes) {
  Sha256 h;
  h.update(bytes);
  return h.hex();
}

std::string sha256_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  AERIE_CHECK(in, "cannot open " << path << " to hash it");
  Sha256 h;
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    if (in.gcount() > 0) h.update(buf.data(), static_cast<size_t>(in.gcount()));
  }
  AERIE_CHECK(in.eof(), "read error in " << path << " while hashing it");
  return h.hex();
}

void hash_sampled_range(Sha256& h, const std::string& path, int64_t begin, int64_t end, int blocks, int64_t block) {
  AERIE_CHECK(begin <= end && blocks >= 2 && block > 0, "hash_sampled_range: bad range of " << path);
  std::ifstream in(path, std::ios::binary);
  AERIE_CHECK(in, "cannot open " << path << " to fingerprint it");
  std::vector<char> buf;
  auto read = [&](int64_t at, int64_t n) {
    buf.resize(static_cast<size_t>(n));
    in.seekg(at);
    in.read(buf.data(), n);
    AERIE_CHECK(in.gcount() == n, "fingerprint: cannot read bytes [" << at << ", " << at + n << ") of " << path);
    h.update(buf.data(), static_cast<size_t>(n));
  };
  const int64_t len = end - begin;
  if (len <= blocks * block) {
    for (int64_t at = begin; at < end; at += block) read(at, std::min(block, end - at));
    return;
  }
  for (int i = 0; i < blocks; ++i) read(begin + (len - block) * i / (blocks - 1), block);
}

// ---------------------------------------------------------------------------------------------- targets

namespace {

std::string canonical_config_sha256(const std::string& dir) {
  const std::string path = (fs::path(dir) / "config.json").string();
  std::ifstream in(path);
  AERIE_CHECK(in, "fingerprint: no config.json in " << dir);
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  AERIE_CHECK(!j.is_discarded() && j.is_object(), "fingerprint: " << path << " is not a JSON object");
  j.erase("_name_or_path");
  j.erase("transformers_version");
  return sha256_hex(j.dump());
}

std::string short_hash(const std::string& h) { return h.size() > 12 ? h.substr(0, 12) + ".." : h; }

}  // namespace

TargetFingerprint TargetFingerprint::of_model(const std::string& dir) {
  TargetFingerprint f;
  f.config_sha256 = canonical_config_sha256(dir);
  std::vector<std::string> files;
  const fs::path single = fs::path(dir) / "model.safetensors", index = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(single)) {
    files.push_back(single.filename().string());
  } else if (fs::exists(index)) {
    std::ifstream in(index);
    nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    AERIE_CHECK(!j.is_discarded() && j.contains("weight_map") && j["weight_map"].is_object(),
                "fingerprint: " << index.string() << ": no weight_map object");
    std::set<std::string> names;
    for (auto& [tensor, file] : j["weight_map"].items())
      if (file.is_string()) names.insert(file.get<std::string>());
    files.assign(names.begin(), names.end());
  } else {
    return f;  // config.json only (extract --random-weights): no weights to fingerprint
  }
  Sha256 h;
  for (const std::string& name : files) {
    const std::string path = (fs::path(dir) / name).string();
    std::error_code ec;
    const int64_t size = static_cast<int64_t>(fs::file_size(path, ec));
    AERIE_CHECK(!ec, "fingerprint: cannot stat " << path << ": " << ec.message());
    h.update(name + '\0' + std::to_string(size) + '\0');
    // The 8-byte header length and the JSON header, then samples of the data.
    std::ifstream in(path, std::ios::binary);
    unsigned char len8[8] = {};
    in.read(reinterpret_cast<char*>(len8), 8);
    AERIE_CHECK(in.gcount() == 8, "fingerprint: " << path << " is not a safetensors file (shorter than 8 bytes)");
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | len8[i];
    AERIE_CHECK(static_cast<int64_t>(8 + n) <= size, "fingerprint: " << path << ": header of " << n
                                                                      << " bytes is longer than the file");
    hash_sampled_range(h, path, 0, static_cast<int64_t>(8 + n), 2, static_cast<int64_t>(8 + n));  // all of it: one block
    hash_sampled_range(h, path, static_cast<int64_t>(8 + n), size);
    ++f.files;
    f.bytes += size;
  }
  f.weights_sha256 = h.hex();
  return f;
}

TargetFingerprint TargetFingerprint::of_random(const std::string& dir, uint64_t seed) {
  TargetFingerprint f;
  f.config_sha256 = canonical_config_sha256(dir);
  f.weights_sha256 = "random-weights:" + std::to_string(seed);
  return f;
}

std::string TargetFingerprint::difference(const TargetFingerprint& o) const {
  if (!config_sha256.empty() && !o.config_sha256.empty() && config_sha256 != o.config_sha256)
    return "config.json differs";
  if (!weights_sha256.empty() && !o.weights_sha256.empty() && weights_sha256 != o.weights_sha256) {
    if (random() || o.random()) return "the weights differ (" + (random() ? weights_sha256 : std::string("a checkpoint")) +
                                       " against " + (o.random() ? o.weights_sha256 : std::string("a checkpoint")) + ")";
    return "the weights differ (the same config.json: another checkpoint of the same shape)";
  }
  return "";
}

std::string TargetFingerprint::describe() const {
  std::ostringstream os;
  os << "config sha256 " << short_hash(config_sha256) << ", weights ";
  if (weights_sha256.empty())
    os << "not recorded";
  else if (random())
    os << weights_sha256;
  else
    os << "sha256 " << short_hash(weights_sha256);
  if (files > 0) os << " (" << files << " file" << (files == 1 ? "" : "s") << ", " << bytes << " bytes)";
  return os.str();
}

}  // namespace aerie
