// Hidden-state shard files (format "aerie.hidden_states" v1): writer and reader. See shard.h and
// docs/formats.md.
#include "data/shard.h"

#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>

#include "core/bf16.h"
#include "core/error.h"
#include "core/fp8.h"
#include "core/log.h"
#include "core/version.h"
#include "io/h5.h"

namespace aerie {

namespace fs = std::filesystem;

std::string shard_file_name(int64_t chunk) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "shard-%05lld.h5", static_cast<long long>(chunk));
  return buf;
}

namespace {
// The chunk a shard file name stands for: c when `name` is shard_file_name(c), else -1.
int64_t chunk_of_name(const std::string& name) {
  if (name.rfind("shard-", 0) != 0 || name.size() < 14 || name.compare(name.size() - 3, 3, ".h5") != 0) return -1;
  const std::string digits = name.substr(6, name.size() - 9);
  if (digits.size() > 18 || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return -1;
  const int64_t c = std::stoll(digits);
  return shard_file_name(c) == name ? c : -1;
}
}  // namespace

std::vector<std::string> list_shards(const std::string& dir) {
  AERIE_CHECK(fs::is_directory(dir), "list_shards: " << dir << " is not a directory");
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    if (chunk_of_name(e.path().filename().string()) >= 0) out.push_back(e.path().string());
  }
  // Chunk order, not string order: shard-100000.h5 comes after shard-99999.h5 (the names are zero-padded
  // to five digits only), so shorter file names first, then the names.
  std::sort(out.begin(), out.end(), [](const std::string& a, const std::string& b) {
    const std::string fa = fs::path(a).filename().string(), fb = fs::path(b).filename().string();
    return fa.size() != fb.size() ? fa.size() < fb.size() : fa < fb;
  });
  return out;
}

ShardFolder read_shard_folder(const std::string& dir) {
  ShardFolder folder;
  for (const std::string& p : list_shards(dir)) {
    const int64_t named = chunk_of_name(fs::path(p).filename().string());
    int64_t recorded = -1;
    try {
      const h5::File f = h5::File::open(p);
      if (f.has_attr("chunk")) recorded = f.int_attr("chunk");
    } catch (const Error&) {
      // Not readable: kept, so that ShardReader names the problem.
    }
    if (recorded >= 0 && recorded != named) {
      folder.skipped.push_back({p, "it records chunk " + std::to_string(recorded) + " (a copy of " +
                                       shard_file_name(recorded) + "?), not chunk " + std::to_string(named) +
                                       " of its name"});
      continue;
    }
    folder.shards.push_back(p);
  }
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file() && name.size() > 3 && name.compare(name.size() - 3, 3, ".h5") == 0 &&
        chunk_of_name(name) < 0)
      folder.skipped.push_back({e.path().string(), "its name is not a shard's (shard-NNNNN.h5, as extract writes "
                                                   "them): a copy or a renamed file?"});
  }
  std::sort(folder.skipped.begin(), folder.skipped.end(),
            [](const SkippedShardFile& a, const SkippedShardFile& b) { return a.path < b.path; });
  return folder;
}

// ---------------------------------------------------------------------------------------------- writer

namespace {
// A new contiguous dataset of `shape` in `f`, created WITHOUT object timestamps
// (H5Pset_obj_track_times(false)) and without fill values (every row gets written), so that equal
// content gives equal file bytes. io/h5's create_dataset keeps HDF5's default (timestamps on), so the
// dataset is created here and opened through io/h5 for the writes. BF16 is uint16 + dtype="bfloat16".
h5::Dataset create_untimed(h5::File& f, const std::string& name, DType dtype, const Shape& shape) {
  hid_t type = -1;
  switch (dtype) {
    case DType::BF16: type = H5T_STD_U16LE; break;
    case DType::I32: type = H5T_STD_I32LE; break;
    case DType::I64: type = H5T_STD_I64LE; break;
    case DType::U8: type = H5T_STD_U8LE; break;
    case DType::F32: type = H5T_IEEE_F32LE; break;
    case DType::F16: break;  // not a shard dtype (H5Dcreate2 fails below)
    case DType::F8E4M3: break;
  }
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  bool ok = space >= 0 && dcpl >= 0 && H5Pset_obj_track_times(dcpl, false) >= 0 &&
            H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER) >= 0;
  hid_t d = ok ? H5Dcreate2(f.id(), name.c_str(), type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT) : -1;
  if (d >= 0) H5Dclose(d);
  if (dcpl >= 0) H5Pclose(dcpl);
  if (space >= 0) H5Sclose(space);
  AERIE_CHECK(d >= 0, "HDF5: cannot create dataset " << f.file_path() << ":/" << name << " " << shape_str(shape));
  h5::Dataset ds = f.open_dataset(name);
  if (dtype == DType::BF16) ds.set_string_attr("dtype", "bfloat16");
  return ds;
}

