// Loading a Linear of a Hugging Face checkpoint in the format it is stored in (model/weight_source.h
// load_linear): the checkpoint side of the quantized formats. Internal to model/.
#pragma once
#include <vector>

#include "model/hf_checkpoint.h"
#include "model/quant_config.h"
#include "model/weight_source.h"

namespace aerie {

/// The format the checkpoint holds Linear `base` in: Dense (`base.weight` F32/BF16/F16), BlockFp8
/// (`base.weight` F8_E4M3) or Int4Group (`base.weight_packed`). Throws aerie::Error naming the tensor
/// and file when neither weight exists, both do, a dense weight comes with a weight_scale_inv, or a
/// quantized weight's format is not the one config.json's quantization_config (`quant`) announces.
WeightFormat stored_format(const HfCheckpoint& ck, const QuantConfig& quant, const std::string& base);

/// The one format of the Linear packed from `parts` (stored_format of each). Throws aerie::Error as
/// stored_format, and naming both when two parts are stored in different formats.
WeightFormat stored_format(const HfCheckpoint& ck, const QuantConfig& quant, const std::vector<LinearTensor>& parts);

/// This rank's slices of the quantized `parts` (all of `format`, BlockFp8 or Int4Group) as one Linear
/// on `device` (weights and scales as stored: F8E4M3 + F32, I32 + BF16), as WeightSource::load_linear
/// describes. Throws aerie::Error naming the tensor and file on a missing scale or weight_shape, a
/// shape that does not match its weight, or a column split INT4 cannot take (K/tp not a multiple of 32).
Linear load_quantized_linear(HfCheckpoint& ck, WeightFormat format, const std::vector<LinearTensor>& parts,
                             TpSplit split, int tp_rank, int tp_size, Device device);

}  // namespace aerie
