// OpProfile (see op_profile.h).
#include "model/op_profile.h"

#include <chrono>
#include <cstdlib>
#include <iomanip>
#include <sstream>

#include "core/device.h"
#include "core/error.h"

#ifdef AERIE_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace aerie {

namespace {

const char* const kNames[kOpKinds] = {"gemm", "attention", "norm", "rope", "activation", "other", "all-reduce"};

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

#ifdef AERIE_WITH_CUDA
void cuda_ok(cudaError_t e, const char* what) {
  AERIE_CHECK(e == cudaSuccess, "OpProfile: " << what << ": " << cudaGetErrorString(e));
}
#endif

}  // namespace

bool OpProfile::enabled_by_env() {
  static const bool on = [] {
    const char* v = std::getenv("AERIE_PROFILE");
    return v != nullptr && std::string(v) == "1";
  }();
  return on;
}

OpProfile::~OpProfile() {
#ifdef AERIE_WITH_CUDA
  if (ev0_) cudaEventDestroy(static_cast<cudaEvent_t>(ev0_));
  if (ev1_) cudaEventDestroy(static_cast<cudaEvent_t>(ev1_));
#endif
}

void OpProfile::begin(Device device) {
  if (device == Device::CPU) {
    t0_ = now_s();
    return;
  }
#ifdef AERIE_WITH_CUDA
  if (!ev0_) {
    cudaEvent_t a, b;
    cuda_ok(cudaEventCreate(&a), "cudaEventCreate");
    cuda_ok(cudaEventCreate(&b), "cudaEventCreate");
    ev0_ = a;
    ev1_ = b;
  }
  cuda_ok(cudaEventRecord(static_cast<cudaEvent_t>(ev0_), static_cast<cudaStream_t>(cuda::current_stream())),
          "cudaEventRecord");
#else
  AERIE_THROW("OpProfile: a " << device_name(device) << " op in a build without the CUDA backend");
#endif
}

void OpProfile::end(OpKind kind, Device device) {
  double ms = 0;
  if (device == Device::CPU) {
    ms = (now_s() - t0_) * 1e3;
  } else {
#ifdef AERIE_WITH_CUDA
    auto e1 = static_cast<cudaEvent_t>(ev1_);
    cuda_ok(cudaEventRecord(e1, static_cast<cudaStream_t>(cuda::current_stream())), "cudaEventRecord");
    cuda_ok(cudaEventSynchronize(e1), "cudaEventSynchronize");
    float f = 0;
    cuda_ok(cudaEventElapsedTime(&f, static_cast<cudaEvent_t>(ev0_), e1), "cudaEventElapsedTime");
    ms = f;
#endif
  }
  ms_[static_cast<int>(kind)] += ms;
}

std::string OpProfile::summary() const {
  double total = 0;
  for (double m : ms_) total += m;
  if (!enabled_ || forwards_ == 0) return "";
  std::ostringstream s;
  s << std::fixed << std::setprecision(1) << forwards_ << " forward calls, " << rows_ << " rows:";
  for (int k = 0; k < kOpKinds; ++k)
    s << " " << kNames[k] << " " << ms_[k] << " ms (" << (total > 0 ? 100.0 * ms_[k] / total : 0.0) << "%),";
  s << " total " << total << " ms (" << std::setprecision(3) << total / static_cast<double>(forwards_)
    << " ms per call)";
  return s.str();
}

}  // namespace aerie
