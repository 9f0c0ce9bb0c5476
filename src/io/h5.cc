#include "io/h5.h"
#include "core/settings.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <sstream>

#include "core/agree.h"
#include "core/error.h"

namespace aerie::h5 {

namespace {

// The innermost (most specific) message of HDF5's error stack, cleared afterwards.
herr_t walk_cb(unsigned n, const H5E_error2_t* err, void* data) {
  auto* out = static_cast<std::string*>(data);
  if (n == 0 && err->desc) *out = err->desc;  // walked upward: entry 0 is the innermost
  return 0;
}
// HDF5's sec2 driver writes a failed write(2) as "file write failed: time = ..., filename = ..., errno = 28,
// error message = 'No space left on device', buf = 0x..., ..." over two lines: only the first words and the
// system's message are kept ("file write failed: No space left on device"); the caller names the file.
std::string short_hdf5_message(const std::string& msg) {
  const std::string key = "error message = '";
  const size_t colon = msg.find(": time = "), at = msg.find(key);
  if (colon == std::string::npos || at == std::string::npos) return msg;
  const size_t end = msg.find('\'', at + key.size());
  if (end == std::string::npos) return msg;
  return msg.substr(0, colon) + ": " + msg.substr(at + key.size(), end - at - key.size());
}

std::string hdf5_message() {
  std::string msg;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, walk_cb, &msg);
  H5Eclear2(H5E_DEFAULT);
  return msg.empty() ? std::string() : " (HDF5: " + short_hdf5_message(msg) + ")";
}

#define H5_CHECK(expr, msg)                                           \
  do {                                                                \
    if ((expr) < 0) {                                                 \
      std::string h5msg_ = hdf5_message();                            \
      AERIE_THROW(msg << h5msg_);                                     \
    }                                                                 \
  } while (0)

// Closes a temporary HDF5 id (type, space, property list, attribute) at scope exit.
struct Id {
  hid_t id;
  herr_t (*closer)(hid_t);
  Id(hid_t i, herr_t (*c)(hid_t)) : id(i), closer(c) {}
  ~Id() {
    if (id >= 0) closer(id);
  }
  Id(const Id&) = delete;
  Id& operator=(const Id&) = delete;
  operator hid_t() const { return id; }
};

hid_t file_type(DType dt) {
  switch (dt) {
    case DType::F32: return H5T_IEEE_F32LE;
    case DType::I32: return H5T_STD_I32LE;
    case DType::I64: return H5T_STD_I64LE;
    case DType::U8: return H5T_STD_U8LE;
    case DType::BF16: return H5T_STD_U16LE;
    case DType::F16: break;  // storage of checkpoints only: no HDF5 file holds it
    case DType::F8E4M3: break;
  }
  return -1;
}
hid_t mem_type(DType dt) {
  switch (dt) {
    case DType::F32: return H5T_NATIVE_FLOAT;
    case DType::I32: return H5T_NATIVE_INT32;
    case DType::I64: return H5T_NATIVE_INT64;
    case DType::U8: return H5T_NATIVE_UINT8;
    case DType::BF16: return H5T_NATIVE_UINT16;
    case DType::F16: break;
    case DType::F8E4M3: break;
  }
  return -1;
}

std::string join(const std::string& base, const std::string& path) {
  if (!path.empty() && path[0] == '/') return path;
  return base == "/" ? "/" + path : base + "/" + path;
}

constexpr int64_t kMaxRoundBytes = int64_t{1} << 30;  // per rank and collective write call

// A collective operation of a parallel file (comm != MPI_COMM_NULL): run on every rank of the file, then
// agreed on (core/agree.h), so that a rank that failed never unwinds into a collective close while the others
// go on to the next collective operation (a full disk hung prepare on 2 ranks). A serial file's
// operation just runs.
void collective_op(MPI_Comm comm, const std::function<void()>& op) {
  if (comm == MPI_COMM_NULL) {
    op();
    return;
  }
  agree_on_step(comm, op);
}

// The test hook of a failed collective write (a full disk on one rank): AERIE_TEST_FAIL_H5_WRITE=R makes
// every collective raw-data write of rank R of a parallel file fail after HDF5 wrote it, as H5Dwrite does
// when the aggregator's write hits ENOSPC. For the tests only (tests/mpi/prepare_write_failure.sh).
void injected_write_failure(MPI_Comm comm, const std::string& where) {
  const int failing = settings().test_fail_h5_write;
  if (failing < 0) return;
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  if (failing == rank)
    AERIE_THROW("HDF5: cannot write " << where << " (HDF5: injected write failure, AERIE_TEST_FAIL_H5_WRITE="
                                      << failing << ")");
}

}  // namespace

