// Greedy generation of the converted stories260K against the greedy sample that llama2.c's run.c
// prints (stories260K.md, verified byte for byte with run.c; see ../shared/data/stories260K/SOURCE.txt).
#include <fstream>
#include <sstream>

#include "comm/communicator.h"
#include "model/target.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace aerie {
namespace {

/// The text between the first ``` fence after "temperature 0.0" and its closing fence, without the
/// "$ ./run ..." command line.
std::string greedy_sample_text() {
  std::ifstream in(testing::data_dir() + "/stories260K/stories260K.md");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string md = ss.str();
  size_t at = md.find("temperature 0.0");
  if (at == std::string::npos) return "";
  size_t open = md.find("```\n", at);
  size_t close = md.find("\n```", open + 4);
  if (open == std::string::npos || close == std::string::npos) return "";
  std::string block = md.substr(open + 4, close - (open + 4));
  size_t nl = block.find('\n');
  if (block.rfind("$ ./run", 0) == 0 && nl != std::string::npos) block = block.substr(nl + 1);
  return block;
}

// What is compared, and why it is all of it: run.c's generate() starts from [BOS] (the empty prompt
// adds no dummy-prefix token) and loops `while (pos < steps)` with steps = 256 (its default, the
// model's seq_len is 512): each iteration forwards one token and samples (argmax at -t 0.0, ties to
// the smaller id) the next, breaking before printing if it is BOS (1). So it prints the pieces of up
// to 256 generated tokens (the first one's leading space stripped), then "\n", which is the newline
// before the closing fence (removed by greedy_sample_text). Generating 256 new tokens here and
// decoding them therefore determines the whole block: the comparison is exact, on the full text.
TEST(TargetGenerate, MatchesLlama2cGreedySample) {
  AERIE_REQUIRE_MODEL();
  const std::string expected = greedy_sample_text();
  ASSERT_GT(expected.size(), 500u) << "greedy sample not found in stories260K.md";
  auto world = MpiCommunicator::world();
  auto self = world->split(world->rank(), 0);
  TargetModel model(testing::model_dir(), *self);
  auto tok = Tokenizer::load(testing::model_dir());
  const int32_t bos = 1;
  std::vector<int32_t> ids = greedy_generate(model, {bos}, 256, /*stop_id=*/bos);
  ASSERT_GE(ids.size(), 2u);
  EXPECT_EQ(ids[0], bos);
  std::vector<int32_t> generated(ids.begin() + 1, ids.end());
  if (!generated.empty() && generated.back() == bos) generated.pop_back();  // run.c does not print it
  std::string text = tok->decode(generated);
  EXPECT_EQ(text, expected) << "generated " << generated.size() << " tokens";
  // Sanity on the length: the sample is cut by the 256-step limit, not by a BOS.
  EXPECT_EQ(generated.size(), 256u);
}

// greedy_generate stops right after stop_id, and respects max_new.
TEST(TargetGenerate, StopsAtStopIdAndMaxNew) {
  AERIE_REQUIRE_MODEL();
  auto world = MpiCommunicator::world();
  auto self = world->split(world->rank(), 0);
  TargetModel model(testing::model_dir(), *self);
  std::vector<int32_t> ten = greedy_generate(model, {1}, 10, -1);
  ASSERT_EQ(ten.size(), 11u);
  // Stop at the 5th generated token's id: the output ends at its first occurrence.
  const int32_t stop = ten[5];
  size_t first = 1;
  while (ten[first] != stop) ++first;
  std::vector<int32_t> stopped = greedy_generate(model, {1}, 10, stop);
  ASSERT_EQ(stopped.size(), first + 1);
  EXPECT_EQ(stopped, std::vector<int32_t>(ten.begin(), ten.begin() + first + 1));
  // A longer prompt: the continuation of prompt+greedy prefix equals the greedy continuation.
  std::vector<int32_t> cont = greedy_generate(model, std::vector<int32_t>(ten.begin(), ten.begin() + 4), 7, -1);
  EXPECT_EQ(cont, ten);
}

}  // namespace
}  // namespace aerie
