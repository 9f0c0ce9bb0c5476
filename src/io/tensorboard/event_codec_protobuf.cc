// The Event codec with protobuf (tensorboard_event.proto, compiled by protoc at build time).
#include "io/tensorboard/event_codec.h"

#include "tensorboard_event.pb.h"

namespace aerie::tensorboard {

bool codec_available() { return true; }

std::string encode_event(const EventRecord& e) {
  Event ev;
  ev.set_wall_time(e.wall_time);
  ev.set_step(e.step);
  if (!e.file_version.empty()) {
    ev.set_file_version(e.file_version);
  } else {
    Summary* s = ev.mutable_summary();
    for (const auto& [tag, value] : e.scalars) {
      Summary::Value* v = s->add_value();
      v->set_tag(tag);
      v->set_simple_value(value);
    }
  }
  return ev.SerializeAsString();
}

bool decode_event(const std::string& bytes, EventRecord& out) {
  Event ev;
  if (!ev.ParseFromString(bytes)) return false;
  out = EventRecord();
  out.wall_time = ev.wall_time();
  out.step = ev.step();
  if (ev.has_file_version()) out.file_version = ev.file_version();
  if (ev.has_summary())
    for (const Summary::Value& v : ev.summary().value())
      if (v.has_simple_value()) out.scalars.emplace_back(v.tag(), v.simple_value());
  return true;
}

}  // namespace aerie::tensorboard