// The hidden-state datasets of a shard of T tokens: bf16, or fp8 codes with their scales.
void create_hidden(h5::File& f, int64_t T, int64_t H, bool fp8, h5::Dataset& aux, h5::Dataset& fin,
                   h5::Dataset& aux_s, h5::Dataset& fin_s) {
  if (!fp8) {
    aux = create_untimed(f, "aux_hidden_states", DType::BF16, {T, 3 * H});
    fin = create_untimed(f, "final_hidden_states", DType::BF16, {T, H});
    return;
  }
  aux = create_untimed(f, "aux_hidden_states", DType::U8, {T, 3 * H});
  aux.set_string_attr("dtype", "float8_e4m3fn");
  aux_s = create_untimed(f, "aux_hidden_scales", DType::F32, {T, 3});
  fin = create_untimed(f, "final_hidden_states", DType::U8, {T, H});
  fin.set_string_attr("dtype", "float8_e4m3fn");
  fin_s = create_untimed(f, "final_hidden_scales", DType::F32, {T, 1});
}

// `t` ([rows, cols], F32 or BF16) as a BF16 tensor (F32 rounded to nearest even).
Tensor as_bf16(const Tensor& t, int64_t rows, int64_t cols, const std::string& what) {
  t.check_shape({rows, cols}, what);
  if (t.dtype() == DType::BF16) return t;
  AERIE_CHECK(t.dtype() == DType::F32, what << ": F32 or BF16 expected, got " << dtype_name(t.dtype()));
  return t.to(DType::BF16);
}

// fp8 storage of a BF16 [rows, v H] host tensor: per row and H-wide vector, scale = amax / 448 (fp32; 0
// for an all-zero vector) and codes e4m3fn(x * (448 / amax)), rounded to nearest even; into codes [rows,
// v H] U8 and scales [rows, v] F32.
// Large inputs (a long sample of a wide target: 235 M values for 8192 tokens at H 7168, ~1 s on one
// core) are split over up to 8 threads by vectors; each vector's result does not depend on the split.
void quantize_fp8(const Tensor& t, int64_t H, Tensor& codes, Tensor& scales) {
  const int64_t rows = t.dim(0), v = t.dim(1) / H, n = rows * v;
  codes = Tensor::empty({rows, v * H}, DType::U8);
  scales = Tensor::empty({rows, v}, DType::F32);
  const bf16* x = t.data<bf16>();
  uint8_t* q = codes.data<uint8_t>();
  float* sc = scales.data<float>();
  auto vectors = [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const bf16* xv = x + r * H;
      float amax = 0.0f;
      for (int64_t j = 0; j < H; ++j) amax = std::max(amax, std::fabs(static_cast<float>(xv[j])));
      sc[r] = amax / 448.0f;
      const float inv = amax > 0.0f ? 448.0f / amax : 0.0f;
      for (int64_t j = 0; j < H; ++j) q[r * H + j] = float_to_fp8_e4m3fn(static_cast<float>(xv[j]) * inv);
    }
  };
  const int64_t threads = std::min<int64_t>({8, std::max(1u, std::thread::hardware_concurrency()), n * H >> 20});
  if (threads <= 1) {
    vectors(0, n);
    return;
  }
  std::vector<std::thread> pool;
  for (int64_t k = 0; k < threads; ++k) pool.emplace_back(vectors, n * k / threads, n * (k + 1) / threads);
  for (std::thread& th : pool) th.join();
}

