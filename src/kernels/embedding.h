// Embedding lookup: out[i] = table[ids[i]].
#pragma once
#include "core/tensor.h"

namespace aerie {

/// ids: [N] I32, table: [V, H] (F32 or BF16) -> out: [N, H] F32. `row_offset` is subtracted from
/// every id first (vocabulary-parallel shards). Throws aerie::Error naming the id when it is out of
/// [0, V).
void embedding_forward(const Tensor& ids, const Tensor& table, Tensor& out, int64_t row_offset = 0);

}  // namespace aerie