void init() {
  static std::once_flag once;
  std::call_once(once, [] {
    H5open();
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  });
}

// ---------------------------------------------------------------------------------------------------
// Object

Object::Object(hid_t id, std::string file, std::string name, herr_t (*closer)(hid_t), MPI_Comm comm)
    : id_(id), file_(std::move(file)), name_(std::move(name)), closer_(closer), comm_(comm),
      uncaught_at_open_(std::uncaught_exceptions()) {}

Object::Object(Object&& o) noexcept
    : id_(o.id_), file_(std::move(o.file_)), name_(std::move(o.name_)), closer_(o.closer_), comm_(o.comm_),
      uncaught_at_open_(o.uncaught_at_open_) {
  o.id_ = -1;
  o.comm_ = MPI_COMM_NULL;
}

Object& Object::operator=(Object&& o) noexcept {
  if (this != &o) {
    if (id_ >= 0 && closer_) closer_(id_);
    id_ = o.id_;
    file_ = std::move(o.file_);
    name_ = std::move(o.name_);
    closer_ = o.closer_;
    comm_ = o.comm_;
    uncaught_at_open_ = o.uncaught_at_open_;
    o.id_ = -1;
    o.comm_ = MPI_COMM_NULL;
  }
  return *this;
}

Object::~Object() {
  if (id_ >= 0 && closer_ && !skip_collective_close()) {
    closer_(id_);
    H5Eclear2(H5E_DEFAULT);
  }
}

bool Object::skip_collective_close() const {
  // While an exception unwinds the stack, a parallel file's close (collective: H5Fclose flushes and meets
  // the other ranks at a barrier) would wait for ranks that may be in another collective, or that have not
  // failed. The handle is left to HDF5's shutdown at MPI_Finalize (every rank, after an agreed failure) or
  // to MPI_Abort (main(), after a failure of one rank).
  return comm_ != MPI_COMM_NULL && std::uncaught_exceptions() > uncaught_at_open_;
}

void Object::close_handle() {
  if (id_ < 0) return;
  hid_t id = id_;
  id_ = -1;
  H5_CHECK(closer_(id), "HDF5: cannot close " << where());
}

std::string Object::where() const { return file_ + ":" + name_; }

bool Object::has_attr(const std::string& attr) const {
  AERIE_CHECK(valid(), "HDF5: attribute '" << attr << "' of a closed object");
  htri_t r = H5Aexists(id_, attr.c_str());
  H5_CHECK(r, "HDF5: cannot look up attribute '" << attr << "' of " << where());
  return r > 0;
}