// F32 [rows, v H] = codes [rows, v H] U8 (e4m3fn) x scales [rows, v] F32.
Tensor dequantize_fp8(const Tensor& codes, const Tensor& scales, int64_t H) {
  // The 256 code values once (fp8_e4m3fn_to_float per element is branchy: about 3.7 ns a value on the
  // trainer's critical path, 20 s of a 62 s SmolLM2 run); the same products, so the same bits.
  static const std::array<float, 256> kValue = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[static_cast<size_t>(c)] = fp8_e4m3fn_to_float(static_cast<uint8_t>(c));
    return t;
  }();
  const int64_t rows = codes.dim(0), v = codes.dim(1) / H;
  Tensor out = Tensor::empty({rows, v * H}, DType::F32);
  const uint8_t* q = codes.data<uint8_t>();
  const float* sc = scales.data<float>();
  float* o = out.data<float>();
  for (int64_t r = 0; r < rows * v; ++r) {
    const float s = sc[r];
    const uint8_t* qr = q + r * H;
    float* orow = o + r * H;
    for (int64_t j = 0; j < H; ++j) orow[j] = kValue[qr[j]] * s;
  }
  return out;
}

// The first row of a BF16 [rows, cols] host tensor holding a NaN or an infinity (exponent bits all ones),
// -1 if none.
int64_t first_nonfinite_row(const Tensor& t) {
  const uint16_t* p = static_cast<const uint16_t*>(t.raw());  // bf16 bits
  const int64_t rows = t.dim(0), cols = t.numel() / std::max<int64_t>(1, rows);
  // Branch-free over each row, four bf16 values per 64-bit word (SWAR): a value is NaN or infinite when its
  // exponent bits 0x7F80 are all set, i.e. when (x & 0x7F80) ^ 0x7F80 is 0; a zero 16-bit lane of v is
  // found by (v - 0x0001...) & ~v & 0x8000... (bit 15 of v is always clear, so a lane's borrow can only
  // mark the lane above a zero one, and "any" stays exact). GCC -O2 does not vectorize the plain per-value
  // loop: the writer thread spent ~11 ms per 2048 x 16384 sample in it (perf), ~3x this.
  constexpr uint64_t kExp = 0x7F807F807F807F80ull, kOne = 0x0001000100010001ull, kTop = 0x8000800080008000ull;
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* q = p + r * cols;
    uint64_t bad = 0;
    int64_t c = 0;
    for (; c + 4 <= cols; c += 4) {
      uint64_t w;
      std::memcpy(&w, q + c, sizeof w);
      const uint64_t v = (w & kExp) ^ kExp;
      bad |= (v - kOne) & ~v & kTop;
    }
    for (; c < cols; ++c) bad |= (q[c] & 0x7F80u) == 0x7F80u;
    if (bad) return r;
  }
  return -1;
}

// Flushes a closed file's data to disk, so that after the rename a crash cannot leave a shard-*.h5 name
// pointing at incomplete data.
void fsync_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  AERIE_CHECK(fd >= 0, "cannot open " << path << " for fsync");
  int rc = ::fsync(fd);
  ::close(fd);
  AERIE_CHECK(rc == 0, "fsync of " << path << " failed");
}
}  // namespace

struct ShardWriter::Impl {
  h5::File file;
  h5::Dataset aux, fin;
  h5::Dataset aux_s, fin_s;  // fp8: the per-vector scales
  int64_t H = 0;
  int fd = -1;  // "<path>.tmp" opened read-only, to start the writeback of what HDF5 wrote
  ~Impl() {
    if (fd >= 0) ::close(fd);
  }
  /// Starts the kernel's writeback of the file's dirty pages without waiting for it (Linux; elsewhere
  /// nothing), so that the disk writes overlap the next forward instead of piling up for close()'s fsync
  /// (which stalled extraction on a 1 GB shard). Best effort: an error here shows again at the fsync.
  void start_writeback() const {
#ifdef __linux__
    if (fd >= 0) ::sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE);
#endif
  }
};

