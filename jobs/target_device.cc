// --device / --dtype of the target (see target_device.h).
#include "jobs/target_device.h"

#include "core/device.h"
#include "core/device_memory.h"
#include "core/error.h"
#include "core/log.h"

namespace aerie::jobs {

void add_target_device_options(po::options_description& desc) {
  desc.add_options()("device", po::value<std::string>()->default_value("auto"),
                     "auto (cuda when a GPU is visible for every rank of the node), cpu or cuda")(
      "dtype", po::value<std::string>()->default_value("auto"),
      "compute dtype of the target: auto (bf16 on cuda, f32 on cpu), f32 or bf16 (model/target.h)")(
      "expert-parallel", po::bool_switch(),
      "MoE targets (DeepSeek-V3, Kimi): split the routed experts over the --tp ranks by expert (each rank "
      "holds 1/tp of them whole) instead of every expert by its intermediate size: the same results up to "
      "the order of fp32 sums, full-width expert GEMMs; tp must divide n_routed_experts (nothing to split "
      "at tp 1 or on a dense target)")(
      "fp8-gemm", po::bool_switch(),
      "run the target's linear layers as W8A8 block-FP8 GEMMs, as vLLM and SGLang serve block-FP8 "
      "checkpoints: activations quantized per token and 128 columns, weights in 128 x 128 blocks (a BF16 "
      "target's weights are quantized at load, halving their memory). CUDA on Hopper (cuBLAS >= 12.9): "
      "1.25x faster extraction of an 8B target on an H200; on the CPU a naive reference (same values, "
      "~10x slower: for tests and small models). The hidden states move by the quantization error "
      "(docs/quantization.md)");
}

void add_tp_overlap_option(po::options_description& desc) {
  desc.add_options()("tp-overlap", po::bool_switch(),
                     "at --tp 2 or more: split each forward of several samples into two micro-batches and run "
                     "one's tensor-parallel all-reduces while the other computes (NCCL on a second stream; MPI's "
                     "MPI_Iallreduce on the CPU): the same hidden states up to the order of fp32 sums; pays where "
                     "the all-reduces are a large share of the forward (PCIe GPUs) and the micro-batches stay "
                     "large enough to keep the GPU busy");
}

TargetDevice resolve_target_device(const po::variables_map& vm, ParallelGroups& groups, const std::string& job) {
  TargetDevice t = resolve_target_device(vm["device"].as<std::string>(), vm["dtype"].as<std::string>(),
                                         vm["expert-parallel"].as<bool>(), groups, job);
  t.options.fp8_gemm = vm["fp8-gemm"].as<bool>();
  t.options.tp_overlap = vm.count("tp-overlap") > 0 && vm["tp-overlap"].as<bool>();
  return t;
}

TargetDevice resolve_target_device(const std::string& device, const std::string& dtype, bool expert_parallel,
                                   ParallelGroups& groups, const std::string& job, int node_ranks) {
  AERIE_CHECK(device == "auto" || device == "cpu" || device == "cuda",
              job << ": --device '" << device << "' is not auto, cpu or cuda");
  AERIE_CHECK(dtype == "auto" || dtype == "f32" || dtype == "bf16",
              job << ": --dtype '" << dtype << "' is not auto, f32 or bf16");
  TargetDevice t;
  bool use_cuda = device == "cuda";
  if (device == "auto" && cuda::available()) {
    if (node_ranks < 0) node_ranks = local_size();  // collective over the world (first call)
    use_cuda = node_ranks <= cuda::device_count();
    if (!use_cuda && groups.map.world_rank == 0)
      AERIE_LOG(info) << job << ": " << node_ranks << " ranks per node but " << cuda::device_count()
                      << " GPU(s): running on the CPU (--device cuda to insist)";
  }
  t.options.device = use_cuda ? Device::CUDA : Device::CPU;
  t.options.dtype = dtype == "bf16" || (dtype == "auto" && use_cuda) ? DType::BF16 : DType::F32;
  t.options.expert_parallel = expert_parallel;
  if (use_cuda) {
    AERIE_CHECK(cuda::available(), job << ": --device cuda: " << cuda::unavailable_reason());
    cuda::select_device(local_rank());  // collective over the world on first use
    t.nccl = std::make_unique<NcclCommunicator>(*groups.tp);
    t.tp = t.nccl.get();
  } else {
    t.tp = groups.tp.get();
  }
  return t;
}

int64_t gpu_total_memory() {
  if (!cuda::available()) return 0;
  const auto mem = cuda::device_memory();
  return mem ? mem->total_bytes : 0;
}

void log_gpu_memory(const std::string& job, int world_rank) {
  if (!cuda::built()) return;
  const auto mem = cuda::device_memory();
  const auto high = mem ? cuda::pool_high_water_bytes() : std::nullopt;
  if (!mem || !high) {
    AERIE_LOG(warning) << job << ": could not query GPU memory";
    return;
  }
  const double gib = 1024.0 * 1024.0 * 1024.0;
  AERIE_LOG(info) << job << ": rank " << world_rank << " GPU " << cuda::current_device() << " peak memory "
                  << static_cast<double>(*high) / gib << " GiB (pool high-water), "
                  << static_cast<double>(mem->total_bytes - mem->free_bytes) / gib << " of "
                  << static_cast<double>(mem->total_bytes) / gib << " GiB in use (cudaMemGetInfo)";
}

}  // namespace aerie::jobs