namespace {
// Deletes an existing attribute, then creates `attr` with `type` and `space` and writes `buf`.
// Collective in a parallel file (agreed on by its ranks).
void write_attr(const Object& o, MPI_Comm comm, const std::string& attr, hid_t type, hid_t space, hid_t mtype,
                const void* buf) {
  collective_op(comm, [&] {
    AERIE_CHECK(o.valid(), "HDF5: attribute '" << attr << "' of a closed object");
    htri_t ex = H5Aexists(o.id(), attr.c_str());
    H5_CHECK(ex, "HDF5: cannot look up attribute '" << attr << "' of " << o.where());
    if (ex > 0)
      H5_CHECK(H5Adelete(o.id(), attr.c_str()), "HDF5: cannot replace attribute '" << attr << "' of " << o.where());
    Id a(H5Acreate2(o.id(), attr.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
    H5_CHECK(a.id, "HDF5: cannot create attribute '" << attr << "' of " << o.where());
    H5_CHECK(H5Awrite(a, mtype, buf), "HDF5: cannot write attribute '" << attr << "' of " << o.where());
  });
}
Id open_attr(const Object& o, const std::string& attr) {
  AERIE_CHECK(o.valid(), "HDF5: attribute '" << attr << "' of a closed object");
  htri_t ex = H5Aexists(o.id(), attr.c_str());
  H5_CHECK(ex, "HDF5: cannot look up attribute '" << attr << "' of " << o.where());
  AERIE_CHECK(ex > 0, "HDF5: " << o.where() << " has no attribute '" << attr << "'");
  Id a(H5Aopen(o.id(), attr.c_str(), H5P_DEFAULT), H5Aclose);
  H5_CHECK(a.id, "HDF5: cannot open attribute '" << attr << "' of " << o.where());
  return Id(std::exchange(a.id, -1), H5Aclose);
}
int64_t attr_numel(const Object& o, const std::string& attr, hid_t a) {
  Id space(H5Aget_space(a), H5Sclose);
  H5_CHECK(space.id, "HDF5: cannot read the space of attribute '" << attr << "' of " << o.where());
  hssize_t n = H5Sget_simple_extent_npoints(space);
  H5_CHECK(n, "HDF5: bad space of attribute '" << attr << "' of " << o.where());
  return n;
}
}  // namespace

void Object::set_string_attr(const std::string& attr, const std::string& value) {
  Id type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5_CHECK(type.id, "HDF5: string type");
  H5_CHECK(H5Tset_size(type, value.size() + 1), "HDF5: string type");
  H5_CHECK(H5Tset_strpad(type, H5T_STR_NULLTERM), "HDF5: string type");
  H5_CHECK(H5Tset_cset(type, H5T_CSET_UTF8), "HDF5: string type");
  Id space(H5Screate(H5S_SCALAR), H5Sclose);
  write_attr(*this, comm_, attr, type, space, type, value.c_str());
}

void Object::set_int_attr(const std::string& attr, int64_t value) {
  Id space(H5Screate(H5S_SCALAR), H5Sclose);
  write_attr(*this, comm_, attr, H5T_STD_I64LE, space, H5T_NATIVE_INT64, &value);
}

void Object::set_double_attr(const std::string& attr, double value) {
  Id space(H5Screate(H5S_SCALAR), H5Sclose);
  write_attr(*this, comm_, attr, H5T_IEEE_F64LE, space, H5T_NATIVE_DOUBLE, &value);
}

void Object::set_ints_attr(const std::string& attr, const std::vector<int64_t>& values) {
  hsize_t n = values.size();
  Id space(n == 0 ? H5Screate(H5S_NULL) : H5Screate_simple(1, &n, nullptr), H5Sclose);
  int64_t dummy = 0;
  write_attr(*this, comm_, attr, H5T_STD_I64LE, space, H5T_NATIVE_INT64, n ? values.data() : &dummy);
}

std::string Object::string_attr(const std::string& attr) const {
  Id a = open_attr(*this, attr);
  Id type(H5Aget_type(a), H5Tclose);
  H5_CHECK(type.id, "HDF5: cannot read the type of attribute '" << attr << "' of " << where());
  AERIE_CHECK(H5Tget_class(type) == H5T_STRING, "HDF5: attribute '" << attr << "' of " << where()
                                                                    << " is not a string");
  AERIE_CHECK(attr_numel(*this, attr, a) == 1, "HDF5: attribute '" << attr << "' of " << where()
                                                                      << " is not a scalar string");
  htri_t vlen = H5Tis_variable_str(type);
  H5_CHECK(vlen, "HDF5: attribute '" << attr << "' of " << where());
  if (vlen > 0) {
    Id mtype(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(mtype, H5T_VARIABLE);
    H5Tset_cset(mtype, H5Tget_cset(type));
    char* s = nullptr;
    H5_CHECK(H5Aread(a, mtype, &s), "HDF5: cannot read attribute '" << attr << "' of " << where());
    std::string out = s ? s : "";
    Id space(H5Aget_space(a), H5Sclose);
    H5Dvlen_reclaim(mtype, space, H5P_DEFAULT, &s);
    return out;
  }
  size_t size = H5Tget_size(type);
  std::string buf(size, '\0');
  H5_CHECK(H5Aread(a, type, buf.data()), "HDF5: cannot read attribute '" << attr << "' of " << where());
  buf.resize(std::strlen(buf.c_str()));  // NULLTERM and NULLPAD both end at the first NUL
  if (H5Tget_strpad(type) == H5T_STR_SPACEPAD) {
    while (!buf.empty() && buf.back() == ' ') buf.pop_back();
  }
  return buf;
}

std::vector<int64_t> Object::ints_attr(const std::string& attr) const {
  Id a = open_attr(*this, attr);
  Id type(H5Aget_type(a), H5Tclose);
  H5_CHECK(type.id, "HDF5: cannot read the type of attribute '" << attr << "' of " << where());
  AERIE_CHECK(H5Tget_class(type) == H5T_INTEGER, "HDF5: attribute '" << attr << "' of " << where()
                                                                      << " is not an integer");
  std::vector<int64_t> v(static_cast<size_t>(attr_numel(*this, attr, a)));
  if (v.empty()) return v;
  H5_CHECK(H5Aread(a, H5T_NATIVE_INT64, v.data()), "HDF5: cannot read attribute '" << attr << "' of " << where());
  return v;
}

int64_t Object::int_attr(const std::string& attr) const {
  std::vector<int64_t> v = ints_attr(attr);
  AERIE_CHECK(v.size() == 1, "HDF5: attribute '" << attr << "' of " << where() << " has " << v.size()
                                                 << " values, want one integer");
  return v[0];
}

double Object::double_attr(const std::string& attr) const {
  Id a = open_attr(*this, attr);
  Id type(H5Aget_type(a), H5Tclose);
  H5T_class_t cls = H5Tget_class(type);
  AERIE_CHECK(cls == H5T_FLOAT || cls == H5T_INTEGER, "HDF5: attribute '" << attr << "' of " << where()
                                                                          << " is not a number");
  AERIE_CHECK(attr_numel(*this, attr, a) == 1, "HDF5: attribute '" << attr << "' of " << where()
                                                                      << " is not a scalar");
  double v = 0;
  H5_CHECK(H5Aread(a, H5T_NATIVE_DOUBLE, &v), "HDF5: cannot read attribute '" << attr << "' of " << where());
  return v;
}

// ---------------------------------------------------------------------------------------------------
// Location

bool Location::exists(const std::string& path) const {
  AERIE_CHECK(valid(), "HDF5: lookup of '" << path << "' in a closed object");
  // H5Lexists needs every intermediate link to exist: walk the path.
  std::string prefix;
  std::stringstream ss(path);
  std::string part;
  while (std::getline(ss, part, '/')) {
    if (part.empty()) continue;
    prefix += prefix.empty() ? part : "/" + part;
    htri_t r = H5Lexists(id_, prefix.c_str(), H5P_DEFAULT);
    H5_CHECK(r, "HDF5: cannot look up '" << prefix << "' in " << where());
    if (r == 0) return false;
  }
  return true;
}

namespace {
herr_t member_cb(hid_t, const char* name, const H5L_info_t*, void* data) {
  static_cast<std::vector<std::string>*>(data)->push_back(name);
  return 0;
}
}  // namespace

std::vector<std::string> Location::members() const {
  std::vector<std::string> out;
  H5_CHECK(H5Literate(id_, H5_INDEX_NAME, H5_ITER_INC, nullptr, member_cb, &out),
           "HDF5: cannot list the members of " << where());
  return out;
}

Group Location::create_group(const std::string& path) {
  hid_t g = -1;
  collective_op(comm_, [&] {
    Id lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
    H5Pset_create_intermediate_group(lcpl, 1);
    g = H5Gcreate2(id_, path.c_str(), lcpl, H5P_DEFAULT, H5P_DEFAULT);
    H5_CHECK(g, "HDF5: cannot create group '" << path << "' in " << where());
  });
  return Group(g, file_, join(name_, path), comm_);
}

Group Location::open_group(const std::string& path) const {
  AERIE_CHECK(exists(path), "HDF5: " << file_ << " has no group " << join(name_, path));
  hid_t g = H5Gopen2(id_, path.c_str(), H5P_DEFAULT);
  H5_CHECK(g, "HDF5: cannot open group '" << path << "' in " << where());
  return Group(g, file_, join(name_, path), comm_);
}

Dataset Location::create_dataset(const std::string& path, DType dtype, const Shape& shape,
                                 const DatasetOptions& options) {
  const std::string full = join(name_, path);
  hid_t d = -1;
  collective_op(comm_, [&] { d = create_dataset_id(path, full, dtype, shape, options); });
  Dataset ds(d, file_, full, comm_);
  if (dtype == DType::BF16) ds.set_string_attr("dtype", "bfloat16");
  return ds;
}

hid_t Location::create_dataset_id(const std::string& path, const std::string& full, DType dtype, const Shape& shape,
                                  const DatasetOptions& options) {
  AERIE_CHECK(!shape.empty(), "HDF5: dataset " << file_ << ":" << full << " needs a rank >= 1 shape");
  AERIE_CHECK(!exists(path), "HDF5: dataset " << file_ << ":" << full << " exists already");
  std::vector<hsize_t> dims(shape.begin(), shape.end()), maxdims = dims;
  for (int64_t d : shape) AERIE_CHECK(d >= 0, "HDF5: dataset " << file_ << ":" << full << " shape " << shape_str(shape));
  Id dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  int64_t chunk_rows = options.chunk_rows;
  if (options.extendable) {
    maxdims[0] = H5S_UNLIMITED;
    if (chunk_rows <= 0) chunk_rows = 1024;
  }
  if (chunk_rows > 0) {
    std::vector<hsize_t> chunk = dims;
    chunk[0] = static_cast<hsize_t>(chunk_rows);
    for (auto& c : chunk) c = std::max<hsize_t>(c, 1);
    H5_CHECK(H5Pset_chunk(dcpl, static_cast<int>(chunk.size()), chunk.data()),
             "HDF5: bad chunk shape for " << file_ << ":" << full);
  }
  if (!options.track_times) H5_CHECK(H5Pset_obj_track_times(dcpl, false), "HDF5: dataset options of " << file_ << ":" << full);
  if (!options.fill) H5_CHECK(H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER), "HDF5: dataset options of " << file_ << ":" << full);
  Id space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), maxdims.data()), H5Sclose);
  H5_CHECK(space.id, "HDF5: bad shape " << shape_str(shape) << " for " << file_ << ":" << full);
  Id lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  H5Pset_create_intermediate_group(lcpl, 1);
  hid_t d = H5Dcreate2(id_, path.c_str(), file_type(dtype), space, lcpl, dcpl, H5P_DEFAULT);
  H5_CHECK(d, "HDF5: cannot create dataset " << file_ << ":" << full);
  return d;
}

