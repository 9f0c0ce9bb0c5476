// Shard files: write/read round trip, bf16 rounding, format checks, list_shards, deterministic bytes,
// samples with non-finite hidden states (an error, or left out with NonFinite::Skip).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <thread>

#include "core/fp8.h"
#include "core/version.h"
#include "data/shard.h"
#include "io/h5.h"
#include "test_util.h"

namespace aerie {
namespace {

namespace fs = std::filesystem;

// A value pattern that is not exactly representable in bf16 (so rounding is exercised), with a
// range of magnitudes as in real hidden states.
float pattern(int64_t sample, int64_t t, int64_t j) {
  return std::sin(0.37f * static_cast<float>(sample * 1000 + t * 31 + j)) * std::pow(10.0f, (j % 5) - 2.0f) +
         1e-3f * static_cast<float>(j);
}

struct Sample {
  int64_t index;
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;
  Tensor aux, fin;
};

Sample make_sample(int64_t index, int64_t T, int64_t H) {
  Sample s{index, {}, {}, Tensor::empty({T, 3 * H}, DType::F32), Tensor::empty({T, H}, DType::F32)};
  for (int64_t t = 0; t < T; ++t) {
    s.ids.push_back(static_cast<int32_t>((index * 7 + t * 3) % 500));
    s.mask.push_back(static_cast<uint8_t>((t + index) % 3 != 0));
    for (int64_t j = 0; j < 3 * H; ++j) s.aux.data<float>()[t * 3 * H + j] = pattern(index, t, j);
    for (int64_t j = 0; j < H; ++j) s.fin.data<float>()[t * H + j] = pattern(index + 100, t, j);
  }
  return s;
}

ShardMeta test_meta(int64_t H, int64_t chunk) {
  ShardMeta m;
  m.target_model = "/models/test-target";
  m.aux_layers = {1, 2, 4};
  m.hidden_size = H;
  m.num_hidden_layers = 5;
  m.chunk = chunk;
  return m;
}

std::vector<Sample> write_shard(const std::string& path, int64_t H, int64_t chunk,
                                const std::vector<int64_t>& lengths, int64_t first_index) {
  std::vector<Sample> samples;
  ShardWriter w(path, test_meta(H, chunk), lengths);
  for (size_t k = 0; k < lengths.size(); ++k) {
    samples.push_back(make_sample(first_index + static_cast<int64_t>(k), lengths[k], H));
    const Sample& s = samples.back();
    w.add(s.index, s.ids, s.mask, s.aux, s.fin);
  }
  w.close();
  return samples;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A shard truncated while a reader holds it open (HDF5 reads past the new end as zeros: a helper's train
// ran on with a diverging loss): the next read names the shard and the sample.
TEST(Shard, ReadAfterTruncationNamesTheShard) {
  const std::string dir = testing::scratch_dir("shard_truncated_open");
  const std::string path = dir + "/shard-00000.h5";
  write_shard(path, 16, 0, {40, 40}, 0);
  ShardReader r(path);
  EXPECT_EQ(r.read(1).ids.size(), 40u);
  fs::resize_file(path, fs::file_size(path) / 2);
  const std::string e = testing::error_of([&] { r.read(1); });
  EXPECT_NE(e.find("shard " + path + " sample 1: the file changed since it was opened"), std::string::npos) << e;
  EXPECT_NE(e.find("truncated, replaced or removed while being read"), std::string::npos) << e;
}

TEST(Shard, RoundTripRoundsToBf16) {
  const std::string dir = testing::scratch_dir("shard_round_trip");
  const std::string path = dir + "/" + shard_file_name(3);
  EXPECT_EQ(shard_file_name(3), "shard-00003.h5");
  const int64_t H = 8;
  auto samples = write_shard(path, H, 3, {5, 1, 7}, 192);
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  ShardReader r(path);
  const ShardInfo& info = r.info();
  EXPECT_EQ(info.path, path);
  EXPECT_EQ(info.num_samples, 3);
  EXPECT_EQ(info.num_tokens, 13);
  EXPECT_EQ(info.hidden_size, H);
  EXPECT_EQ(info.num_hidden_layers, 5);
  EXPECT_EQ(info.chunk, 3);
  EXPECT_EQ(info.aux_layers, (std::vector<int>{1, 2, 4}));
  EXPECT_EQ(info.target_model, "/models/test-target");
  EXPECT_EQ(r.sample_length(2), 7);
  for (int64_t i = 0; i < 3; ++i) {
    HiddenSample h = r.read(i);
    const Sample& s = samples[static_cast<size_t>(i)];
    EXPECT_EQ(h.sample_index, s.index);
    EXPECT_EQ(h.ids, s.ids);
    EXPECT_EQ(h.loss_mask, s.mask);
    ASSERT_EQ(h.aux_hidden.dtype(), DType::F32);
    ASSERT_EQ(h.aux_hidden.shape(), (Shape{s.aux.dim(0), 3 * H}));
    ASSERT_EQ(h.final_hidden.shape(), (Shape{s.fin.dim(0), H}));
    // Stored as bf16: the read values are exactly the round-to-nearest-even bf16 of the written fp32.
    auto aux = h.aux_hidden.to_float_vector(), fin = h.final_hidden.to_float_vector();
    auto aux_ref = s.aux.to_float_vector(), fin_ref = s.fin.to_float_vector();
    int changed = 0;
    for (size_t j = 0; j < aux.size(); ++j) {
      ASSERT_EQ(aux[j], round_bf16(aux_ref[j])) << "sample " << i << " aux[" << j << "]";
      changed += aux[j] != aux_ref[j];
      // bf16 keeps 8 significant bits: rounding to nearest changes a value by at most 2^-8 of it.
      ASSERT_LE(std::fabs(aux[j] - aux_ref[j]), std::ldexp(std::fabs(aux_ref[j]), -8));
    }
    for (size_t j = 0; j < fin.size(); ++j) ASSERT_EQ(fin[j], round_bf16(fin_ref[j])) << "final[" << j << "]";
    EXPECT_GT(changed, 0);  // the pattern really is not bf16-exact
  }
  EXPECT_THROW(r.read(3), Error);
  EXPECT_THROW(r.read(-1), Error);
  // Read as BF16 (a GPU run's samples): the stored values, half the bytes, the same numbers as the F32 read.
  for (int64_t i = 0; i < 3; ++i) {
    HiddenSample f = r.read(i), b = r.read(i, DType::BF16);
    ASSERT_EQ(b.aux_hidden.dtype(), DType::BF16);
    ASSERT_EQ(b.final_hidden.dtype(), DType::BF16);
    EXPECT_EQ(b.aux_hidden.to_float_vector(), f.aux_hidden.to_float_vector()) << "sample " << i;
    EXPECT_EQ(b.final_hidden.to_float_vector(), f.final_hidden.to_float_vector()) << "sample " << i;
    EXPECT_EQ(b.ids, f.ids);
  }
  EXPECT_THROW(r.read(0, DType::F16), Error);
}

TEST(Shard, Bf16InputStoredAsIs) {
  const std::string path = testing::scratch_dir("shard_bf16_in") + "/shard-00000.h5";
  const int64_t H = 4, T = 3;
  Sample s = make_sample(0, T, H);
  ShardWriter w(path, test_meta(H, 0), {T});
  w.add(0, s.ids, s.mask, s.aux.to(DType::BF16), s.fin.to(DType::BF16));
  w.close();
  HiddenSample h = ShardReader(path).read(0);
  EXPECT_EQ(h.aux_hidden.to_float_vector(), s.aux.to(DType::BF16).to_float_vector());
}

TEST(Shard, StoredLayoutIsTheDocumentedOne) {
  // What docs/formats.md promises to h5py users: uint16 bits with dtype="bfloat16", attributes.
  const std::string path = testing::scratch_dir("shard_layout") + "/shard-00001.h5";
  const int64_t H = 4;
  auto samples = write_shard(path, H, 1, {2, 3}, 64);
  h5::File f = h5::File::open(path);
  EXPECT_EQ(f.string_attr("format"), "aerie.hidden_states");
  EXPECT_EQ(f.int_attr("format_version"), 1);
  EXPECT_EQ(f.string_attr("aerie_version"), aerie_version_string());  // issue 13 item 5
  EXPECT_EQ(f.string_attr("dtype"), "bfloat16");
  EXPECT_EQ(f.string_attr("aux_layer_convention"), kAuxLayerConvention);
  EXPECT_EQ(f.int_attr("num_tokens"), 5);
  h5::Dataset aux = f.open_dataset("aux_hidden_states");
  EXPECT_EQ(aux.string_attr("dtype"), "bfloat16");
  EXPECT_EQ(aux.shape(), (Shape{5, 3 * H}));
  EXPECT_EQ(f.open_dataset("sample_offsets").read_vector<int64_t>(), (std::vector<int64_t>{0, 2, 5}));
  EXPECT_EQ(f.open_dataset("sample_index").read_vector<int64_t>(), (std::vector<int64_t>{64, 65}));
  // Row 2 of the file is row 0 of the second sample.
  Tensor row = aux.read_rows(2, 3);
  EXPECT_EQ(row.dtype(), DType::BF16);
  EXPECT_EQ(row.data<bf16>()[5].bits, bf16::from_float(samples[1].aux.data<float>()[5]));
}

TEST(Shard, SameInputGivesSameBytes) {
  const std::string dir = testing::scratch_dir("shard_bytes");
  write_shard(dir + "/a.h5", 8, 0, {4, 6}, 0);
  // HDF5 stores object times in whole seconds: write the second file in another second.
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  write_shard(dir + "/b.h5", 8, 0, {4, 6}, 0);
  std::string a = read_bytes(dir + "/a.h5"), b = read_bytes(dir + "/b.h5");
  ASSERT_FALSE(a.empty());
  EXPECT_TRUE(a == b) << "two writes of the same shard differ (timestamps?)";
}

// The writer's non-finite scan (four bf16 values per 64-bit word, then the row's tail): every column of a
// row whose width is not a multiple of 4 (3H = 15), each bf16 NaN / infinity pattern, is found at its token;
// the finite values nearest to them (the largest exponent below all-ones, subnormals, -0) are not.
TEST(Shard, NonFiniteScanFindsEveryColumnAndNothingElse) {
  const std::string dir = testing::scratch_dir("shard_nonfinite_scan");
  const int64_t H = 5, T = 3;
  auto bf16_tensor = [](int64_t rows, int64_t cols, uint16_t fill) {
    Tensor t = Tensor::empty({rows, cols}, DType::BF16);
    for (int64_t i = 0; i < t.numel(); ++i) static_cast<uint16_t*>(t.raw())[i] = fill;
    return t;
  };
  const std::vector<int32_t> ids = {7, 8, 9};
  const std::vector<uint8_t> mask = {1, 1, 1};
  int files = 0;
  auto add = [&](const Tensor& aux, const Tensor& fin) {
    ShardWriter w(dir + "/s" + std::to_string(files++) + ".h5", test_meta(H, 0), {T});
    w.add(0, ids, mask, aux, fin);
  };
  for (uint16_t bad : {uint16_t{0x7F80}, uint16_t{0xFF80}, uint16_t{0x7FC0}, uint16_t{0xFFFF}, uint16_t{0x7F81}}) {
    for (int64_t c = 0; c < 3 * H; ++c) {
      Tensor aux = bf16_tensor(T, 3 * H, 0x3F80);  // 1.0
      static_cast<uint16_t*>(aux.raw())[1 * 3 * H + c] = bad;
      const std::string e = testing::error_of([&] { add(aux, bf16_tensor(T, H, 0x3F80)); });
      EXPECT_NE(e.find("non-finite aux_hidden_states (f_t) at token 1 (id 8)"), std::string::npos)
          << "bits " << std::hex << bad << std::dec << " at column " << c << ": " << e;
    }
    for (int64_t c = 0; c < H; ++c) {
      Tensor fin = bf16_tensor(T, H, 0xBF80);  // -1.0
      static_cast<uint16_t*>(fin.raw())[2 * H + c] = bad;
      const std::string e = testing::error_of([&] { add(bf16_tensor(T, 3 * H, 0x3F80), fin); });
      EXPECT_NE(e.find("non-finite final_hidden_states (z_t) at token 2 (id 9)"), std::string::npos)
          << "bits " << std::hex << bad << std::dec << " at column " << c << ": " << e;
    }
  }
  for (uint16_t fine : {uint16_t{0x7F7F}, uint16_t{0xFF7F}, uint16_t{0x7F00}, uint16_t{0x0001}, uint16_t{0x8000},
                        uint16_t{0x0000}, uint16_t{0x3F80}}) {
    EXPECT_EQ(testing::error_of([&] { add(bf16_tensor(T, 3 * H, fine), bf16_tensor(T, H, fine)); }), "")
        << "bits " << std::hex << fine;
  }
}

// Issue 17, case 5: NonFinite::Skip leaves a sample with a NaN or an infinity out (add returns false) and
// the shard holds what a writer told only the kept samples writes, plus the skipped_nonfinite attribute
// that lists the skipped samples; a chunk whose every sample is skipped gives a
// readable shard of 0 samples. NonFinite::Error throws naming the sample and --skip-nonfinite.
TEST(Shard, SkipNonFiniteLeavesTheSampleOut) {
  const std::string dir = testing::scratch_dir("shard_skip_nonfinite");
  const int64_t H = 8;
  const std::vector<int64_t> lengths = {4, 5, 6, 3};
  std::vector<Sample> samples;
  for (size_t k = 0; k < lengths.size(); ++k) samples.push_back(make_sample(10 + static_cast<int64_t>(k), lengths[k], H));
  samples[1].fin.data<float>()[2 * H + 3] = std::numeric_limits<float>::quiet_NaN();
  samples[3].aux.data<float>()[0] = std::numeric_limits<float>::infinity();
  {
    ShardWriter w(dir + "/skip.h5", test_meta(H, 0), lengths, NonFinite::Skip);
    std::vector<bool> written;
    for (const Sample& s : samples) written.push_back(w.add(s.index, s.ids, s.mask, s.aux, s.fin));
    EXPECT_EQ(written, (std::vector<bool>{true, false, true, false}));
    EXPECT_EQ(w.skipped(), (std::vector<int64_t>{11, 13}));
    EXPECT_EQ(w.skipped_tokens(), 8);
    w.close();
  }
  EXPECT_FALSE(fs::exists(dir + "/skip.h5.tmp"));
  EXPECT_FALSE(fs::exists(dir + "/skip.h5.kept.tmp"));
  ShardReader r(dir + "/skip.h5");
  EXPECT_EQ(r.num_samples(), 2);
  EXPECT_EQ(r.info().num_tokens, 10);
  EXPECT_EQ(r.info().skipped_nonfinite, (std::vector<int64_t>{11, 13}));
  EXPECT_EQ(r.sample_indices(), (std::vector<int64_t>{10, 12}));
  for (int64_t i = 0; i < 2; ++i) {
    const Sample& want = samples[static_cast<size_t>(2 * i)];
    HiddenSample got = r.read(i);
    EXPECT_EQ(got.sample_index, want.index);
    EXPECT_EQ(got.ids, want.ids);
    std::vector<float> a = want.aux.to_float_vector();
    for (float& x : a) x = round_bf16(x);
    EXPECT_EQ(got.aux_hidden.to_float_vector(), a);
  }
  // The same bytes as a shard of the kept samples alone, once the attribute is removed.
  {
    ShardWriter w(dir + "/kept.h5", test_meta(H, 0), {4, 6});
    for (int k : {0, 2}) w.add(samples[k].index, samples[k].ids, samples[k].mask, samples[k].aux, samples[k].fin);
    w.close();
  }
  ShardReader kept(dir + "/kept.h5");
  EXPECT_TRUE(kept.info().skipped_nonfinite.empty());
  EXPECT_EQ(kept.input_ids(), r.input_ids());
  EXPECT_EQ(kept.loss_mask(), r.loss_mask());
  for (int64_t i = 0; i < 2; ++i) {
    EXPECT_EQ(kept.read(i).aux_hidden.to_float_vector(), r.read(i).aux_hidden.to_float_vector());
    EXPECT_EQ(kept.read(i).final_hidden.to_float_vector(), r.read(i).final_hidden.to_float_vector());
  }

  // Every sample skipped: a shard of 0 samples.
  {
    ShardWriter w(dir + "/none.h5", test_meta(H, 3), {5}, NonFinite::Skip);
    EXPECT_FALSE(w.add(samples[1].index, samples[1].ids, samples[1].mask, samples[1].aux, samples[1].fin));
    w.close();
  }
  ShardReader none(dir + "/none.h5");
  EXPECT_EQ(none.num_samples(), 0);
  EXPECT_EQ(none.info().num_tokens, 0);
  EXPECT_EQ(none.info().skipped_nonfinite, (std::vector<int64_t>{11}));

  // Without Skip: an error naming the shard, the sample, the token, and the option; no file left.
  const std::string e = testing::error_of([&] {
    ShardWriter w(dir + "/err.h5", test_meta(H, 0), {5});
    w.add(samples[1].index, samples[1].ids, samples[1].mask, samples[1].aux, samples[1].fin);
  });
  EXPECT_NE(e.find(dir + "/err.h5: prepared sample 11 has a non-finite final_hidden_states (z_t) at token 2 (id " +
                   std::to_string(samples[1].ids[2]) + ")"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("--skip-nonfinite"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(dir + "/err.h5.tmp"));
}

// extract --storage fp8 (format version 2): every H-wide vector of a token as e4m3fn codes times one
// fp32 scale amax / 448. Read back within the e4m3 rounding of the stored bf16 value: a relative 2^-4
// (half a step of 3 mantissa bits) for values down to amax 2^-6 / 448 ... and an absolute scale 2^-10
// below (half the subnormal step); the vector's largest value exactly (it maps to 448). About half the
// bytes of the bf16 shard; the documented layout; a skipping writer compacts fp8 shards as well.
TEST(Shard, Fp8StorageRoundTripsWithinE4m3Rounding) {
  const std::string dir = testing::scratch_dir("shard_fp8");
  const int64_t H = 64;
  const std::vector<int64_t> lengths = {40, 30, 50};
  std::vector<Sample> samples;
  for (size_t k = 0; k < lengths.size(); ++k) samples.push_back(make_sample(20 + static_cast<int64_t>(k), lengths[k], H));
  samples[1].fin.data<float>()[3] = std::numeric_limits<float>::quiet_NaN();  // skipped: compaction of fp8
  for (bool fp8 : {false, true}) {
    ShardMeta m = test_meta(H, 0);
    m.fp8 = fp8;
    ShardWriter w(dir + (fp8 ? "/fp8.h5" : "/bf16.h5"), m, lengths, NonFinite::Skip);
    for (const Sample& s : samples) w.add(s.index, s.ids, s.mask, s.aux, s.fin);
    w.close();
  }
  const double ratio = static_cast<double>(fs::file_size(dir + "/fp8.h5")) / fs::file_size(dir + "/bf16.h5");
  EXPECT_LT(ratio, 0.6);
  EXPECT_GT(ratio, 0.45);
  h5::File f = h5::File::open(dir + "/fp8.h5");
  EXPECT_EQ(f.int_attr("format_version"), 2);
  EXPECT_EQ(f.string_attr("dtype"), "float8_e4m3fn");
  EXPECT_EQ(f.open_dataset("aux_hidden_scales").shape(), (Shape{90, 3}));
  EXPECT_EQ(f.open_dataset("final_hidden_scales").shape(), (Shape{90, 1}));
  ShardReader r(dir + "/fp8.h5");
  EXPECT_TRUE(r.info().fp8);
  EXPECT_EQ(r.sample_indices(), (std::vector<int64_t>{20, 22}));
  EXPECT_FALSE(ShardReader(dir + "/bf16.h5").info().fp8);
  for (int64_t i = 0; i < 2; ++i) {
    const Sample& want = samples[static_cast<size_t>(2 * i)];
    const HiddenSample got = r.read(i);
    for (const auto& [g, w] : {std::pair<Tensor, Tensor>{got.aux_hidden, want.aux}, {got.final_hidden, want.fin}}) {
      const auto gv = g.to_float_vector(), wv = w.to_float_vector();
      int64_t exact_max = 0;
      for (size_t v = 0; v < wv.size() / H; ++v) {
        float amax = 0;
        for (int64_t j = 0; j < H; ++j) amax = std::max(amax, std::fabs(round_bf16(wv[v * H + j])));
        const float scale = amax / 448.0f;
        for (int64_t j = 0; j < H; ++j) {
          const float x = round_bf16(wv[v * H + j]), y = gv[v * H + j];
          const float bound = std::max(std::ldexp(std::fabs(x), -4), std::ldexp(scale, -10)) * 1.0001f;
          ASSERT_LE(std::fabs(y - x), bound) << "sample " << i << " vector " << v << " element " << j;
          exact_max += std::fabs(x) == amax && y == x;
        }
      }
      EXPECT_GE(exact_max, static_cast<int64_t>(wv.size() / H));  // each vector's amax comes back exactly
    }
  }
}

// A sample large enough for the writer's threads (2.4 M aux values): the values read back equal, bit for
// bit, the documented formula applied vector by vector (docs/formats.md: scale amax / 448, codes
// e4m3fn(x 448 / amax)), however the writer split the work.
TEST(Shard, Fp8LargeSampleMatchesTheFormulaExactly) {
  const std::string path = testing::scratch_dir("shard_fp8_large") + "/shard-00000.h5";
  const int64_t H = 1024, T = 800;
  Sample s = make_sample(0, T, H);
  ShardMeta m = test_meta(H, 0);
  m.fp8 = true;
  ShardWriter w(path, m, {T});
  w.add(0, s.ids, s.mask, s.aux, s.fin);
  w.close();
  const HiddenSample h = ShardReader(path).read(0);
  const auto got = h.aux_hidden.to_float_vector(), x = s.aux.to_float_vector();
  int64_t bad = 0;
  for (int64_t r = 0; r < T * 3; ++r) {
    float amax = 0;
    for (int64_t j = 0; j < H; ++j) amax = std::max(amax, std::fabs(round_bf16(x[r * H + j])));
    const float scale = amax / 448.0f, inv = amax > 0 ? 448.0f / amax : 0.0f;
    for (int64_t j = 0; j < H; ++j) {
      const float want = fp8_e4m3fn_to_float(float_to_fp8_e4m3fn(round_bf16(x[r * H + j]) * inv)) * scale;
      if (got[r * H + j] != want && ++bad <= 3) ADD_FAILURE() << "vector " << r << " element " << j;
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST(Shard, WrongFormatOrVersionNamesTheFile) {
  const std::string dir = testing::scratch_dir("shard_format");
  {
    h5::File f = h5::File::create(dir + "/other.h5");
    f.set_string_attr("format", "aerie.prepared");
    f.set_int_attr("format_version", 1);
  }
  try {
    ShardReader r(dir + "/other.h5");
    FAIL() << "no error for another format";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/other.h5"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("aerie.prepared"), std::string::npos) << e.what();
  }
  write_shard(dir + "/v3.h5", 4, 0, {2}, 0);
  {
    h5::File f = h5::File::open(dir + "/v3.h5", h5::Access::ReadWrite);
    f.set_int_attr("format_version", 3);
  }
  try {
    ShardReader r(dir + "/v3.h5");
    FAIL() << "no error for version 3";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/v3.h5"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("format_version 3"), std::string::npos) << e.what();
  }
  // A bf16 shard that claims version 2 (fp8) lacks the scales: an error naming the file.
  write_shard(dir + "/v2.h5", 4, 0, {2}, 0);
  {
    h5::File f = h5::File::open(dir + "/v2.h5", h5::Access::ReadWrite);
    f.set_int_attr("format_version", 2);
  }
  EXPECT_NE(testing::error_of([&] { ShardReader r(dir + "/v2.h5"); }).find(dir + "/v2.h5"), std::string::npos);
  EXPECT_THROW(ShardReader(dir + "/missing.h5"), Error);
}

TEST(Shard, WriterChecksShapesAndCount) {
  const std::string dir = testing::scratch_dir("shard_writer_checks");
  const int64_t H = 4;
  Sample s = make_sample(0, 3, H);
  {
    ShardWriter w(dir + "/shard-00000.h5", test_meta(H, 0), {3, 2});
    EXPECT_THROW(w.add(0, s.ids, s.mask, s.aux.reshape({3 * H * 3 / H, H}), s.fin), Error);  // aux [9, H]
    EXPECT_THROW(w.add(0, s.ids, s.mask, s.aux, s.aux), Error);                              // final 3H wide
    w.add(0, s.ids, s.mask, s.aux, s.fin);
    EXPECT_THROW(w.add(1, s.ids, s.mask, s.aux, s.fin), Error);  // announced 2 tokens, got 3
    EXPECT_THROW(w.close(), Error);                              // 1 of 2 samples
    EXPECT_TRUE(fs::exists(dir + "/shard-00000.h5.tmp"));
  }
  // A writer destroyed before close leaves neither the shard nor its .tmp.
  EXPECT_FALSE(fs::exists(dir + "/shard-00000.h5.tmp"));
  EXPECT_FALSE(fs::exists(dir + "/shard-00000.h5"));
}

TEST(Shard, ListShardsIgnoresTmpAndOtherFiles) {
  const std::string dir = testing::scratch_dir("shard_list");
  write_shard(dir + "/shard-00002.h5", 4, 2, {1}, 2);
  write_shard(dir + "/shard-00000.h5", 4, 0, {1}, 0);
  std::ofstream(dir + "/shard-00001.h5.tmp") << "partial";
  std::ofstream(dir + "/notes.txt") << "x";
  std::ofstream(dir + "/prepared.h5") << "x";
  fs::create_directories(dir + "/shard-00009.h5.d");
  auto shards = list_shards(dir);
  ASSERT_EQ(shards.size(), 2u);
  EXPECT_EQ(shards[0], dir + "/shard-00000.h5");
  EXPECT_EQ(shards[1], dir + "/shard-00002.h5");
  EXPECT_THROW(list_shards(dir + "/nope"), Error);
  // Past 99,999 shards the names grow a digit: chunk order, not string order (issue 17, point 9).
  std::ofstream(dir + "/shard-99999.h5") << "x";
  std::ofstream(dir + "/shard-100000.h5") << "x";
  shards = list_shards(dir);
  ASSERT_EQ(shards.size(), 4u);
  EXPECT_EQ(shards[2], dir + "/shard-99999.h5");
  EXPECT_EQ(shards[3], dir + "/shard-100000.h5");
  EXPECT_EQ(shard_file_name(100000), "shard-100000.h5");
}

}  // namespace
}  // namespace aerie
