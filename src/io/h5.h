// HDF5 through small RAII wrappers over the C API (HDF5 1.10+, parallel build). A File is serial or
// parallel (MPI-IO, H5Pset_fapl_mpio); Groups and Datasets live in it; attributes (strings, ints, int
// arrays, doubles) hang on any of them. Every failure throws aerie::Error naming the file, the object and
// the innermost HDF5 message; HDF5's automatic error printing is switched off.
//
// Datasets hold F32, I32, I64, U8 or BF16. BF16 is stored as uint16 (the raw bits) with the dataset
// attribute "dtype" = "bfloat16", so h5py users read it as `np.uint16` and view it as bfloat16
// (`torch.from_numpy(a).view(torch.bfloat16)`).
//
// Parallel files: creating/opening/closing files, creating groups/datasets, writing attributes and
// extending datasets are collective (every rank of the file's communicator calls them with the same
// arguments). Raw data writes default to collective transfers (H5FD_MPIO_COLLECTIVE): every rank calls
// write_rows the same number of times, with 0 rows where it has nothing. Reads are independent.
// Close every Dataset and Group before File::close (the MPI-IO driver refuses to close a file with open
// objects; File::close names them).
// Failures in parallel files: the ranks agree on the outcome of every collective operation before
// the next one (core/agree.h: one all-reduce of a failure flag), so when it failed on any rank (a full disk
// under one rank's write, rows outside a dataset) every rank throws aerie::CollectiveError with that rank's
// message together, and none is left waiting in another collective. While an exception unwinds, a parallel
// file's objects are not closed (the close is collective): HDF5 closes them at MPI_Finalize, on every rank.
// Test hook: AERIE_TEST_FAIL_H5_WRITE=R fails every collective raw-data write of rank R of a parallel file
// (after HDF5 wrote it), as a full disk under that rank's write would.
#pragma once
#include <hdf5.h>
#include <mpi.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace aerie::h5 {

/// The 8 bytes every HDF5 file begins with (the superblock signature), for naming a file by its content.
inline constexpr std::string_view kSignature{"\x89HDF\r\n\x1a\n", 8};

/// A handle to an HDF5 object (file, group or dataset); closes it on destruction. Movable, not copyable.
class Object {
 public:
  Object() = default;
  Object(Object&& o) noexcept;
  Object& operator=(Object&& o) noexcept;
  Object(const Object&) = delete;
  Object& operator=(const Object&) = delete;
  virtual ~Object();

  bool valid() const { return id_ >= 0; }
  hid_t id() const { return id_; }
  const std::string& file_path() const { return file_; }
  /// Path inside the file: "/" for the file itself, "/shard/hidden" for a dataset.
  const std::string& name() const { return name_; }
  /// "file.h5:/name", for messages.
  std::string where() const;

  bool has_attr(const std::string& attr) const;
  /// Attribute writers replace an existing attribute of that name. Strings: fixed-length UTF-8.
  void set_string_attr(const std::string& attr, const std::string& value);
  void set_int_attr(const std::string& attr, int64_t value);
  void set_double_attr(const std::string& attr, double value);
  void set_ints_attr(const std::string& attr, const std::vector<int64_t>& values);  // 1-D I64
  /// Attribute readers throw aerie::Error naming the object if the attribute is missing or of
  /// another kind (any integer type reads as int64; fixed- and variable-length strings both read).
  std::string string_attr(const std::string& attr) const;
  int64_t int_attr(const std::string& attr) const;
  double double_attr(const std::string& attr) const;
  std::vector<int64_t> ints_attr(const std::string& attr) const;

 protected:
  Object(hid_t id, std::string file, std::string name, herr_t (*closer)(hid_t), MPI_Comm comm);
  /// Closes the handle; throws aerie::Error if HDF5 reports a failure.
  void close_handle();
  /// Whether the destructor leaves the handle open: an object of a parallel file destroyed while an
  /// exception unwinds the stack (its close is collective, and the other ranks may be elsewhere).
  bool skip_collective_close() const;

  hid_t id_ = -1;
  std::string file_, name_;
  herr_t (*closer_)(hid_t) = nullptr;
  MPI_Comm comm_ = MPI_COMM_NULL;  // the file's communicator (MPI_COMM_NULL: serial file)
  int uncaught_at_open_ = 0;        // std::uncaught_exceptions() when the handle was made
};

/// Layout options of a new dataset.
struct DatasetOptions {
  /// Chunked layout with chunks of this many rows (dim 0) if > 0, contiguous otherwise.
  int64_t chunk_rows = 0;
  /// Dim 0 unlimited (Dataset::extend grows it); needs chunk_rows > 0 (1024 rows if left 0).
  bool extendable = false;
  /// Record object modification times (HDF5's default). Off: equal content gives equal bytes.
  bool track_times = true;
  /// Write fill values when the storage is allocated (HDF5's default). Off (H5D_FILL_TIME_NEVER) when every
  /// element will be written anyway: saves a pass over the file in parallel files (early allocation).
  bool fill = true;
};

class Dataset;
class Group;

