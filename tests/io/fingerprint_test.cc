// Provenance fingerprints (io/fingerprint.h): SHA-256 against the FIPS 180-2 vectors, and the target's
// fingerprint: the same for a copy elsewhere or a re-saved config.json, another one for other weights of the
// same shape (named as such), another config, random weights, a sharded checkpoint.
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/fingerprint.h"
#include "io/safetensors.h"
#include "test_util.h"

namespace aerie {
namespace {

namespace fs = std::filesystem;

TEST(Sha256, KnownVectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const std::string m = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  const std::string want = "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1";
  EXPECT_EQ(sha256_hex(m), want);
  Sha256 h;  // incremental, in two pieces
  h.update(m.substr(0, 13));
  h.update(m.substr(13));
  EXPECT_EQ(h.hex(), want);
}

Tensor full(int64_t rows, int64_t cols, float v) {
  return Tensor::from_vector(std::vector<float>(static_cast<size_t>(rows * cols), v), {rows, cols});
}

// A tiny model folder: config.json and model.safetensors with one [rows, 64] F32 tensor of value `v`.
void write_model(const std::string& dir, float v, int layers = 2, int64_t rows = 8) {
  fs::create_directories(dir);
  nlohmann::json c = {{"model_type", "llama"}, {"hidden_size", 64}, {"num_hidden_layers", layers},
                      {"_name_or_path", dir}, {"transformers_version", "4.0"}};
  std::ofstream(dir + "/config.json") << c.dump(2);
  SafetensorsFile f;
  f.tensors["model.embed_tokens.weight"] = full(rows, 64, v);
  save_safetensors(dir + "/model.safetensors", f);
}

TEST(TargetFingerprint, SameForACopyOtherForOtherWeightsOrConfig) {
  const std::string d = testing::scratch_dir("fingerprint_target");
  write_model(d + "/a", 1.0f);
  const TargetFingerprint a = TargetFingerprint::of_model(d + "/a");
  EXPECT_EQ(a.config_sha256.size(), 64u);
  EXPECT_EQ(a.weights_sha256.size(), 64u);
  EXPECT_EQ(a.files, 1);
  EXPECT_EQ(a.bytes, static_cast<int64_t>(fs::file_size(d + "/a/model.safetensors")));

  // A copy elsewhere, its config.json re-saved with other whitespace, _name_or_path, transformers_version.
  write_model(d + "/copy", 1.0f);
  nlohmann::json c = nlohmann::json::parse(std::ifstream(d + "/copy/config.json"));
  c["transformers_version"] = "4.99";
  std::ofstream(d + "/copy/config.json") << c.dump();
  const TargetFingerprint copy = TargetFingerprint::of_model(d + "/copy");
  EXPECT_EQ(copy.config_sha256, a.config_sha256);
  EXPECT_EQ(copy.weights_sha256, a.weights_sha256);
  EXPECT_EQ(a.difference(copy), "");

  write_model(d + "/other_weights", 1.5f);  // another model of the same shape
  const TargetFingerprint w = TargetFingerprint::of_model(d + "/other_weights");
  EXPECT_EQ(w.config_sha256, a.config_sha256);
  EXPECT_NE(w.weights_sha256, a.weights_sha256);
  EXPECT_EQ(a.difference(w), "the weights differ (the same config.json: another checkpoint of the same shape)");

  write_model(d + "/other_layers", 1.0f, 3);
  EXPECT_EQ(a.difference(TargetFingerprint::of_model(d + "/other_layers")), "config.json differs");

  // Random weights: compared by seed; config.json only.
  const TargetFingerprint r3 = TargetFingerprint::of_random(d + "/a", 3);
  EXPECT_EQ(r3.weights_sha256, "random-weights:3");
  EXPECT_TRUE(r3.random());
  EXPECT_EQ(r3.difference(TargetFingerprint::of_random(d + "/copy", 3)), "");
  EXPECT_NE(r3.difference(TargetFingerprint::of_random(d + "/a", 4)), "");
  EXPECT_NE(r3.difference(a).find("the weights differ (random-weights:3 against a checkpoint)"), std::string::npos);
  // Unrecorded parts are not compared.
  TargetFingerprint none;
  EXPECT_EQ(a.difference(none), "");
  EXPECT_NE(a.describe().find("config sha256 " + a.config_sha256.substr(0, 12)), std::string::npos) << a.describe();
}

TEST(TargetFingerprint, SampledBlocksOfALargeFileSeeOtherValues) {
  // 4096 rows x 64 floats = 1 MiB of data, far more than the 16 sampled 4 KiB blocks: a fine-tune changes
  // every value, so every block; here all rows change.
  const std::string d = testing::scratch_dir("fingerprint_large");
  write_model(d + "/a", 1.0f, 2, 4096);
  write_model(d + "/b", 1.0f + 1e-3f, 2, 4096);
  EXPECT_NE(TargetFingerprint::of_model(d + "/a").weights_sha256, TargetFingerprint::of_model(d + "/b").weights_sha256);
}

TEST(TargetFingerprint, ShardedCheckpointAndErrors) {
  const std::string d = testing::scratch_dir("fingerprint_sharded");
  write_model(d + "/m", 1.0f);
  fs::rename(d + "/m/model.safetensors", d + "/m/model-00001-of-00002.safetensors");
  SafetensorsFile f;
  f.tensors["lm_head.weight"] = full(4, 64, 2.0f);
  save_safetensors(d + "/m/model-00002-of-00002.safetensors", f);
  nlohmann::json index = {{"weight_map",
                           {{"model.embed_tokens.weight", "model-00001-of-00002.safetensors"},
                            {"lm_head.weight", "model-00002-of-00002.safetensors"}}}};
  std::ofstream(d + "/m/model.safetensors.index.json") << index.dump();
  const TargetFingerprint s = TargetFingerprint::of_model(d + "/m");
  EXPECT_EQ(s.files, 2);
  EXPECT_EQ(s.weights_sha256.size(), 64u);

  fs::remove(d + "/m/model.safetensors.index.json");
  fs::remove(d + "/m/model-00001-of-00002.safetensors");
  fs::remove(d + "/m/model-00002-of-00002.safetensors");
  EXPECT_EQ(TargetFingerprint::of_model(d + "/m").weights_sha256, "");  // config.json only
  fs::create_directories(d + "/empty");
  try {
    TargetFingerprint::of_model(d + "/empty");
    FAIL() << "no config.json";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no config.json in " + d + "/empty"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace aerie
