// The Event protocol buffer codec behind io/event_file.h: event_codec_protobuf.cc when aerie is built
// with protobuf, event_codec_none.cc otherwise (CMakeLists.txt picks one).
#pragma once
#include <string>

#include "io/event_file.h"

namespace aerie::tensorboard {

/// True when built with protobuf.
bool codec_available();

/// The serialized Event of `e`: file_version when non-empty, else a Summary of e.scalars. Throws
/// aerie::Error when !codec_available().
std::string encode_event(const EventRecord& e);

/// Parses a serialized Event; false when the bytes are not one. Throws aerie::Error when !codec_available().
bool decode_event(const std::string& bytes, EventRecord& out);

}  // namespace aerie::tensorboard
