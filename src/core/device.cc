#include "core/device.h"

#include <atomic>
#include <cstdlib>

#include "core/gpu_limits.h"
#include "core/memory.h"
#include "core/log.h"
#include "core/settings.h"

#include "core/cuda_check.h"

namespace aerie::cuda {

void detail::no_backend(const char* what) {
  AERIE_THROW(what << ": aerie was built without the CUDA backend (configure with -DAERIE_CUDA=ON where nvcc exists)");
}

#ifdef AERIE_WITH_CUDA
namespace {
int g_device = 0;
thread_local cudaStream_t t_stream = nullptr;
thread_local bool t_stream_set = false;

cudaStream_t thread_default_stream() {
  // One non-blocking stream per host thread, created on first use and kept for the thread's life.
  thread_local struct Owned {
    cudaStream_t s = nullptr;
    ~Owned() {
      if (s) cudaStreamDestroy(s);
    }
  } owned;
  if (!owned.s) {
    AERIE_CUDART(cudaSetDevice(g_device), "cudaSetDevice(" << g_device << ")");
    AERIE_CUDART(cudaStreamCreateWithFlags(&owned.s, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  return owned.s;
}
}  // namespace

bool built() { return true; }
int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}
bool available() { return device_count() > 0; }
std::string unavailable_reason() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    // Without a GPU the runtime reports an old driver or no device: say what it means for the user.
    if (e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice)
      return std::string("no NVIDIA GPU or driver found on this machine; use --device cpu or auto (the CUDA "
                         "runtime reports: ") +
             cudaGetErrorString(e) + ")";
    return std::string("no CUDA device: ") + cudaGetErrorString(e);
  }
  return n > 0 ? "" : "no CUDA device visible";
}
void select_device(int local_rank) {
  const int n = device_count();
  AERIE_CHECK(n > 0, "select_device: " << unavailable_reason());
  g_device = local_rank % n;
  AERIE_CUDART(cudaSetDevice(g_device), "cudaSetDevice(" << g_device << ")");
  // Freed blocks stay in the pool (no release threshold): the pool is aerie's caching allocator.
  cudaMemPool_t pool;
  AERIE_CUDART(cudaDeviceGetDefaultMemPool(&pool, g_device), "cudaDeviceGetDefaultMemPool");
  uint64_t threshold = UINT64_MAX;
  AERIE_CUDART(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold),
               "cudaMemPoolSetAttribute");
  // Said once per process (select_device is called again by NCCL's set-up and the jobs' later stages).
  static std::atomic<bool> announced{false};
  if (announced.exchange(true)) return;
  cudaDeviceProp prop{};
  AERIE_CUDART(cudaGetDeviceProperties(&prop, g_device), "cudaGetDeviceProperties");
  const int cores = cpu_cores_allowed();
  AERIE_LOG(info) << "GPU " << g_device << " of " << n << ": " << prop.name << ", compute capability "
                  << prop.major << "." << prop.minor << ", " << (prop.totalGlobalMem >> 30) << " GiB; " << cores
                  << " CPU core" << (cores == 1 ? "" : "s") << " for this rank";
  if (const std::string w = single_core_warning(cores, cpu_cores_online()); !w.empty()) AERIE_LOG(warning) << w;
  if (const GpuLimits l = gpu_limits(); !l.emulated.empty())
    AERIE_LOG(info) << kEmulateEnv << "=" << l.emulated << ": the kernels plan as on " << l.emulated << " ("
                    << l.smem_per_block / 1024 << " KiB of shared memory per block and " << l.smem_per_sm / 1024
                    << " KiB per SM, "
                    << (l.wgmma ? "wgmma" : "no wgmma: the mma.sync kernels") << ")";
}
int current_device() { return g_device; }
std::string current_device_name() {
  cudaDeviceProp prop{};
  AERIE_CUDART(cudaGetDeviceProperties(&prop, g_device), "cudaGetDeviceProperties");
  return prop.name;
}
void set_thread_device(int device) { AERIE_CUDART(cudaSetDevice(device), "cudaSetDevice(" << device << ")"); }

