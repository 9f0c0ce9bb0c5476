// The target model of a job (extract, generate) on the device and in the precision its options ask for:
// --device auto|cpu|cuda and --dtype auto|f32|bf16, one GPU per rank (local_rank()), the tp group's
// collectives over NCCL on CUDA (the MPI communicators still carry the job's own messages).
#pragma once
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "comm/nccl_communicator.h"
#include "jobs/jobs.h"
#include "model/target.h"

namespace aerie::jobs {

/// Adds --device (default "auto") and --dtype (default "auto") to `desc`.
void add_target_device_options(po::options_description& desc);
/// Adds --tp-overlap (TargetModelOptions::tp_overlap) to `desc`: for the jobs whose forwards are packed
/// prefills without KV caches (extract, calibrate); resolve_target_device reads it where it was added.
void add_tp_overlap_option(po::options_description& desc);

/// The resolved options: where and in which precision the target runs, and the communicator its tensor
/// parallel collectives use (groups.tp on the CPU, an NcclCommunicator over it on CUDA).
struct TargetDevice {
  TargetModelOptions options;
  std::unique_ptr<NcclCommunicator> nccl;  // CUDA only
  Communicator* tp = nullptr;              // *nccl or *groups.tp: pass it to TargetModel
};

/// Resolves --device / --dtype of `vm` (added by add_target_device_options). auto: CUDA when the backend
/// has a GPU for every rank of the node (NCCL does not run two ranks on one GPU), else the CPU; dtype auto:
/// bf16 on CUDA, f32 on the CPU. On CUDA selects this rank's GPU (cuda::select_device(local_rank())) and
/// builds the tp group's NcclCommunicator. Collective over the world (local_size(), NCCL setup). `job`
/// names the job in messages. Throws aerie::Error on an unknown value, or --device cuda without a usable
/// GPU.
TargetDevice resolve_target_device(const po::variables_map& vm, ParallelGroups& groups, const std::string& job);
/// The same from the option values. `node_ranks` >= 0: the ranks of the node that run the target (auto
/// picks CUDA when they do not outnumber the GPUs; a streaming job's training ranks may share them), -1:
/// local_size().
TargetDevice resolve_target_device(const std::string& device, const std::string& dtype, bool expert_parallel,
                                   ParallelGroups& groups, const std::string& job, int node_ranks = -1);

/// Total memory in bytes of this rank's current GPU (cudaMemGetInfo), or 0 without the CUDA backend or a
/// usable GPU (aerie plan's default --gpu-memory).
int64_t gpu_total_memory();

/// Logs this rank's GPU memory (the stream-ordered pool's high-water mark, and cudaMemGetInfo's
/// used/total) under `job`; nothing without the CUDA backend.
void log_gpu_memory(const std::string& job, int world_rank);

}  // namespace aerie::jobs