Dataset Location::open_dataset(const std::string& path) const {
  std::string full = join(name_, path);
  AERIE_CHECK(exists(path), "HDF5: " << file_ << " has no dataset " << full);
  hid_t d = H5Dopen2(id_, path.c_str(), H5P_DEFAULT);
  H5_CHECK(d, "HDF5: cannot open dataset " << file_ << ":" << full);
  return Dataset(d, file_, full, comm_);
}

Dataset Location::write_dataset(const std::string& path, const Tensor& t, const DatasetOptions& options) {
  Dataset ds = create_dataset(path, t.dtype(), t.shape(), options);
  ds.write(t);
  return ds;
}

Tensor Location::read_dataset(const std::string& path) const { return open_dataset(path).read(); }

// ---------------------------------------------------------------------------------------------------
// File

File& File::operator=(File&& o) noexcept {
  if (this != &o) {
    if (id_ >= 0) H5Fclose(id_);
    id_ = -1;
    if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
    Object::operator=(std::move(o));
  }
  return *this;
}

File::~File() {
  if (id_ >= 0) {
    if (!skip_collective_close()) {
      H5Fclose(id_);
      H5Eclear2(H5E_DEFAULT);
    }
    id_ = -1;  // closed, or left to HDF5's shutdown (Object's destructor must not close it either)
  }
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

namespace {
Id make_fapl(MPI_Comm comm, const std::string& path, MPI_Comm* dup) {
  Id fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  H5_CHECK(fapl.id, "HDF5: file access properties for " << path);
  *dup = MPI_COMM_NULL;
  if (comm != MPI_COMM_NULL) {
    AERIE_CHECK(MPI_Comm_dup(comm, dup) == MPI_SUCCESS, "HDF5: MPI_Comm_dup failed for " << path);
    H5_CHECK(H5Pset_fapl_mpio(fapl, *dup, MPI_INFO_NULL), "HDF5: cannot set MPI-IO access for " << path);
  }
  return Id(std::exchange(fapl.id, -1), H5Pclose);
}
// What to do about a failed open, from HDF5's error stack `msg`: a file cut short (its superblock records
// a longer end of file: a copy that stopped, a full disk) has to be written again; file systems without
// flock (some NFS/Lustre mounts) make HDF5 1.10+ fail to open any file.
std::string lock_hint(const std::string& msg) {
  if (msg.find("truncated file") != std::string::npos)
    return "; the file is shorter than its HDF5 header records (cut short by a copy or a full disk): delete it and "
           "run the job that wrote it again";
  return msg.find("lock") == std::string::npos
             ? std::string()
             : "; if the file system has no file locking, set HDF5_USE_FILE_LOCKING=FALSE";
}
}  // namespace

File File::create(const std::string& path, MPI_Comm comm) {
  init();
  MPI_Comm dup;
  Id fapl = make_fapl(comm, path, &dup);
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
  std::string error;
  if (f < 0) {
    std::string msg = hdf5_message();
    std::ostringstream os;
    os << "HDF5: cannot create " << path << msg << lock_hint(msg);
    error = os.str();
  }
  if (dup != MPI_COMM_NULL) {
    // Collective: where one rank could not create the file, none goes on (a rank that did leaves its handle
    // to HDF5's shutdown: closing it is collective).
    try {
      agree_on_failure(dup, error);
    } catch (...) {
      MPI_Comm_free(&dup);
      throw;
    }
  }
  AERIE_CHECK(f >= 0, error);
  return File(f, path, dup);
}

File File::open(const std::string& path, Access access, MPI_Comm comm) {
  init();
  MPI_Comm dup;
  Id fapl = make_fapl(comm, path, &dup);
  hid_t f = H5Fopen(path.c_str(), access == Access::ReadWrite ? H5F_ACC_RDWR : H5F_ACC_RDONLY, fapl);
  if (f < 0) {
    std::string msg = hdf5_message();
    if (dup != MPI_COMM_NULL) MPI_Comm_free(&dup);
    AERIE_THROW("HDF5: cannot open " << path << " (missing, unreadable or not an HDF5 file)" << msg << lock_hint(msg));
  }
  return File(f, path, dup);
}

void File::flush() {
  collective_op(comm_, [&] {
    AERIE_CHECK(valid(), "HDF5: flush of a closed file " << file_);
    H5_CHECK(H5Fflush(id_, H5F_SCOPE_GLOBAL), "HDF5: cannot flush " << file_);
  });
}

void File::close() {
  collective_op(comm_, [&] { close_file(); });
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void File::close_file() {
  if (id_ >= 0) {
    ssize_t open = H5Fget_obj_count(id_, H5F_OBJ_DATASET | H5F_OBJ_GROUP | H5F_OBJ_DATATYPE | H5F_OBJ_ATTR);
    if (open > 0) {
      std::vector<hid_t> ids(static_cast<size_t>(open));
      H5Fget_obj_ids(id_, H5F_OBJ_DATASET | H5F_OBJ_GROUP | H5F_OBJ_DATATYPE | H5F_OBJ_ATTR, ids.size(), ids.data());
      std::string names;
      for (hid_t i : ids) {
        char buf[256] = {0};
        H5Iget_name(i, buf, sizeof(buf));
        names += std::string(names.empty() ? "" : ", ") + buf;
      }
      AERIE_THROW("HDF5: cannot close " << file_ << ": objects still open: " << names);
    }
    close_handle();
  }
}

// ---------------------------------------------------------------------------------------------------
// Dataset

DType Dataset::dtype() const {
  Id type(H5Dget_type(id_), H5Tclose);
  H5_CHECK(type.id, "HDF5: cannot read the type of " << where());
  H5T_class_t cls = H5Tget_class(type);
  size_t size = H5Tget_size(type);
  if (cls == H5T_FLOAT && size == 4) return DType::F32;
  if (cls == H5T_INTEGER) {
    bool sign = H5Tget_sign(type) == H5T_SGN_2;
    if (sign && size == 4) return DType::I32;
    if (sign && size == 8) return DType::I64;
    if (!sign && size == 1) return DType::U8;
    if (!sign && size == 2 && has_attr("dtype") && string_attr("dtype") == "bfloat16") return DType::BF16;
  }
  if (cls == H5T_ENUM && size == 1) return DType::U8;  // h5py's bool
  AERIE_THROW("HDF5: " << where() << " has an unsupported type (class " << static_cast<int>(cls) << ", "
                       << size << " bytes); aerie reads F32, I32, I64, U8 and bf16-as-uint16");
}

Shape Dataset::shape() const {
  Id space(H5Dget_space(id_), H5Sclose);
  H5_CHECK(space.id, "HDF5: cannot read the shape of " << where());
  int nd = H5Sget_simple_extent_ndims(space);
  H5_CHECK(nd, "HDF5: cannot read the shape of " << where());
  std::vector<hsize_t> dims(static_cast<size_t>(nd));
  H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  return Shape(dims.begin(), dims.end());
}

// Moves rows [row_begin, row_begin + nrows) between the file and memory: writes from t (t != nullptr)
// or reads into `out`. In a parallel file a collective transfer is split into rounds agreed by all ranks,
// and the ranks agree on the outcome of its checks and of each round (collective_op): a rank whose rows are
// wrong, or whose write failed (a full disk), makes every rank throw before the next collective call.
void Dataset::transfer(int64_t row_begin, int64_t nrows, const Tensor* t, void* out, DType mdt,
                       Transfer mode) const {
  const bool writing = t != nullptr;
  const bool collective = comm_ != MPI_COMM_NULL && writing && mode == Transfer::Collective;
  const MPI_Comm agree = collective ? comm_ : MPI_COMM_NULL;
  Shape s;
  collective_op(agree, [&] {
    s = shape();
    if (writing && nrows > 0) {
      AERIE_CHECK(t->device() == Device::CPU,
                  "HDF5: writing a " << device_name(t->device()) << " tensor to " << where());
      AERIE_CHECK(t->ndim() == static_cast<int64_t>(s.size()) &&
                      std::equal(s.begin() + 1, s.end(), t->shape().begin() + 1),
                  "HDF5: writing rows of shape " << shape_str(t->shape()) << " into " << where() << " of shape "
                                                 << shape_str(s));
    }
    AERIE_CHECK(row_begin >= 0 && nrows >= 0 && row_begin + nrows <= s[0],
                "HDF5: rows [" << row_begin << ", " << row_begin + nrows << ") outside " << where() << " of shape "
                               << shape_str(s));
    DType fdt = dtype();
    AERIE_CHECK((mdt == DType::BF16) == (fdt == DType::BF16),
                "HDF5: " << where() << " is " << dtype_name(fdt) << ", memory is " << dtype_name(mdt)
                         << " (bf16 converts only to bf16)");
  });
  int64_t row_elems = 1;
  for (size_t i = 1; i < s.size(); ++i) row_elems *= s[i];
  int64_t row_bytes = std::max<int64_t>(1, row_elems * static_cast<int64_t>(dtype_size(mdt)));
  // An empty dataset has no storage (HDF5 reports an address overflow on any write); every rank sees
  // the same shape, so skipping keeps collective calls matched.
  if (s[0] == 0 || row_elems == 0) return;

  int64_t rows_per_round = std::max<int64_t>(1, kMaxRoundBytes / row_bytes);
  int64_t rounds = (nrows + rows_per_round - 1) / rows_per_round;
  if (collective) {
    MPI_Allreduce(MPI_IN_PLACE, &rounds, 1, MPI_INT64_T, MPI_MAX, comm_);
  }
  Id dxpl(H5Pcreate(H5P_DATASET_XFER), H5Pclose);
  if (collective) H5_CHECK(H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE), "HDF5: collective transfer for " << where());
  Id fspace(H5Dget_space(id_), H5Sclose);
  H5_CHECK(fspace.id, "HDF5: cannot read the space of " << where());
  const char* base = writing ? static_cast<const char*>(t->raw()) : static_cast<const char*>(out);
  for (int64_t r = 0; r < std::max<int64_t>(rounds, 1); ++r) {
    int64_t b = std::min(nrows, r * rows_per_round), e = std::min(nrows, b + rows_per_round);
    int64_t n = e - b;
    if (n == 0 && !collective) continue;
    collective_op(agree, [&] {
      std::vector<hsize_t> start(s.size(), 0), count(s.begin(), s.end());
      start[0] = static_cast<hsize_t>(row_begin + b);
      count[0] = static_cast<hsize_t>(n);
      std::vector<hsize_t> mcount = count;
      if (n == 0) mcount[0] = 1;
      for (auto& c : mcount) c = std::max<hsize_t>(c, 1);
      Id mspace(H5Screate_simple(static_cast<int>(mcount.size()), mcount.data(), nullptr), H5Sclose);
      if (n == 0) {
        H5Sselect_none(fspace);
        H5Sselect_none(mspace);
      } else {
        H5_CHECK(H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr),
                 "HDF5: bad row selection in " << where());
        if (row_elems == 0) H5Sselect_none(mspace);
      }
      static char dummy[8];
      const char* ptr = (n == 0 || row_elems == 0) ? dummy : base + b * row_elems * dtype_size(mdt);
      if (writing) {
        H5_CHECK(H5Dwrite(id_, mem_type(mdt), mspace, fspace, dxpl, ptr),
                 "HDF5: cannot write rows [" << row_begin + b << ", " << row_begin + e << ") of " << where());
        if (collective) injected_write_failure(comm_, where());
      } else {
        H5_CHECK(H5Dread(id_, mem_type(mdt), mspace, fspace, dxpl, const_cast<char*>(ptr)),
                 "HDF5: cannot read rows [" << row_begin + b << ", " << row_begin + e << ") of " << where());
      }
    });
  }
}

