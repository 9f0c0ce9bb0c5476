// safetensors: round trips of every dtype, the byte layout of the spec, and errors on damaged files.
#include "io/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "core/error.h"
#include "test_util.h"

namespace aerie {

namespace {

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}
void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f << bytes;
}
// A file with the given JSON header and data buffer.
std::string make_file(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((header.size() >> (8 * i)) & 0xFF);
  return out + header + data;
}
// EXPECTs that loading `path` throws aerie::Error whose message contains the path and `fragment`.
void expect_load_error(const std::string& path, const std::string& fragment) {
  try {
    load_safetensors(path);
    ADD_FAILURE() << "no error for " << path;
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find(fragment), std::string::npos) << "'" << fragment << "' not in: " << msg;
  }
}

}  // namespace

TEST(Safetensors, RoundTripEveryDtype) {
  const std::string path = testing::scratch_dir("safetensors_roundtrip") + "/t.safetensors";
  SafetensorsFile f;
  f.tensors["f32"] = Tensor::from_vector<float>({1.5f, -2.0f, 3.25f, 1e-30f, -0.0f, 7.0f}, {2, 3});
  f.tensors["bf16"] = Tensor::from_vector<float>({1.0f, -0.5f, 256.0f}, {3}).to(DType::BF16);
  f.tensors["i32"] = Tensor::from_vector<int32_t>({-7, 0, 2147483647}, {3, 1});
  f.tensors["i64"] = Tensor::from_vector<int64_t>({-(int64_t{1} << 40), 5}, {2});
  f.tensors["u8"] = Tensor::from_vector<uint8_t>({0, 255, 17}, {3});
  f.tensors["scalar"] = Tensor::from_vector<float>({42.0f}, {});
  f.tensors["empty"] = Tensor::zeros({0, 4}, DType::F32);
  f.metadata["format"] = "pt";
  f.metadata["note"] = "\xC3\xA9t\xC3\xA9";
  save_safetensors(path, f);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));

  const SafetensorsFile g = load_safetensors(path);
  EXPECT_EQ(g.metadata, f.metadata);
  ASSERT_EQ(g.tensors.size(), f.tensors.size());
  for (const auto& [name, t] : f.tensors) {
    const Tensor& u = g.tensors.at(name);
    EXPECT_EQ(u.dtype(), t.dtype()) << name;
    EXPECT_EQ(u.shape(), t.shape()) << name;
    ASSERT_EQ(u.nbytes(), t.nbytes()) << name;
    EXPECT_EQ(std::memcmp(u.raw(), t.raw(), t.nbytes()), 0) << name;
  }
  // Byte layout: u64 header size, JSON padded to 8 bytes, then the data in name order.
  const std::string bytes = read_bytes(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + 4 * 6 + 2 * 3 + 4 * 3 + 8 * 2 + 3 + 4);
}

TEST(Safetensors, BoolWrittenAsBoolReadAsU8) {
  const std::string path = testing::scratch_dir("safetensors_bool") + "/t2d.safetensors";
  SafetensorsFile f;
  f.tensors["t2d"] = Tensor::from_vector<uint8_t>({1, 0, 1, 1}, {4});
  save_safetensors(path, f, {"t2d"});
  EXPECT_NE(read_bytes(path).find("\"BOOL\""), std::string::npos);
  const SafetensorsFile g = load_safetensors(path);
  EXPECT_EQ(g.tensors.at("t2d").dtype(), DType::U8);
  EXPECT_EQ(g.tensors.at("t2d").to_float_vector(), (std::vector<float>{1, 0, 1, 1}));
  EXPECT_THROW(save_safetensors(path, f, {"missing"}), Error);
  f.tensors["x"] = Tensor::zeros({2}, DType::F32);
  EXPECT_THROW(save_safetensors(path, f, {"x"}), Error);  // BOOL must hold U8
}

