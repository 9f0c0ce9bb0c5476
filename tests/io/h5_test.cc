// HDF5 wrappers: round trips of every dtype and attribute kind, partial row I/O, errors that name file and
// dataset, and collective parallel writes (H5Test.Parallel* also run with 2 ranks, tests/mpi/data.cmake).
#include <mpi.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <thread>
#include <functional>

#include "io/h5.h"
#include "test_util.h"

namespace aerie {
namespace {

TEST(H5Test, DatasetRoundTripAllDtypes) {
  std::string path = testing::scratch_dir("h5_roundtrip") + "/a.h5";
  std::vector<float> f = {1.5f, -2.25f, 3.0f, 1e-8f, 7.0f, -0.0f};
  std::vector<int32_t> i32 = {1, -2, 2147483647, 0};
  std::vector<int64_t> i64 = {int64_t{1} << 40, -5, 0};
  std::vector<uint8_t> u8 = {0, 1, 255};
  std::vector<bf16> b16 = {bf16(1.0f), bf16(-3.5f), bf16(0.1f), bf16(65504.f)};
  {
    h5::File file = h5::File::create(path);
    file.write_dataset("f32", Tensor::from_vector(f, {2, 3}));
    file.write_dataset("grp/i32", Tensor::from_vector(i32, {4}));
    file.write_dataset("i64", Tensor::from_vector(i64, {3}));
    file.write_dataset("u8", Tensor::from_vector(u8, {3, 1}));
    file.write_dataset("bf16", Tensor::from_vector(b16, {2, 2}));
    file.close();
  }
  h5::File file = h5::File::open(path);
  EXPECT_TRUE(file.exists("grp/i32"));
  EXPECT_FALSE(file.exists("grp/nope"));
  EXPECT_FALSE(file.exists("nope/deeper"));
  EXPECT_EQ(file.members(), (std::vector<std::string>{"bf16", "f32", "grp", "i64", "u8"}));
  Tensor tf = file.read_dataset("f32");
  EXPECT_EQ(tf.dtype(), DType::F32);
  EXPECT_EQ(tf.shape(), (Shape{2, 3}));
  EXPECT_EQ(std::vector<float>(tf.data<float>(), tf.data<float>() + 6), f);
  Tensor ti = file.read_dataset("grp/i32");
  EXPECT_EQ(std::vector<int32_t>(ti.data<int32_t>(), ti.data<int32_t>() + 4), i32);
  EXPECT_EQ(file.open_dataset("i64").read_vector<int64_t>(), i64);
  EXPECT_EQ(file.open_dataset("u8").dtype(), DType::U8);
  EXPECT_EQ(file.open_dataset("u8").read_vector<uint8_t>(), u8);
  // Integer conversion through HDF5: int32 data read as int64.
  EXPECT_EQ(file.open_dataset("grp/i32").read_vector<int64_t>(), (std::vector<int64_t>{1, -2, 2147483647, 0}));
  h5::Dataset db = file.open_dataset("bf16");
  EXPECT_EQ(db.dtype(), DType::BF16);
  EXPECT_EQ(db.string_attr("dtype"), "bfloat16");
  Tensor tb = db.read();
  ASSERT_EQ(tb.dtype(), DType::BF16);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(tb.data<bf16>()[i].bits, b16[i].bits) << i;
  // bf16 never converts silently to float.
  Tensor wrong = Tensor::empty({2, 2}, DType::F32);
  EXPECT_NE(testing::error_of([&] { db.read_rows_into(0, wrong); }).find("bf16"), std::string::npos);
}

TEST(H5Test, Attributes) {
  std::string path = testing::scratch_dir("h5_attrs") + "/a.h5";
  {
    h5::File file = h5::File::create(path);
    file.set_string_attr("format", "aerie.test");
    file.set_string_attr("empty", "");
    file.set_int_attr("version", 3);
    file.set_int_attr("version", 4);  // replaces
    file.set_double_attr("lr", 1e-4);
    file.set_ints_attr("layers", {2, 15, 28});
    file.set_ints_attr("none", {});
    {
      h5::Dataset d = file.create_dataset("x", DType::I32, {5});
      d.set_string_attr("unit", "tokens");
    }
    file.close();
  }
  h5::File file = h5::File::open(path);
  EXPECT_EQ(file.string_attr("format"), "aerie.test");
  EXPECT_EQ(file.string_attr("empty"), "");
  EXPECT_EQ(file.int_attr("version"), 4);
  EXPECT_DOUBLE_EQ(file.double_attr("lr"), 1e-4);
  EXPECT_EQ(file.ints_attr("layers"), (std::vector<int64_t>{2, 15, 28}));
  EXPECT_TRUE(file.ints_attr("none").empty());
  EXPECT_TRUE(file.has_attr("format"));
  EXPECT_FALSE(file.has_attr("missing"));
  EXPECT_EQ(file.open_dataset("x").string_attr("unit"), "tokens");
  std::string e = testing::error_of([&] { file.int_attr("missing"); });
  EXPECT_NE(e.find("a.h5"), std::string::npos) << e;
  EXPECT_NE(e.find("missing"), std::string::npos) << e;
  e = testing::error_of([&] { file.int_attr("format"); });
  EXPECT_NE(e.find("not an integer"), std::string::npos) << e;
  e = testing::error_of([&] { file.string_attr("version"); });
  EXPECT_NE(e.find("not a string"), std::string::npos) << e;
}

TEST(H5Test, ErrorsNameFileAndDataset) {
  std::string dir = testing::scratch_dir("h5_errors");
  std::string e = testing::error_of([&] { h5::File::open(dir + "/missing.h5"); });
  EXPECT_NE(e.find("missing.h5"), std::string::npos) << e;
  {
    std::ofstream(dir + "/text.h5") << "not hdf5";
  }
  e = testing::error_of([&] { h5::File::open(dir + "/text.h5"); });
  EXPECT_NE(e.find("text.h5"), std::string::npos) << e;
  h5::File file = h5::File::create(dir + "/a.h5");
  file.write_dataset("ids", Tensor::from_vector(std::vector<int32_t>{1, 2, 3}, {3}));
  e = testing::error_of([&] { file.open_dataset("nope"); });
  EXPECT_NE(e.find("a.h5"), std::string::npos) << e;
  EXPECT_NE(e.find("/nope"), std::string::npos) << e;
  e = testing::error_of([&] { file.create_dataset("ids", DType::I32, {3}); });
  EXPECT_NE(e.find("exists already"), std::string::npos) << e;
  e = testing::error_of([&] { file.open_dataset("ids").read_rows(2, 5); });
  EXPECT_NE(e.find("/ids"), std::string::npos) << e;
  e = testing::error_of([&] { file.open_dataset("ids").write_rows(2, Tensor::from_vector(std::vector<int32_t>{7, 8}, {2})); });
  EXPECT_NE(e.find("outside"), std::string::npos) << e;
  e = testing::error_of([&] { file.open_dataset("ids").write_rows(0, Tensor::from_vector(std::vector<int32_t>{7, 8}, {1, 2})); });
  EXPECT_NE(e.find("shape"), std::string::npos) << e;
  e = testing::error_of([&] { file.open_dataset("ids").extend(10); });
  EXPECT_NE(e.find("/ids"), std::string::npos) << e;
  // File::close refuses while a dataset is open, naming it.
  h5::Dataset open_ds = file.open_dataset("ids");
  e = testing::error_of([&] { file.close(); });
  EXPECT_NE(e.find("/ids"), std::string::npos) << e;
}

// A file cut short (a copy that stopped, a full disk) is named as such, with what to do, not with the hint
// for file systems without locking.
TEST(H5Test, TruncatedFileSaysSo) {
  std::string dir = testing::scratch_dir("h5_truncated");
  {
    h5::File file = h5::File::create(dir + "/whole.h5");
    file.write_dataset("x", Tensor::from_vector(std::vector<float>(20000, 1.0f), {20000}));
  }
  std::string bytes;
  {
    std::ifstream in(dir + "/whole.h5", std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  ASSERT_GT(bytes.size(), 40000u);
  std::ofstream(dir + "/cut.h5", std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  const std::string e = testing::error_of([&] { h5::File::open(dir + "/cut.h5"); });
  EXPECT_NE(e.find("cut.h5"), std::string::npos) << e;
  EXPECT_NE(e.find("shorter than its HDF5 header records"), std::string::npos) << e;
  EXPECT_EQ(e.find("HDF5_USE_FILE_LOCKING"), std::string::npos) << e;
}

TEST(H5Test, RowsChunkedAndExtendable) {
  std::string path = testing::scratch_dir("h5_rows") + "/a.h5";
  {
    h5::File file = h5::File::create(path);
    h5::Dataset d = file.create_dataset("h", DType::BF16, {0, 3}, {.chunk_rows = 2, .extendable = true});
    std::vector<bf16> rows;
    for (int i = 0; i < 15; ++i) rows.push_back(bf16(static_cast<float>(i)));
    d.extend(5);
    d.write_rows(0, Tensor::from_vector(rows, {5, 3}));
    d.extend(7);
    d.write_rows(5, Tensor::from_vector(std::vector<bf16>(6, bf16(-1.f)), {2, 3}));
    d.write_rows(7, Tensor());  // nothing: allowed
  }
  h5::File file = h5::File::open(path);
  h5::Dataset d = file.open_dataset("h");
  EXPECT_EQ(d.shape(), (Shape{7, 3}));
  Tensor part = d.read_rows(1, 6);
  std::vector<float> v = part.to_float_vector();
  std::vector<float> want = {3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, -1, -1, -1};
  EXPECT_EQ(v, want);
}

// Without object times and fill values, equal content gives byte-identical files (written a second apart).
TEST(H5Test, UntimedDatasetsAreByteIdentical) {
  std::string dir = testing::scratch_dir("h5_untimed");
  auto write = [&](const std::string& name) {
    h5::File f = h5::File::create(dir + "/" + name);
    f.set_int_attr("version", 1);
    h5::Dataset d = f.create_dataset("x", DType::I32, {4}, {.track_times = false, .fill = false});
    d.write(Tensor::from_vector(std::vector<int32_t>{1, 2, 3, 4}, {4}));
  };
  write("a.h5");
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  write("b.h5");
  auto bytes = [&](const std::string& name) {
    std::ifstream in(dir + "/" + name, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  EXPECT_FALSE(bytes("a.h5").empty());
  EXPECT_EQ(bytes("a.h5"), bytes("b.h5"));
}

// Each rank writes its own block of rows (of different lengths) collectively into one parallel file; rank 0
// then reads the file serially. Runs with 1 rank here and with 2 ranks under mpirun (tests/mpi/data.cmake).
TEST(H5Test, ParallelRows) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::string dir = testing::scratch_root() + "/h5_parallel_np" + std::to_string(size);
  if (rank == 0) dir = testing::scratch_dir("h5_parallel_np" + std::to_string(size));
  MPI_Barrier(MPI_COMM_WORLD);
  std::string path = dir + "/p.h5";
  // Rank r owns r + 1 rows (rank 1 of 3 ranks may own none: exercise empty selections with rank 0 empty too).
  auto rows_of = [](int r) { return r == 0 ? 0 : r + 1; };
  int64_t begin = 0, total = 0;
  for (int r = 0; r < size; ++r) {
    if (r < rank) begin += rows_of(r);
    total += rows_of(r);
  }
  total = std::max<int64_t>(total, 1);
  if (size == 1) total = 0;
  {
    h5::File file = h5::File::create(path, MPI_COMM_WORLD);
    EXPECT_TRUE(file.parallel());
    file.set_string_attr("format", "aerie.test");
    h5::Dataset d = file.create_dataset("x", DType::I64, {total, 2});
    std::vector<int64_t> mine;
    for (int64_t i = 0; i < rows_of(rank); ++i) {
      mine.push_back((begin + i) * 10);
      mine.push_back(rank);
    }
    d.write_rows(begin, Tensor::from_vector(mine, {rows_of(rank), 2}));
    h5::Dataset s = file.create_dataset("whole", DType::F32, {3});
    s.write(Tensor::from_vector(std::vector<float>{1.f, 2.f, 3.f}, {3}));  // rank 0's data
    s = h5::Dataset();
    d = h5::Dataset();
    file.close();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) {
    h5::File file = h5::File::open(path);
    EXPECT_EQ(file.string_attr("format"), "aerie.test");
    std::vector<int64_t> all = file.open_dataset("x").read_vector<int64_t>();
    int64_t row = 0;
    for (int r = 0; r < size; ++r) {
      for (int64_t i = 0; i < rows_of(r); ++i, ++row) {
        EXPECT_EQ(all[2 * row], row * 10);
        EXPECT_EQ(all[2 * row + 1], r);
      }
    }
    EXPECT_EQ(file.open_dataset("whole").read_vector<float>(), (std::vector<float>{1.f, 2.f, 3.f}));
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// A collective write that fails on one rank (a full disk under one rank's write hung prepare on 2
// ranks) fails on every rank together, as aerie::CollectiveError with that rank's message, and the ranks
// go on in step: the file still closes collectively. Here the last rank's rows lie outside the dataset,
// then rank 0's whole-dataset tensor has the wrong shape. Runs with 1 rank here and with 2 under mpirun.
TEST(H5Test, ParallelFailureAgreed) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::string dir = testing::scratch_root() + "/h5_parallel_fail_np" + std::to_string(size);
  if (rank == 0) dir = testing::scratch_dir("h5_parallel_fail_np" + std::to_string(size));
  MPI_Barrier(MPI_COMM_WORLD);
  const std::string path = dir + "/p.h5";
  h5::File file = h5::File::create(path, MPI_COMM_WORLD);
  h5::Dataset d = file.create_dataset("x", DType::I64, {2 * static_cast<int64_t>(size)});
  const int64_t begin = rank == size - 1 ? 2 * size : 2 * rank;  // the last rank: past the end
  const std::string outside = "rows [" + std::to_string(2 * size) + ", " + std::to_string(2 * size + 2) +
                              ") outside " + path + ":/x";
  try {
    d.write_rows(begin, Tensor::from_vector(std::vector<int64_t>{1, 2}, {2}));
    ADD_FAILURE() << "rank " << rank << ": the write of rows outside the dataset did not throw";
  } catch (const CollectiveError& e) {
    EXPECT_NE(std::string(e.what()).find(outside), std::string::npos) << e.what();
    if (size > 1) {
      EXPECT_NE(std::string(e.what()).find("(on rank " + std::to_string(size - 1) + " of " + std::to_string(size) + ")"),
                std::string::npos)
          << e.what();
    }
  }
  h5::Dataset w = file.create_dataset("whole", DType::F32, {3});
  try {
    w.write(Tensor::from_vector(std::vector<float>{1.f, 2.f}, {2}));  // rank 0's tensor decides
    ADD_FAILURE() << "rank " << rank << ": the write of a [2] tensor into [3] did not throw";
  } catch (const CollectiveError& e) {
    EXPECT_NE(std::string(e.what()).find("into " + path + ":/whole of shape [3]"), std::string::npos) << e.what();
  }
  w.write(Tensor::from_vector(std::vector<float>{1.f, 2.f, 3.f}, {3}));
  w = h5::Dataset();
  d = h5::Dataset();
  file.close();  // collective: every rank is here
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) {
    EXPECT_EQ(h5::File::open(path).open_dataset("whole").read_vector<float>(), (std::vector<float>{1.f, 2.f, 3.f}));
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace aerie
