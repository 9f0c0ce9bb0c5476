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
                      "{\"city\": \"Oslo\"}<|tool_call_end|>"),
            std::string::npos)
      << text;  // a string of arguments is parsed first, as vLLM does (the raw Jinja's tojson: a JSON string)
}

// The conversation's final answer keeps its reasoning (a deliberate difference from the Jinja, which renders
// it with an empty think block: docs/preparing-data.md); earlier answers do not.
TEST(KimiTemplate, ThinkingFinalAnswerKeepsItsReasoning) {
  ConfigChatTemplate tmpl(ChatTemplateSpec::load(find_chat_template("kimi-k2-thinking")), nullptr);
  const InputRecord r = parse_json_record(
      R"({"messages": [{"role": "user", "content": "Hi"},
          {"role": "assistant", "reasoning_content": "greet", "content": "Hello!"},
          {"role": "user", "content": "2+2?"}, {"role": "assistant", "reasoning_content": "add", "content": "4"}]})",
      InputFormat::OpenAI, 1 << 20);
  ASSERT_EQ(r.skip, SkipReason::None) << r.detail;
  const std::string text = pieces_text(tmpl.render_pieces(r.conversation));
  EXPECT_NE(text.find("<|im_middle|><think></think>Hello!<|im_end|>"), std::string::npos) << text;
  EXPECT_NE(text.find("<|im_middle|><think>add</think>4<|im_end|>"), std::string::npos) << text;
  // The reasoning inside the content: the same text, once (the Jinja would put an empty block before it).
  const InputRecord inl = parse_json_record(
      R"({"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "<think>add</think>4"}]})",
      InputFormat::OpenAI, 1 << 20);
  const std::string t2 = pieces_text(tmpl.render_pieces(inl.conversation));
  EXPECT_NE(t2.find("<|im_middle|><think>add</think>4<|im_end|>"), std::string::npos) << t2;
  EXPECT_EQ(t2.find("<think></think>"), std::string::npos) << t2;
}

// A review's edge cases: an inline block with an empty (or another) reasoning_content gives one think block;
// an answer followed by a tool-call turn is history (its empty block); results pair with the calls they name
// first, and a result after a text turn answers no earlier call.
TEST(KimiTemplate, ThinkingEdgeCases) {
  ConfigChatTemplate tmpl(ChatTemplateSpec::load(find_chat_template("kimi-k2-thinking")), nullptr);
  auto render = [&](const std::string& record, InputFormat f = InputFormat::OpenAI) {
    const InputRecord r = parse_json_record(record, f, 1 << 20);
    EXPECT_EQ(r.skip, SkipReason::None) << r.detail;
    return pieces_text(tmpl.render_pieces(r.conversation));
  };
  std::string t = render(R"({"messages": [{"role": "user", "content": "Q"},
      {"role": "assistant", "reasoning_content": "", "content": "<think>RI</think>A0"}]})");
  EXPECT_NE(t.find("<|im_middle|><think>RI</think>A0<|im_end|>"), std::string::npos) << t;
  t = render(R"({"messages": [{"role": "user", "content": "Q"},
      {"role": "assistant", "reasoning_content": "RC", "content": "\n<think>RI</think>A0"}]})");
  EXPECT_NE(t.find("<|im_middle|><think>RC</think>A0<|im_end|>"), std::string::npos) << t;
  t = render(R"({"messages": [{"role": "user", "content": "Q"},
      {"role": "assistant", "reasoning_content": "R0", "content": "A0"},
      {"role": "assistant", "reasoning_content": "RT", "content": "", "tool_calls": [{"id": "c1", "type": "function",
       "function": {"name": "f", "arguments": "{}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "ok"}]})");
  EXPECT_NE(t.find("<|im_middle|><think></think>A0<|im_end|>"), std::string::npos) << t;
  EXPECT_NE(t.find("<think>RT</think><|tool_calls_section_begin|>"), std::string::npos) << t;
  t = render(R"({"messages": [{"role": "user", "content": "Q"},
      {"role": "assistant", "content": "", "tool_calls": [{"id": "call_X", "type": "function",
       "function": {"name": "a", "arguments": "{}"}}, {"type": "function", "function": {"name": "b", "arguments": "{}"}}]},
      {"role": "tool", "content": "for b"}, {"role": "tool", "tool_call_id": "call_X", "content": "for a"}]})");
  EXPECT_NE(t.find("## Return of functions.b:1\nfor b"), std::string::npos) << t;
  EXPECT_NE(t.find("## Return of call_X\nfor a"), std::string::npos) << t;
  t = render(R"({"conversations": [{"from": "human", "value": "Q"},
      {"from": "function_call", "value": "{\"name\": \"a\", \"arguments\": {}}"},
      {"from": "observation", "value": "r1"}, {"from": "gpt", "value": "text"}, {"from": "observation", "value": "r2"}]})",
             InputFormat::Auto);
  EXPECT_NE(t.find("## Return of functions.a:0\nr1"), std::string::npos) << t;
  EXPECT_NE(t.find("## Return of \nr2"), std::string::npos) << t;  // answers no call: as the Jinja, no id
}

