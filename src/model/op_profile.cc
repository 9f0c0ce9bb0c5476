// OpProfile (see op_profile.h).
#include "model/op_profile.h"
#include "core/settings.h"

#include <chrono>
#include <cstdlib>
#include <iomanip>
#include <sstream>

#include "core/device.h"
#include "core/device_event.h"
#include "core/error.h"

namespace aerie {

namespace {

const char* const kNames[kOpKinds] = {"gemm", "attention", "norm", "rope", "activation", "other", "all-reduce"};

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

bool OpProfile::enabled_by_env() {
  return settings().profile;
}

OpProfile::OpProfile() = default;
OpProfile::~OpProfile() = default;

void OpProfile::begin(Device device) {
  if (device == Device::CPU) {
    t0_ = now_s();
    return;
  }
  AERIE_CHECK(cuda::built(), "OpProfile: a " << device_name(device) << " op in a build without the CUDA backend");
  if (!ev0_) {
    ev0_ = std::make_unique<cuda::Event>(true);
    ev1_ = std::make_unique<cuda::Event>(true);
  }
  ev0_->record(cuda::current_stream());
}

void OpProfile::end(OpKind kind, Device device) {
  double ms = 0;
  if (device == Device::CPU) {
    ms = (now_s() - t0_) * 1e3;
  } else {
    ev1_->record(cuda::current_stream());
    ev1_->synchronize();
    ms = cuda::elapsed_ms(*ev0_, *ev1_);
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
