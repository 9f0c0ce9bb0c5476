// Embedding lookup: out[i] = table[ids[i]], and its backward (a scatter-add of rows).
#pragma once
#include "core/tensor.h"

namespace aerie {

/// ids: [N] I32, table: [V, H] (F32 or BF16) -> out: [N, H] F32 or BF16 (rows converted to out's dtype;
/// exact for F32 out or a BF16 table). `row_offset` is subtracted from every id first
/// (vocabulary-parallel shards). Throws aerie::Error naming the id when it is out of [0, V). On CUDA
/// the ids are copied to the host for that check (a synchronisation of the current stream).
void embedding_forward(const Tensor& ids, const Tensor& table, Tensor& out, int64_t row_offset = 0);

/// embedding_forward (row_offset 0) for ids the caller built on the host and knows to lie in
/// [0, id_bound): ids [N] I32, table [V, H] (F32 or BF16) -> out [N, H] F32 or BF16. Checks shapes,
/// dtypes, devices and 0 < id_bound <= V, not the ids themselves (on the CPU it checks them too), so
/// that on CUDA it only launches the gather: no host copy of the ids and no synchronisation (a row
/// gather inside a forward, e.g. a token tree's path keys). An id outside [0, id_bound) is the
/// caller's bug: on CUDA it reads outside the table. Throws aerie::Error on a failed check.
void embedding_forward_in_range(const Tensor& ids, const Tensor& table, Tensor& out, int64_t id_bound);

/// The backward of embedding_forward: dtable[ids[i] - row_offset] += dout[i] for every i, in fp32.
/// ids: [N] I32, dout: [N, H] F32 or BF16, dtable: [V, H] F32 (ADDED to, so gradients accumulate).
/// Repeated ids accumulate every row: in order on the CPU, with fp32 atomics on CUDA (so there the
/// summation order, and the last bits, vary between runs). Throws like embedding_forward.
void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable, int64_t row_offset = 0);

}  // namespace aerie