ShardWriter::ShardWriter(std::string path, ShardMeta meta, std::vector<int64_t> sample_lengths, NonFinite on_nonfinite)
    : impl_(std::make_unique<Impl>()), path_(std::move(path)), tmp_(path_ + ".tmp"), meta_(std::move(meta)),
      on_nonfinite_(on_nonfinite), lengths_(std::move(sample_lengths)) {
  AERIE_CHECK(meta_.hidden_size > 0, "ShardWriter " << path_ << ": hidden_size must be > 0");
  AERIE_CHECK(meta_.aux_layers.size() == 3, "ShardWriter " << path_ << ": 3 aux layers expected, got "
                                                           << meta_.aux_layers.size());
  int64_t T = 0;
  for (int64_t n : lengths_) {
    AERIE_CHECK(n > 0, "ShardWriter " << path_ << ": empty sample");
    T += n;
  }
  const int64_t H = meta_.hidden_size;
  impl_->H = H;
  // Serial file (one writer per shard). Objects are created in a fixed order, contiguous, without
  // compression: the same calls give the same bytes.
  impl_->file = h5::File::create(tmp_);
  create_hidden(impl_->file, T, H, meta_.fp8, impl_->aux, impl_->fin, impl_->aux_s, impl_->fin_s);
  impl_->fd = ::open(tmp_.c_str(), O_RDONLY);
  ids_.reserve(static_cast<size_t>(T));
  mask_.reserve(static_cast<size_t>(T));
}

ShardWriter::~ShardWriter() {
  if (impl_ && impl_->file.valid()) {  // not closed: an exception unwound past the writer
    impl_->aux = h5::Dataset();
    impl_->fin = h5::Dataset();
    impl_->aux_s = h5::Dataset();
    impl_->fin_s = h5::Dataset();
    impl_->file = h5::File();
    std::error_code ec;
    fs::remove(path_ + ".tmp", ec);
    fs::remove(tmp_, ec);
  }
}

bool ShardWriter::add(int64_t sample_index, const std::vector<int32_t>& ids, const std::vector<uint8_t>& loss_mask,
                      const Tensor& aux_hidden, const Tensor& final_hidden) {
  const size_t k = static_cast<size_t>(added_);
  AERIE_CHECK(impl_->file.valid(), "ShardWriter " << path_ << ": add after close");
  AERIE_CHECK(k < lengths_.size(), "ShardWriter " << path_ << ": more than the announced " << lengths_.size()
                                                  << " samples");
  const int64_t T = lengths_[k], H = impl_->H;
  AERIE_CHECK(static_cast<int64_t>(ids.size()) == T && static_cast<int64_t>(loss_mask.size()) == T,
              "ShardWriter " << path_ << ": sample " << sample_index << " has " << ids.size() << " ids and "
                             << loss_mask.size() << " mask values, announced " << T);
  std::string what = path_ + " sample " + std::to_string(sample_index);
  const Tensor aux = as_bf16(aux_hidden, T, 3 * H, what + " aux_hidden");
  const Tensor fin = as_bf16(final_hidden, T, H, what + " final_hidden");
  ++added_;
  for (const auto& [t, name] : {std::pair<const Tensor*, const char*>{&aux, "aux_hidden_states (f_t)"},
                                 std::pair<const Tensor*, const char*>{&fin, "final_hidden_states (z_t)"}}) {
    const int64_t row = first_nonfinite_row(*t);
    if (row < 0) continue;
    const int32_t id = ids[static_cast<size_t>(row)];
    if (on_nonfinite_ == NonFinite::Skip) {
      AERIE_LOG(warning) << "extract: skipping prepared sample " << sample_index << " (--skip-nonfinite): its " << name
                         << " holds a NaN or an infinity at token " << row << " (id " << id << "); not written to "
                         << path_;
      skipped_.push_back(sample_index);
      skipped_tokens_ += T;
      return false;
    }
    AERIE_THROW("ShardWriter " << path_ << ": prepared sample " << sample_index << " has a non-finite " << name
                               << " at token " << row << " (id " << id
                               << "): the target's forward gave NaN or inf (its weights, e.g. the embedding row of "
                                  "that id, or an overflow in its precision); extract --skip-nonfinite leaves such "
                                  "samples out, named and counted");
  }
  const int64_t row0 = offsets_.back();
  if (meta_.fp8) {
    Tensor q, sc;
    quantize_fp8(aux, H, q, sc);
    impl_->aux.write_rows(row0, q);
    impl_->aux_s.write_rows(row0, sc);
    quantize_fp8(fin, H, q, sc);
    impl_->fin.write_rows(row0, q);
    impl_->fin_s.write_rows(row0, sc);
  } else {
    impl_->aux.write_rows(row0, aux);
    impl_->fin.write_rows(row0, fin);
  }
  impl_->start_writeback();
  offsets_.push_back(row0 + T);
  sample_index_.push_back(sample_index);
  ids_.insert(ids_.end(), ids.begin(), ids.end());
  mask_.insert(mask_.end(), loss_mask.begin(), loss_mask.end());
  return true;
}

