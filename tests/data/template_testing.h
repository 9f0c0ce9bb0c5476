// Shared by the chat-template tests: aerie prepare over the records of a chat-template golden fixture
// (tests/fixtures/chat_templates/*.json, made by tools/reference/chat_template_golden.py).
#pragma once
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/prepare.h"
#include "io/h5.h"

namespace aerie::testing {

/// Writes the "record" of every case of fixture `fx` to <dir>/convs.jsonl, runs prepare on it (one rank,
/// tokenizer `tokdir`, template `name`, max length 4096) into <dir>/prepared.h5, and EXPECTs every case
/// kept and the prepared input_ids / loss_mask to be the cases' "ids" / "mask" in order. Returns the
/// prepared file's path.
inline std::string prepare_fixture_cases(const nlohmann::json& fx, const std::string& tokdir, const std::string& name,
                                         const std::string& dir) {
  std::vector<int32_t> want_ids;
  std::vector<uint8_t> want_mask;
  {
    std::ofstream in(dir + "/convs.jsonl");
    for (const auto& [cname, c] : fx["cases"].items()) {
      in << c["record"].get<std::string>() << "\n";
      for (int32_t id : c["ids"].get<std::vector<int32_t>>()) want_ids.push_back(id);
      for (uint8_t m : c["mask"].get<std::vector<uint8_t>>()) want_mask.push_back(m);
    }
  }
  PrepareOptions o;
  o.input = dir + "/convs.jsonl";
  o.tokenizer = tokdir;
  o.chat_template = name;
  o.output = dir + "/prepared.h5";
  o.max_length = 4096;
  const PrepareStats st = run_prepare(o, MPI_COMM_SELF);
  EXPECT_EQ(st.samples, static_cast<int64_t>(fx["cases"].size()));
  EXPECT_EQ(st.skipped, 0);
  h5::File f = h5::File::open(o.output);
  EXPECT_EQ(f.open_dataset("input_ids").read_vector<int32_t>(), want_ids);
  EXPECT_EQ(f.open_dataset("loss_mask").read_vector<uint8_t>(), want_mask);
  return o.output;
}

}  // namespace aerie::testing