void Dataset::write(const Tensor& t) {
  AERIE_CHECK(valid(), "HDF5: write to a closed dataset");
  int rank = 0;
  if (comm_ != MPI_COMM_NULL) MPI_Comm_rank(comm_, &rank);
  // Rank 0's tensor against the shape, agreed on by the ranks of a parallel file before the collective write.
  collective_op(comm_, [&] {
    if (rank == 0)
      AERIE_CHECK(t.shape() == shape(), "HDF5: writing " << shape_str(t.shape()) << " into " << where()
                                                         << " of shape " << shape_str(shape()));
  });
  write_rows(0, rank == 0 ? t : Tensor());
}

void Dataset::write_rows(int64_t row_begin, const Tensor& t, Transfer mode) {
  AERIE_CHECK(valid(), "HDF5: write to a closed dataset");
  // The tensor's device and shape are checked in transfer(), agreed on by the ranks of a collective write.
  if (!t.defined() || (t.numel() == 0 && (t.ndim() == 0 || t.dim(0) == 0))) {
    transfer(0, 0, &t, nullptr, t.defined() ? t.dtype() : dtype(), mode);
    return;
  }
  transfer(row_begin, t.dim(0), &t, nullptr, t.dtype(), mode);
}

Tensor Dataset::read() const {
  Shape s = shape();
  return read_rows(0, s[0]);
}