// An answer of aerie generate (aerie_response_ids: what the target wrote after the generation prompt) is
// trained as those ids and nothing else: no empty think block in front of the target's own one (the bug:
// <think></think><think>because</think>Answer.), nor in front of an answer the target wrote without one.
TEST(KimiTemplate, ThinkingGeneratedAnswerIsTheTargetsOwnIds) {
  ConfigChatTemplate tmpl(ChatTemplateSpec::load(find_chat_template("kimi-k2-thinking")), nullptr);
  for (const bool with_think : {true, false}) {
    SCOPED_TRACE(with_think);
    const std::string content = with_think ? "<think>because</think>Answer." : "Answer.";
    const std::string ids = with_think ? "[163606, 47221, 163607, 33853, 13]" : "[33853, 13]";
    const InputRecord r = parse_json_record(
        R"({"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": ")" + content +
            R"(", "aerie_response_ids": )" + ids + "}]}",
        InputFormat::OpenAI, 1 << 20);
    ASSERT_EQ(r.skip, SkipReason::None) << r.detail;
    const auto pieces = tmpl.render_pieces(r.conversation);
    EXPECT_NE(pieces_text(pieces).find("<|im_middle|>" + content + "<|im_end|>"), std::string::npos) << pieces_text(pieces);
    int own = 0, think = 0;
    for (const auto& p : pieces) {
      own += p.ids == r.conversation.turns[1].ids && p.trained;
      think += p.text.find("<think>") != std::string::npos;
    }
    EXPECT_EQ(own, 1);
    EXPECT_EQ(think, with_think ? 1 : 0);  // the target's own block only
  }
}

// ShareGPT function_call turns have no call id: K2-Thinking writes functions.NAME:N (N counted over the
// conversation), and the observation after it is headed by that id (it was empty: "## Return of \n").
TEST(KimiTemplate, ShareGPTCallsGetKimiIds) {
  const InputRecord r = parse_json_record(
      R"({"conversations": [{"from": "human", "value": "Weather in Oslo?"},
          {"from": "function_call", "value": "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}"},
          {"from": "observation", "value": "-3"}, {"from": "gpt", "value": "It is -3."},
          {"from": "human", "value": "And Rome?"},
          {"from": "function_call", "value": "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}"},
          {"from": "observation", "value": "12"}, {"from": "gpt", "value": "It is 12."}]})",
      InputFormat::Auto, 100);
  ASSERT_EQ(r.skip, SkipReason::None) << r.detail;
  ConfigChatTemplate thinking(ChatTemplateSpec::load(find_chat_template("kimi-k2-thinking")), nullptr);
  const std::string t = pieces_text(thinking.render_pieces(r.conversation));
  EXPECT_NE(t.find("<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Oslo\"}"),
            std::string::npos) << t;
  EXPECT_NE(t.find("## Return of functions.get_weather:0\n-3<|im_end|>"), std::string::npos) << t;
  EXPECT_NE(t.find("<|tool_call_begin|>functions.get_weather:1<|tool_call_argument_begin|>{\"city\": \"Rome\"}"),
            std::string::npos) << t;
  EXPECT_NE(t.find("## Return of functions.get_weather:1\n12<|im_end|>"), std::string::npos) << t;
  // K2-Instruct writes functions.NAME:INDEX in the call itself; its results now name that id too.
  ConfigChatTemplate instruct(ChatTemplateSpec::load(find_chat_template("kimi-k2")), nullptr);
  const std::string i = pieces_text(instruct.render_pieces(r.conversation));
  EXPECT_NE(i.find("## Return of functions.get_weather:0\\n-3<|im_end|>"), std::string::npos) << i;
  // A call that has an id keeps it, and so does its result.
  const InputRecord oa = parse_json_record(
      R"({"messages": [{"role": "user", "content": "Oslo?"}, {"role": "assistant", "content": "", "tool_calls": [
          {"id": "functions.get_weather:7", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
          {"role": "tool", "tool_call_id": "functions.get_weather:7", "content": "-3"}]})",
      InputFormat::OpenAI, 1 << 20);
  const std::string o = pieces_text(thinking.render_pieces(oa.conversation));
  EXPECT_NE(o.find("<|tool_call_begin|>functions.get_weather:7<|tool_call_argument_begin|>"), std::string::npos) << o;
  EXPECT_NE(o.find("## Return of functions.get_weather:7\n-3"), std::string::npos) << o;
}

}  // namespace aerie
