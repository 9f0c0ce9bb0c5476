// The Event codec of a build without protobuf: event files are not supported (io/event_file.h).
#include "core/error.h"
#include "io/tensorboard/event_codec.h"

namespace aerie::tensorboard {

bool codec_available() { return false; }

std::string encode_event(const EventRecord&) { AERIE_THROW(event_files_unsupported_reason()); }

bool decode_event(const std::string&, EventRecord&) { AERIE_THROW(event_files_unsupported_reason()); }

}  // namespace aerie::tensorboard