void ShardWriter::compact() {
  const int64_t T = offsets_.back(), H = impl_->H;
  const std::string kept = path_ + ".kept.tmp";
  h5::File f = h5::File::create(kept);
  h5::Dataset aux, fin, aux_s, fin_s;
  create_hidden(f, T, H, meta_.fp8, aux, fin, aux_s, fin_s);
  constexpr int64_t kRows = 4096;  // a block of rows per copy: memory stays small for any shard
  for (int64_t r = 0; r < T; r += kRows) {
    const int64_t e = std::min(T, r + kRows);
    aux.write_rows(r, impl_->aux.read_rows(r, e));
    fin.write_rows(r, impl_->fin.read_rows(r, e));
    if (meta_.fp8) {
      aux_s.write_rows(r, impl_->aux_s.read_rows(r, e));
      fin_s.write_rows(r, impl_->fin_s.read_rows(r, e));
    }
  }
  impl_->aux = h5::Dataset();
  impl_->fin = h5::Dataset();
  impl_->aux_s = h5::Dataset();
  impl_->fin_s = h5::Dataset();
  impl_->file.close();
  if (impl_->fd >= 0) ::close(impl_->fd);
  impl_->fd = -1;
  std::error_code ec;
  fs::remove(tmp_, ec);
  tmp_ = kept;
  impl_->file = std::move(f);
  impl_->aux = std::move(aux);
  impl_->fin = std::move(fin);
  impl_->aux_s = std::move(aux_s);
  impl_->fin_s = std::move(fin_s);
}

void ShardWriter::close() {
  AERIE_CHECK(impl_->file.valid(), "ShardWriter " << path_ << ": closed twice");
  AERIE_CHECK(added_ == static_cast<int64_t>(lengths_.size()), "ShardWriter " << path_ << ": " << added_ << " of "
                                                                              << lengths_.size()
                                                                              << " samples added before close");
  if (!skipped_.empty()) compact();
  h5::File& f = impl_->file;
  const int64_t T = offsets_.back(), n = static_cast<int64_t>(sample_index_.size());
  auto put = [&](const char* name, const Tensor& t) { create_untimed(f, name, t.dtype(), t.shape()).write(t); };
  put("input_ids", Tensor::from_vector(ids_, {T}));
  put("loss_mask", Tensor::from_vector(mask_, {T}));
  put("sample_offsets", Tensor::from_vector(offsets_, {n + 1}));
  put("sample_index", Tensor::from_vector(sample_index_, {n}));
  f.set_string_attr("format", kShardFormat);
  f.set_int_attr("format_version", meta_.fp8 ? kShardFormatVersionFp8 : kShardFormatVersion);
  f.set_string_attr("aerie_version", aerie_version_string());
  f.set_string_attr("target_model", meta_.target_model);
  f.set_ints_attr("aux_layers", std::vector<int64_t>(meta_.aux_layers.begin(), meta_.aux_layers.end()));
  f.set_string_attr("aux_layer_convention", kAuxLayerConvention);
  f.set_int_attr("hidden_size", meta_.hidden_size);
  f.set_int_attr("num_hidden_layers", meta_.num_hidden_layers);
  f.set_string_attr("dtype", meta_.fp8 ? "float8_e4m3fn" : "bfloat16");
  f.set_int_attr("num_samples", n);
  f.set_int_attr("num_tokens", T);
  f.set_int_attr("chunk", meta_.chunk);
  if (!meta_.target.config_sha256.empty()) {
    f.set_string_attr("target_config_sha256", meta_.target.config_sha256);
    f.set_string_attr("target_weights_sha256", meta_.target.weights_sha256);
  }
  if (!meta_.prepared_sha256.empty()) f.set_string_attr("prepared_sha256", meta_.prepared_sha256);
  if (!meta_.target_gemm.empty()) f.set_string_attr("target_gemm", meta_.target_gemm);
  if (!meta_.target_dtype.empty()) f.set_string_attr("target_dtype", meta_.target_dtype);
  if (meta_.num_chunks > 0) {
    f.set_int_attr("prepared_num_samples", meta_.prepared_num_samples);
    f.set_int_attr("samples_per_shard", meta_.samples_per_shard);
    f.set_int_attr("num_chunks", meta_.num_chunks);
  }
  if (!skipped_.empty()) f.set_ints_attr("skipped_nonfinite", skipped_);
  impl_->aux = h5::Dataset();
  impl_->fin = h5::Dataset();
  impl_->aux_s = h5::Dataset();
  impl_->fin_s = h5::Dataset();
  f.close();
  impl_->file = h5::File();
  fsync_file(tmp_);
  std::error_code ec;
  fs::rename(tmp_, path_, ec);
  AERIE_CHECK(!ec, "ShardWriter: cannot rename " << tmp_ << " to " << path_ << ": " << ec.message());
}

