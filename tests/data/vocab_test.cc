// Draft vocabulary (eagle3.md section 2): selection, ties, filling (SpecForge #76), d2t offsets, t2d, the
// safetensors round trip, damaged files, and counting loss-masked tokens of a prepared file.
#include <functional>

#include "data/vocab.h"
#include "io/h5.h"
#include "io/safetensors.h"
#include "test_util.h"

namespace aerie {
namespace {

TEST(DraftVocabTest, MostFrequentSortedWithOffsets) {
  //                          id: 0  1  2  3  4  5  6  7
  std::vector<int64_t> counts = {0, 9, 1, 7, 0, 8, 2, 0};
  DraftVocab v = build_draft_vocab(counts, 3);
  EXPECT_EQ(v.selected(), (std::vector<int64_t>{1, 3, 5}));
  EXPECT_EQ(v.d2t, (std::vector<int64_t>{1, 2, 3}));  // s_i - i
  EXPECT_EQ(v.t2d, (std::vector<uint8_t>{0, 1, 0, 1, 0, 1, 0, 0}));
  EXPECT_EQ(v.draft_vocab_size(), 3);
  EXPECT_EQ(v.vocab_size(), 8);
  for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(counts[static_cast<size_t>(i + v.d2t[static_cast<size_t>(i)])] > 0, true);
}

TEST(DraftVocabTest, TiesTakeTheSmallerIdFirst) {
  std::vector<int64_t> counts = {5, 3, 5, 3, 5, 3};
  EXPECT_EQ(build_draft_vocab(counts, 2).selected(), (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(build_draft_vocab(counts, 4).selected(), (std::vector<int64_t>{0, 1, 2, 4}));
}

TEST(DraftVocabTest, FewerDistinctIdsThanKFillWithSmallestUnused) {
  // Only ids 6 and 9 occur; K = 5 -> {6, 9} plus the smallest unused ids 0, 1, 2 (SpecForge #76).
  std::vector<int64_t> counts(10, 0);
  counts[6] = 4;
  counts[9] = 1;
  DraftVocab v = build_draft_vocab(counts, 5);
  EXPECT_EQ(v.selected(), (std::vector<int64_t>{0, 1, 2, 6, 9}));
  EXPECT_EQ(v.d2t, (std::vector<int64_t>{0, 0, 0, 3, 5}));
  // K larger than V: K = V, every id selected, all offsets 0.
  DraftVocab all = build_draft_vocab(counts, 100);
  EXPECT_EQ(all.draft_vocab_size(), 10);
  EXPECT_EQ(all.d2t, std::vector<int64_t>(10, 0));
  EXPECT_EQ(all.t2d, std::vector<uint8_t>(10, 1));
}

TEST(DraftVocabTest, BadArguments) {
  EXPECT_THROW(build_draft_vocab({}, 3), Error);
  EXPECT_THROW(build_draft_vocab({1, 2}, 0), Error);
  EXPECT_THROW(build_draft_vocab({1, -2}, 1), Error);
}

TEST(DraftVocabTest, SaveLoadRoundTrip) {
  std::string dir = testing::scratch_dir("draft_vocab_roundtrip");
  std::vector<int64_t> counts = {3, 0, 11, 2, 0, 7, 7, 1, 0, 0, 5};
  DraftVocab v = build_draft_vocab(counts, 4);
  save_draft_vocab(dir + "/draft_vocab.safetensors", v, counts);
  DraftVocab w = load_draft_vocab(dir + "/draft_vocab.safetensors");
  EXPECT_EQ(w.d2t, v.d2t);
  EXPECT_EQ(w.t2d, v.t2d);
  EXPECT_EQ(w.selected(), (std::vector<int64_t>{2, 5, 6, 10}));
  // The file as servers read it: d2t I64 [K], t2d BOOL (read as U8) [V], token counts, metadata.
  SafetensorsFile f = load_safetensors(dir + "/draft_vocab.safetensors");
  EXPECT_EQ(f.tensors.at("d2t").dtype(), DType::I64);
  EXPECT_EQ(f.tensors.at("d2t").shape(), (Shape{4}));
  EXPECT_EQ(f.tensors.at("t2d").shape(), (Shape{11}));
  const Tensor& tc = f.tensors.at("token_counts");
  EXPECT_EQ(std::vector<int64_t>(tc.data<int64_t>(), tc.data<int64_t>() + tc.numel()), counts);
  EXPECT_EQ(f.metadata.at("format"), "aerie.draft_vocab");
  EXPECT_EQ(f.metadata.at("format_version"), "1");
  EXPECT_THROW(save_draft_vocab(dir + "/bad.safetensors", v, {1, 2}), Error);  // counts of the wrong length
}

TEST(DraftVocabTest, DamagedFilesAreErrors) {
  std::string dir = testing::scratch_dir("draft_vocab_bad");
  std::vector<int64_t> counts = {3, 0, 11, 2, 0, 7};
  DraftVocab v = build_draft_vocab(counts, 3);  // {0, 2, 5}
  auto write = [&](const std::string& name, std::vector<int64_t> d2t, std::vector<uint8_t> t2d,
                   std::map<std::string, std::string> meta) {
    SafetensorsFile f;
    f.tensors["d2t"] = Tensor::from_vector(d2t, {static_cast<int64_t>(d2t.size())});
    f.tensors["t2d"] = Tensor::from_vector(t2d, {static_cast<int64_t>(t2d.size())});
    f.metadata = std::move(meta);
    save_safetensors(dir + "/" + name, f, {"t2d"});
    return dir + "/" + name;
  };
  std::map<std::string, std::string> good = {{"format", "aerie.draft_vocab"}, {"format_version", "1"}};
  EXPECT_NO_THROW(load_draft_vocab(write("ok.safetensors", v.d2t, v.t2d, good)));
  std::string e = testing::error_of([&] { load_draft_vocab(write("fmt.safetensors", v.d2t, v.t2d, {{"format", "other"}})); });
  EXPECT_NE(e.find("fmt.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find("format"), std::string::npos) << e;
  e = testing::error_of([&] {
    load_draft_vocab(write("ver.safetensors", v.d2t, v.t2d, {{"format", "aerie.draft_vocab"}, {"format_version", "2"}}));
  });
  EXPECT_NE(e.find("format_version"), std::string::npos) << e;
  // d2t pointing at an id that t2d does not flag.
  e = testing::error_of([&] { load_draft_vocab(write("mismatch.safetensors", {0, 1, 2}, v.t2d, good)); });
  EXPECT_NE(e.find("t2d"), std::string::npos) << e;
  // Not ascending (target ids 2, 1).
  e = testing::error_of([&] { load_draft_vocab(write("order.safetensors", {2, 0}, {0, 1, 1, 0, 0, 0}, good)); });
  EXPECT_NE(e.find("ascend"), std::string::npos) << e;
  // Beyond V.
  e = testing::error_of([&] { load_draft_vocab(write("range.safetensors", {0, 9}, {1, 0, 0}, good)); });
  EXPECT_NE(e.find("below V"), std::string::npos) << e;
  // t2d flags more ids than d2t has.
  e = testing::error_of([&] { load_draft_vocab(write("extra.safetensors", v.d2t, {1, 1, 1, 0, 0, 1}, good)); });
  EXPECT_NE(e.find("flags 4"), std::string::npos) << e;
  EXPECT_THROW(load_draft_vocab(dir + "/missing.safetensors"), Error);
}

TEST(DraftVocabTest, CountLossTokensOfPreparedFile) {
  std::string dir = testing::scratch_dir("draft_vocab_count");
  std::string path = dir + "/prepared.h5";
  {
    h5::File f = h5::File::create(path);
    f.set_string_attr("format", "aerie.prepared");
    f.set_int_attr("format_version", 1);
    f.write_dataset("input_ids", Tensor::from_vector(std::vector<int32_t>{1, 4, 4, 2, 1, 3, 4, 2}, {8}));
    f.write_dataset("loss_mask", Tensor::from_vector(std::vector<uint8_t>{0, 0, 1, 1, 0, 1, 1, 1}, {8}));
    f.write_dataset("sample_offsets", Tensor::from_vector(std::vector<int64_t>{0, 4, 8}, {3}));
  }
  EXPECT_EQ(count_loss_tokens(path, 6), (std::vector<int64_t>{0, 0, 2, 1, 2, 0}));
  std::string e = testing::error_of([&] { count_loss_tokens(path, 4); });  // id 4 outside V = 4
  EXPECT_NE(e.find("prepared.h5"), std::string::npos) << e;
  {
    h5::File f = h5::File::create(dir + "/other.h5");
    f.set_string_attr("format", "aerie.hidden_states");
  }
  e = testing::error_of([&] { count_loss_tokens(dir + "/other.h5", 6); });
  EXPECT_NE(e.find("not an aerie.prepared"), std::string::npos) << e;
}

TEST(DraftVocab, SpreadEvenlyForBenchmarks) {
  const DraftVocab v = spread_draft_vocab(10, 4);  // ids 0, 2, 5, 7
  EXPECT_EQ(v.selected(), (std::vector<int64_t>{0, 2, 5, 7}));
  EXPECT_EQ(v.d2t, (std::vector<int64_t>{0, 1, 3, 4}));
  EXPECT_EQ(v.vocab_size(), 10);
  EXPECT_EQ(spread_draft_vocab(5, 5).selected(), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_THROW(spread_draft_vocab(4, 5), Error);
}

}  // namespace
}  // namespace aerie