/// A file or group: the container of groups and datasets.
class Location : public Object {
 public:
  Location() = default;
  /// Whether `path` (relative, may contain '/') names a link below this location.
  bool exists(const std::string& path) const;
  /// Names of the direct members (groups and datasets), in name order.
  std::vector<std::string> members() const;
  Group create_group(const std::string& path);
  Group open_group(const std::string& path) const;
  /// New dataset of `shape` (any rank >= 1; dim 0 = rows). Throws if it exists already.
  Dataset create_dataset(const std::string& path, DType dtype, const Shape& shape,
                         const DatasetOptions& options = {});
  Dataset open_dataset(const std::string& path) const;
  /// create_dataset + Dataset::write of the whole tensor (in a parallel file: rank 0's data).
  Dataset write_dataset(const std::string& path, const Tensor& t, const DatasetOptions& options = {});
  /// The whole dataset as a CPU tensor of its dtype.
  Tensor read_dataset(const std::string& path) const;

 protected:
  Location(hid_t id, std::string file, std::string name, herr_t (*closer)(hid_t), MPI_Comm comm)
      : Object(id, std::move(file), std::move(name), closer, comm) {}

 private:
  /// create_dataset's HDF5 part on one rank: the new dataset's id. Throws aerie::Error.
  hid_t create_dataset_id(const std::string& path, const std::string& full, DType dtype, const Shape& shape,
                          const DatasetOptions& options);
};

class Group : public Location {
 public:
  Group() = default;

 private:
  friend class Location;
  Group(hid_t id, std::string file, std::string name, MPI_Comm comm)
      : Location(id, std::move(file), std::move(name), H5Gclose, comm) {}
};

enum class Access : uint8_t { ReadOnly, ReadWrite };
enum class Transfer : uint8_t { Collective, Independent };

/// An HDF5 file. Serial when comm == MPI_COMM_NULL, parallel (MPI-IO) otherwise; the file keeps its own
/// duplicate of comm.
class File : public Location {
 public:
  File() = default;
  File(File&& o) noexcept = default;
  File& operator=(File&& o) noexcept;
  ~File() override;
  /// Creates (truncates) `path`. Collective over comm in a parallel file.
  static File create(const std::string& path, MPI_Comm comm = MPI_COMM_NULL);
  /// Opens an existing file. Throws aerie::Error naming the path if it is missing or not HDF5.
  static File open(const std::string& path, Access access = Access::ReadOnly, MPI_Comm comm = MPI_COMM_NULL);

  bool parallel() const { return comm_ != MPI_COMM_NULL; }
  MPI_Comm comm() const { return comm_; }
  void flush();
  /// Closes the file (collective when parallel) and reports failures; the destructor closes silently.
  void close();

 private:
  File(hid_t id, std::string path, MPI_Comm comm) : Location(id, std::move(path), "/", H5Fclose, comm) {}
  /// close()'s part on one rank: refuses while objects are open, then closes the handle.
  void close_file();
};

/// An n-dimensional dataset; dim 0 is "rows" for partial I/O.
class Dataset : public Object {
 public:
  Dataset() = default;
  /// Stored dtype (BF16 for uint16 data with attribute dtype = "bfloat16").
  DType dtype() const;
  Shape shape() const;
  int64_t rows() const { return shape().at(0); }

  /// Writes the whole dataset from `t` (same shape; dtype converted through HDF5 for numeric types,
  /// BF16 only from BF16). In a parallel file every rank calls it and only rank 0's `t` is written
  /// (other ranks may pass an undefined Tensor).
  void write(const Tensor& t);
  /// Writes rows [row_begin, row_begin + t.dim(0)) from `t` [n, shape[1:]...]; n may be 0 (or `t`
  /// undefined: nothing to write). In a parallel file with Transfer::Collective every rank calls it the
  /// same number of times (large writes are split into rounds of <= 1 GiB per rank, agreed by an
  /// MPI_Allreduce). Throws aerie::Error naming file and dataset on a shape/dtype mismatch or rows
  /// outside the dataset.
  void write_rows(int64_t row_begin, const Tensor& t, Transfer transfer = Transfer::Collective);
  /// The whole dataset (CPU tensor of dtype()).
  Tensor read() const;
  /// Rows [begin, end) as a CPU tensor of dtype() [end - begin, shape[1:]...].
  Tensor read_rows(int64_t begin, int64_t end) const;
  /// Reads rows [begin, begin + out.dim(0)) into `out` (same trailing shape; dtype F32/I32/I64/U8
  /// converted through HDF5 from any numeric dtype, BF16 only from BF16).
  void read_rows_into(int64_t begin, Tensor& out) const;
  /// The whole dataset flattened into a vector of T (numeric conversion through HDF5; not for BF16).
  template <typename T>
  std::vector<T> read_vector() const {
    Shape s = shape();
    int64_t n = 1;
    for (int64_t d : s) n *= d;
    std::vector<T> v(static_cast<size_t>(n));
    Shape flat = s;
    Tensor view = Tensor::wrap(v.data(), flat, dtype_of<T>());
    read_rows_into(0, view);
    return v;
  }
  /// Grows (or shrinks) dim 0 of an extendable dataset to `rows` (collective in a parallel file).
  void extend(int64_t rows);

 private:
  friend class Location;
  Dataset(hid_t id, std::string file, std::string name, MPI_Comm comm)
      : Object(id, std::move(file), std::move(name), H5Dclose, comm) {}
  void transfer(int64_t row_begin, int64_t nrows, const Tensor* t, void* out, DType mem_dtype,
                Transfer mode) const;
};

/// Turns off HDF5's automatic error printing (idempotent; File::create/open call it).
void init();

}  // namespace aerie::h5