std::string fp8_gemm_tag(int tp) { return "w8a8-fp8-block, tp " + std::to_string(tp); }

// ---------------------------------------------------------------------------------------------- reader

struct ShardReader::Impl {
  h5::File file;
  h5::Dataset aux, fin;
  h5::Dataset aux_s, fin_s;  // version 2 (fp8): the per-vector scales
  std::vector<int64_t> offsets, sample_index;
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;
  uintmax_t bytes = 0;  // the file's size when opened: HDF5 reads past a later truncation as zeros
};

ShardReader::ShardReader(const std::string& path) : impl_(std::make_unique<Impl>()) {
  info_.path = path;
  AERIE_CHECK(fs::is_regular_file(path), "shard " << path << ": no such file");
  Impl& m = *impl_;
  m.bytes = fs::file_size(path);
  m.file = h5::File::open(path);
  std::string format = m.file.has_attr("format") ? m.file.string_attr("format") : "(none)";
  AERIE_CHECK(format == kShardFormat, "shard " << path << ": format is '" << format << "', expected '"
                                               << kShardFormat << "'");
  int64_t version = m.file.int_attr("format_version");
  AERIE_CHECK(version == kShardFormatVersion || version == kShardFormatVersionFp8,
              "shard " << path << ": format_version " << version << ", this build reads " << kShardFormatVersion
                       << " (bf16) and " << kShardFormatVersionFp8 << " (fp8)");
  info_.fp8 = version == kShardFormatVersionFp8;
  info_.num_samples = m.file.int_attr("num_samples");
  info_.num_tokens = m.file.int_attr("num_tokens");
  info_.hidden_size = m.file.int_attr("hidden_size");
  info_.num_hidden_layers = m.file.int_attr("num_hidden_layers");
  info_.chunk = m.file.int_attr("chunk");
  info_.target_model = m.file.string_attr("target_model");
  for (int64_t a : m.file.ints_attr("aux_layers")) info_.aux_layers.push_back(static_cast<int>(a));
  // Provenance: absent from shards of an older aerie.
  auto str = [&](const char* name) { return m.file.has_attr(name) ? m.file.string_attr(name) : std::string(); };
  auto num = [&](const char* name) { return m.file.has_attr(name) ? m.file.int_attr(name) : int64_t{-1}; };
  info_.target.config_sha256 = str("target_config_sha256");
  info_.target.weights_sha256 = str("target_weights_sha256");
  info_.prepared_sha256 = str("prepared_sha256");
  info_.target_gemm = str("target_gemm");
  info_.target_dtype = str("target_dtype");
  info_.prepared_num_samples = num("prepared_num_samples");
  info_.samples_per_shard = num("samples_per_shard");
  info_.num_chunks = num("num_chunks");
  if (m.file.has_attr("skipped_nonfinite")) info_.skipped_nonfinite = m.file.ints_attr("skipped_nonfinite");
  const int64_t n = info_.num_samples, T = info_.num_tokens, H = info_.hidden_size;

  auto small = [&](const char* name, const Shape& want) {
    h5::Dataset d = m.file.open_dataset(name);
    AERIE_CHECK(d.shape() == want, "shard " << path << ": dataset " << name << " has shape "
                                            << shape_str(d.shape()) << ", expected " << shape_str(want));
    return d;
  };
  m.offsets = small("sample_offsets", {n + 1}).read_vector<int64_t>();
  m.sample_index = small("sample_index", {n}).read_vector<int64_t>();
  m.ids = small("input_ids", {T}).read_vector<int32_t>();
  m.mask = small("loss_mask", {T}).read_vector<uint8_t>();
  AERIE_CHECK(m.offsets.front() == 0 && m.offsets.back() == T,
              "shard " << path << ": sample_offsets run from " << m.offsets.front() << " to " << m.offsets.back()
                       << ", expected 0 to num_tokens " << T);
  for (int64_t i = 0; i < n; ++i)
    AERIE_CHECK(m.offsets[i] <= m.offsets[i + 1], "shard " << path << ": sample_offsets decrease at " << i);
  m.aux = small("aux_hidden_states", {T, 3 * H});
  m.fin = small("final_hidden_states", {T, H});
  if (info_.fp8) {
    m.aux_s = small("aux_hidden_scales", {T, 3});
    m.fin_s = small("final_hidden_scales", {T, 1});
    AERIE_CHECK(m.aux.dtype() == DType::U8 && m.fin.dtype() == DType::U8 && m.aux_s.dtype() == DType::F32 &&
                    m.fin_s.dtype() == DType::F32,
                "shard " << path << ": a version 2 shard's hidden states are not fp8 codes (uint8) with F32 scales");
  } else {
    AERIE_CHECK(m.aux.dtype() == DType::BF16 && m.fin.dtype() == DType::BF16,
                "shard " << path << ": hidden states are not bfloat16 (uint16 with attribute dtype=\"bfloat16\")");
  }
}