Tensor Dataset::read_rows(int64_t begin, int64_t end) const {
  Shape s = shape();
  AERIE_CHECK(begin >= 0 && begin <= end && end <= s[0],
              "HDF5: rows [" << begin << ", " << end << ") outside " << where() << " of shape " << shape_str(s));
  s[0] = end - begin;
  Tensor out = Tensor::empty(s, dtype());
  read_rows_into(begin, out);
  return out;
}

void Dataset::read_rows_into(int64_t begin, Tensor& out) const {
  AERIE_CHECK(valid(), "HDF5: read from a closed dataset");
  AERIE_CHECK(out.device() == Device::CPU, "HDF5: reading " << where() << " into a " << device_name(out.device())
                                                            << " tensor");
  Shape s = shape();
  AERIE_CHECK(out.ndim() == static_cast<int64_t>(s.size()) &&
                  std::equal(s.begin() + 1, s.end(), out.shape().begin() + 1),
              "HDF5: reading " << where() << " of shape " << shape_str(s) << " into " << shape_str(out.shape()));
  transfer(begin, out.dim(0), nullptr, out.raw(), out.dtype(), Transfer::Independent);
}

void Dataset::extend(int64_t rows) {
  collective_op(comm_, [&] {
    Shape s = shape();
    std::vector<hsize_t> dims(s.begin(), s.end());
    dims[0] = static_cast<hsize_t>(rows);
    H5_CHECK(H5Dset_extent(id_, dims.data()), "HDF5: cannot resize " << where() << " to " << rows
                                                                      << " rows (created extendable?)");
  });
}

}  // namespace aerie::h5
