// The Kimi-K2 chat templates (configs/templates/kimi-k2*.ini) beyond the goldens of chat_template_test.cc:
// `aerie prepare` with the tiktoken tokenizer folder end to end, and K2-Thinking's rule of which assistant
// turns keep their reasoning (text from the real Jinja, rendered with transformers' settings).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "data/chat_templates.h"
#include "data/prepare.h"
#include "io/h5.h"
#include "template_testing.h"
#include "test_util.h"

namespace aerie {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

json fixture(const std::string& name) {
  std::ifstream f(std::string(AERIE_SOURCE_DIR) + "/tests/fixtures/chat_templates/" + name + ".json");
  std::stringstream ss;
  ss << f.rdbuf();
  return json::parse(ss.str());
}

}  // namespace

// `aerie prepare --tokenizer .../kimi-k2 --template NAME`: the golden conversations as one JSONL file give the
// golden ids (tiktoken's) and masks in prepared.h5.
TEST(KimiTemplate, PrepareWithTiktokenFolderMatchesGoldens) {
  for (const std::string name : {"kimi-k2", "kimi-k2-thinking"}) {
    SCOPED_TRACE(name);
    const json fx = fixture(name);
    const std::string tokdir = testing::data_dir() + "/" + fx["tokenizer"].get<std::string>();
    if (!fs::exists(tokdir + "/tiktoken.model")) GTEST_SKIP() << "no " << tokdir << "/tiktoken.model";
    const std::string dir = testing::scratch_dir("kimi_prepare_" + name);
    testing::prepare_fixture_cases(fx, tokdir, name, dir);
  }
}

// K2-Thinking keeps reasoning_content only after the last assistant turn without tool calls: here the final
// answer "Hello!" loses "greet", the tool-call turn after it keeps "Need the tool.". Both think blocks are
// trained (the model writes them). Expected text: the real Jinja (chat_template.kimi-k2-thinking.jinja) through
// transformers' _compile_jinja_template, add_generation_prompt=True.
TEST(KimiTemplate, ThinkingKeepsReasoningOnlyAfterTheLastAnswer) {
  const InputRecord r = parse_json_record(
      R"({"messages": [{"role": "user", "content": "Hi"},
          {"role": "assistant", "reasoning_content": "greet", "content": "Hello!"},
          {"role": "user", "content": "Weather in Oslo?"},
          {"role": "assistant", "reasoning_content": "Need the tool.", "content": "", "tool_calls": [{"id": "c1",
           "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
          {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "-3"}]})",
      InputFormat::OpenAI, 1 << 20);
  ASSERT_EQ(r.skip, SkipReason::None) << r.detail;
  ConfigChatTemplate tmpl(ChatTemplateSpec::load(find_chat_template("kimi-k2-thinking")), nullptr);
  const std::string want =
      "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>"
      "<|im_user|>user<|im_middle|>Hi<|im_end|><|im_assistant|>assistant<|im_middle|><think></think>Hello!<|im_end|>"
      "<|im_user|>user<|im_middle|>Weather in Oslo?<|im_end|><|im_assistant|>assistant<|im_middle|>"
      "<think>Need the tool.</think><|tool_calls_section_begin|><|tool_call_begin|>c1<|tool_call_argument_begin|>"
      "{\"city\": \"Oslo\"}<|tool_call_end|><|tool_calls_section_end|><|im_end|>"
      "<|im_system|>get_weather<|im_middle|>## Return of c1\n-3<|im_end|><|im_assistant|>assistant<|im_middle|>";
  const auto pieces = tmpl.render_pieces(r.conversation, /*generation_prompt=*/true);
  EXPECT_EQ(pieces_text(pieces), want);
  auto span_of = [&](const std::string& from, const std::string& to) {
    const size_t b = want.find(from);
    return std::make_pair(b, want.find(to, b) + to.size());
  };
  EXPECT_EQ(trained_spans(pieces), (std::vector<std::pair<size_t, size_t>>{
                                       span_of("<think></think>Hello!", "<|im_end|>"),
                                       span_of("<think>Need the tool.", "<|tool_calls_section_end|><|im_end|>")}));
  // kimi-k2 (Instruct) has no think block and ignores reasoning_content.
  ConfigChatTemplate instruct(ChatTemplateSpec::load(find_chat_template("kimi-k2")), nullptr);
  const std::string text = pieces_text(instruct.render_pieces(r.conversation));
  EXPECT_EQ(text.find("<think>"), std::string::npos);
  EXPECT_NE(text.find("<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
                      "\"{\\\"city\\\": \\\"Oslo\\\"}\"<|tool_call_end|>"),
            std::string::npos)
      << text;  // tojson of a string of arguments: a JSON string
}

}  // namespace aerie