ShardReader::~ShardReader() = default;
ShardReader::ShardReader(ShardReader&&) noexcept = default;
ShardReader& ShardReader::operator=(ShardReader&&) noexcept = default;

int64_t ShardReader::sample_length(int64_t i) const {
  AERIE_CHECK(i >= 0 && i < info_.num_samples, "shard " << info_.path << ": sample " << i << " out of range [0, "
                                                        << info_.num_samples << ")");
  return impl_->offsets[i + 1] - impl_->offsets[i];
}

const std::vector<int32_t>& ShardReader::input_ids() const { return impl_->ids; }
const std::vector<uint8_t>& ShardReader::loss_mask() const { return impl_->mask; }
const std::vector<int64_t>& ShardReader::sample_indices() const { return impl_->sample_index; }

HiddenSample ShardReader::read(int64_t i, DType hidden) const {
  AERIE_CHECK(hidden == DType::F32 || hidden == DType::BF16,
              "ShardReader::read: hidden states are read as F32 or BF16, not " << dtype_name(hidden));
  const int64_t T = sample_length(i);
  const Impl& m = *impl_;
  // A shard truncated or replaced while open (a copy or cleanup beside a running train) would read as zeros
  // past its new end: a stat per sample names it instead.
  std::error_code ec;
  const uintmax_t now = fs::file_size(info_.path, ec);
  AERIE_CHECK(!ec && now == m.bytes, "shard " << info_.path << " sample " << i << ": the file changed since it was "
                                              << "opened (" << m.bytes << " bytes, now "
                                              << (ec ? ec.message() : std::to_string(now) + " bytes")
                                              << "): truncated, replaced or removed while being read");
  const int64_t b = m.offsets[i];
  HiddenSample s;
  s.sample_index = m.sample_index[i];
  s.ids.assign(m.ids.begin() + b, m.ids.begin() + b + T);
  s.loss_mask.assign(m.mask.begin() + b, m.mask.begin() + b + T);
  try {
    if (info_.fp8) {
      const int64_t H = info_.hidden_size;
      s.aux_hidden = dequantize_fp8(m.aux.read_rows(b, b + T), m.aux_s.read_rows(b, b + T), H);
      s.final_hidden = dequantize_fp8(m.fin.read_rows(b, b + T), m.fin_s.read_rows(b, b + T), H);
    } else {
      s.aux_hidden = m.aux.read_rows(b, b + T);
      s.final_hidden = m.fin.read_rows(b, b + T);
      if (hidden == DType::F32) {
        s.aux_hidden = s.aux_hidden.to(DType::F32);
        s.final_hidden = s.final_hidden.to(DType::F32);
      }
    }
  } catch (const Error& e) {
    AERIE_THROW("shard " << info_.path << " sample " << i << ": " << e.what());
  }
  return s;
}

}  // namespace aerie