Stream current_stream() { return t_stream_set ? t_stream : thread_default_stream(); }
Stream create_stream() {
  cudaStream_t s = nullptr;
  AERIE_CUDART(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  return s;
}
void destroy_stream(Stream s) {
  if (s) cudaStreamDestroy(static_cast<cudaStream_t>(s));
}
void synchronize(Stream s) {
  AERIE_CUDART(cudaStreamSynchronize(static_cast<cudaStream_t>(s)), "cudaStreamSynchronize");
}
StreamGuard::StreamGuard(Stream s) : prev_(t_stream_set ? t_stream : nullptr) {
  t_stream = static_cast<cudaStream_t>(s);
  t_stream_set = true;
}
StreamGuard::~StreamGuard() {
  t_stream = static_cast<cudaStream_t>(prev_);
  t_stream_set = prev_ != nullptr;
}

void* alloc(size_t bytes, Stream s) {
  void* p = nullptr;
  AERIE_CUDART(cudaMallocAsync(&p, bytes ? bytes : 1, static_cast<cudaStream_t>(s)),
               "out of GPU memory allocating " << bytes << " bytes");
  return p;
}
void free(void* p, Stream s) {
  if (p) cudaFreeAsync(p, static_cast<cudaStream_t>(s));
}
void memcpy(void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  cudaStream_t s = static_cast<cudaStream_t>(current_stream());
  AERIE_CUDART(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s), "cudaMemcpyAsync of " << bytes << " bytes");
  cudaPointerAttributes a{}, b{};
  AERIE_CUDART(cudaPointerGetAttributes(&a, dst), "cudaPointerGetAttributes");
  AERIE_CUDART(cudaPointerGetAttributes(&b, src), "cudaPointerGetAttributes");
  const bool to_device = a.type == cudaMemoryTypeDevice;
  const bool pageable_source = b.type == cudaMemoryTypeUnregistered;
  if (to_device && (b.type == cudaMemoryTypeDevice || pageable_source)) return;  // staged or device-side
  AERIE_CUDART(cudaStreamSynchronize(s), "cudaStreamSynchronize after a host copy");
}
void memset_zero(void* p, size_t bytes) {
  if (!bytes) return;
  AERIE_CUDART(cudaMemsetAsync(p, 0, bytes, static_cast<cudaStream_t>(current_stream())), "cudaMemsetAsync");
}
void check_last_error(const char* what) { AERIE_CUDART(cudaGetLastError(), what); }

GpuLimits gpu_limits() {
  thread_local int dev = -1;
  thread_local GpuLimits real;
  int d = 0;
  AERIE_CUDART(cudaGetDevice(&d), "cudaGetDevice");
  if (d != dev) {
    int smem = 0;
    AERIE_CUDART(cudaDeviceGetAttribute(&real.major, cudaDevAttrComputeCapabilityMajor, d), "compute capability");
    AERIE_CUDART(cudaDeviceGetAttribute(&real.minor, cudaDevAttrComputeCapabilityMinor, d), "compute capability");
    AERIE_CUDART(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, d),
                 "cudaDevAttrMaxSharedMemoryPerBlockOptin");
    real.smem_per_block = smem;
    AERIE_CUDART(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerMultiprocessor, d),
                 "cudaDevAttrMaxSharedMemoryPerMultiprocessor");
    real.smem_per_sm = smem;
    real.wgmma = real.major == 9 && real.minor == 0;
    dev = d;
  }
  const std::string& emulate = settings().cuda_emulate;
  return apply_emulation(real, emulated_gpu_limits(emulate.empty() ? nullptr : emulate.c_str()));
}

#else  // CPU-only build

using detail::no_backend;
bool built() { return false; }
int device_count() { return 0; }
bool available() { return false; }
std::string unavailable_reason() { return "aerie was built without the CUDA backend"; }
void select_device(int) { no_backend("select_device"); }
int current_device() { return 0; }
std::string current_device_name() { no_backend("current_device_name"); }
void set_thread_device(int) { no_backend("set_thread_device"); }
Stream current_stream() { no_backend("current_stream"); }
Stream create_stream() { no_backend("create_stream"); }
void destroy_stream(Stream) {}
void synchronize(Stream) { no_backend("synchronize"); }
StreamGuard::StreamGuard(Stream) : prev_(nullptr) { no_backend("StreamGuard"); }
StreamGuard::~StreamGuard() = default;
void* alloc(size_t, Stream) { no_backend("alloc"); }
void free(void*, Stream) {}
void memcpy(void*, const void*, size_t) { no_backend("memcpy"); }
void memset_zero(void*, size_t) { no_backend("memset_zero"); }
void check_last_error(const char*) {}
GpuLimits gpu_limits() { no_backend("gpu_limits"); }

#endif

}  // namespace aerie::cuda