TEST(Safetensors, ReadsAHandWrittenSpecFile) {
  // Header and data written by hand from the format spec (as the Python safetensors package writes it).
  const std::string dir = testing::scratch_dir("safetensors_spec");
  const std::string hdr =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"I32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"BF16","shape":[1,2],"data_offsets":[8,12]}})";
  std::string data("\x01\x00\x00\x00\xFE\xFF\xFF\xFF\x80\x3F\x00\xC0", 12);  // 1, -2 | 1.0, -2.0
  write_bytes(dir + "/spec.safetensors", make_file(hdr, data));
  const SafetensorsFile g = load_safetensors(dir + "/spec.safetensors");
  EXPECT_EQ(g.tensors.at("a").to_float_vector(), (std::vector<float>{1, -2}));
  EXPECT_EQ(g.tensors.at("b").shape(), (Shape{1, 2}));
  EXPECT_EQ(g.tensors.at("b").to_float_vector(), (std::vector<float>{1.0f, -2.0f}));
  EXPECT_EQ(g.metadata.at("format"), "pt");
}

TEST(Safetensors, DamagedFilesThrowNamingFileAndTensor) {
  const std::string dir = testing::scratch_dir("safetensors_errors");
  SafetensorsFile f;
  f.tensors["weight"] = Tensor::from_vector<float>({1, 2, 3, 4}, {2, 2});
  save_safetensors(dir + "/good.safetensors", f);
  const std::string good = read_bytes(dir + "/good.safetensors");

  write_bytes(dir + "/trunc_data.safetensors", good.substr(0, good.size() - 3));
  expect_load_error(dir + "/trunc_data.safetensors", "weight");
  write_bytes(dir + "/trunc_header.safetensors", good.substr(0, 20));
  expect_load_error(dir + "/trunc_header.safetensors", "truncated");
  write_bytes(dir + "/tiny.safetensors", good.substr(0, 5));
  expect_load_error(dir + "/tiny.safetensors", "truncated");

  write_bytes(dir + "/bad_json.safetensors", make_file("{\"weight\": {\"dtype\": ", std::string(16, '\0')));
  expect_load_error(dir + "/bad_json.safetensors", "JSON");
  write_bytes(dir + "/huge_header.safetensors", std::string("\xff\xff\xff\xff\xff\x00\x00\x00{}", 10));
  expect_load_error(dir + "/huge_header.safetensors", "header size");

  const std::string data(16, '\0');
  write_bytes(dir + "/past_end.safetensors",
              make_file(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})", data));
  expect_load_error(dir + "/past_end.safetensors", "'w'");
  write_bytes(dir + "/wrong_span.safetensors",
              make_file(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", data));
  expect_load_error(dir + "/wrong_span.safetensors", "'w'");
  write_bytes(dir + "/reversed.safetensors",
              make_file(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[8,4]}})", data));
  expect_load_error(dir + "/reversed.safetensors", "'w'");
  write_bytes(dir + "/negative.safetensors",
              make_file(R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[-4,0]}})", data));
  expect_load_error(dir + "/negative.safetensors", "'w'");
  write_bytes(dir + "/f64.safetensors", make_file(R"({"h":{"dtype":"F64","shape":[2],"data_offsets":[0,16]}})", data));
  expect_load_error(dir + "/f64.safetensors", "F64");  // F16 is read since issue 4; F64 is not
  write_bytes(dir + "/no_shape.safetensors", make_file(R"({"w":{"dtype":"F32","data_offsets":[0,16]}})", data));
  expect_load_error(dir + "/no_shape.safetensors", "'w'");
  expect_load_error(dir + "/does_not_exist.safetensors", "cannot open");
}

TEST(Safetensors, ReadsTheConvertedStories260K) {
  if (!testing::have_model()) GTEST_SKIP() << "no converted model in " << testing::model_dir();
  const SafetensorsFile g = load_safetensors(testing::model_dir() + "/model.safetensors");
  EXPECT_EQ(g.tensors.size(), 2u + 9u * 5u);  // embed + final norm + 9 per layer; lm_head tied
  EXPECT_EQ(g.tensors.at("model.embed_tokens.weight").shape(), (Shape{512, 64}));
  EXPECT_EQ(g.tensors.at("model.layers.4.self_attn.k_proj.weight").shape(), (Shape{32, 64}));
  EXPECT_EQ(g.tensors.at("model.layers.0.mlp.down_proj.weight").shape(), (Shape{64, 172}));
  EXPECT_EQ(g.tensors.at("model.norm.weight").dtype(), DType::F32);
  EXPECT_EQ(g.tensors.count("lm_head.weight"), 0u);
}

}  // namespace aerie
