// Chat templates (configs/templates/*.ini) against the models' real Jinja templates: the goldens of
// tests/fixtures/chat_templates (made by tools/reference/chat_template_golden.py with transformers'
// apply_chat_template) give the rendered text, the byte spans the loss mask covers (assistant output + the
// end-of-turn token closing it) and, for byte-level tokenizers, the ids and the token mask. Mistral's ids
// come from mistral-common's own goldens (../shared/data/tokenizers/mistral/samples).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "data/chat_templates.h"
#include "data/chat_templates_json.h"
#include "data/prepare.h"
#include "data/prepare_template.h"
#include "io/h5.h"
#include "template_testing.h"
#include "test_util.h"

namespace aerie {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string template_file(const std::string& name) {
  return std::string(AERIE_SOURCE_DIR) + "/configs/templates/" + name + ".ini";
}

json fixture(const std::string& name) {
  return json::parse(read_text(std::string(AERIE_SOURCE_DIR) + "/tests/fixtures/chat_templates/" + name + ".json"));
}

Conversation conversation_of(const std::string& record) {
  InputRecord r = parse_json_record(record, InputFormat::OpenAI, 1 << 30);
  EXPECT_EQ(r.skip, SkipReason::None) << r.detail << " in " << record;
  return r.conversation;
}

std::string printable(const std::string& s) {
  std::string out;
  for (char c : s) out += c == '\n' ? std::string("\\n") : std::string(1, c);
  return out;
}

// The tokenizer of a fixture, or nullptr (with the reason) where aerie cannot load it. Loaded once per
// folder: the byte-level tokenizer.json files take seconds each.
const Tokenizer* try_tokenizer(const std::string& dir, std::string* why) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  static std::map<std::string, std::string> errors;
  if (!cache.count(dir) && !errors.count(dir)) {
    try {
      cache[dir] = Tokenizer::load(dir);
    } catch (const Error& e) {
      errors[dir] = e.what();
    }
  }
  if (errors.count(dir)) {
    *why = errors[dir];
    return nullptr;
  }
  return cache[dir].get();
}

const char* kTemplates[] = {"llama3", "llama3.1", "qwen2.5", "qwen3", "qwen3-nothink", "chatml",
                            "deepseek-v3", "mistral-v1", "mistral-v3", "mistral", "smollm2", "kimi-k2",
                            "kimi-k2-thinking"};

// A fixture's tokenizer folder: under the shared data, or "cache:NAME" = $AERIE_CACHE/NAME (default
// ~/.cache/aerie/NAME; SmolLM2 as tools/get_smollm2 converts it).
std::string tokenizer_dir(const std::string& name) {
  if (name.rfind("cache:", 0) != 0) return testing::data_dir() + "/" + name;
  const char* cache = std::getenv("AERIE_CACHE");
  const char* home = std::getenv("HOME");
  const std::string root = cache ? cache : std::string(home ? home : ".") + "/.cache/aerie";
  return root + "/" + name.substr(6);
}

class Golden : public ::testing::TestWithParam<const char*> {};

}  // namespace

// Text and mask spans at the byte level, and the generation prompts: needs no tokenizer.
TEST_P(Golden, TextAndMaskSpansMatchJinja) {
  const std::string name = GetParam();
  const json fx = fixture(name);
  ConfigChatTemplate tmpl(ChatTemplateSpec::load(template_file(name)), nullptr);
  EXPECT_EQ(tmpl.name(), name);
  ASSERT_GE(fx["cases"].size(), 7u);
  int prompts = 0;
  for (const auto& [cname, c] : fx["cases"].items()) {
    SCOPED_TRACE(name + " / " + cname);
    const Conversation conv = conversation_of(c["record"].get<std::string>());
    const std::vector<TemplatePiece> pieces = tmpl.render_pieces(conv);
    EXPECT_EQ(printable(pieces_text(pieces)), printable(c["text"].get<std::string>()));
    std::vector<std::pair<size_t, size_t>> want;
    for (const auto& s : c["spans"]) want.emplace_back(s[0].get<size_t>(), s[1].get<size_t>());
    EXPECT_EQ(trained_spans(pieces), want);
    // The generation prompt of the last assistant turn (what aerie generate feeds the model).
    if (c.contains("prompt_record")) {
      Conversation prompt = conv;  // = prompt_record (which prepare would skip: it has no assistant turn)
      prompt.turns.pop_back();
      EXPECT_EQ(printable(pieces_text(tmpl.render_pieces(prompt, true))), printable(c["prompt_text"].get<std::string>()))
          << "generation prompt";
      ++prompts;
    }
  }
  EXPECT_GE(prompts, 7);
}

// Ids and token mask against transformers, for the byte-level tokenizers (Llama 3, Qwen, DeepSeek-V3; SmolLM2
// when tools/get_smollm2 has converted it), and against tiktoken for Kimi-K2.
TEST_P(Golden, IdsAndMaskMatchTransformers) {
  const std::string name = GetParam();
  const json fx = fixture(name);
  if (fx["tokenizer"].is_null()) GTEST_SKIP() << name << ": ids are checked against mistral-common (MistralCommon)";
  std::string why;
  const std::string dir = tokenizer_dir(fx["tokenizer"].get<std::string>());
  if (!fs::exists(dir + "/tokenizer.json") && !fs::exists(dir + "/tiktoken.model"))  // Kimi: tiktoken.model
    GTEST_SKIP() << "no " << dir << "/tokenizer.json";
  const Tokenizer* tok = try_tokenizer(dir, &why);
  // A converted model in the cache may predate the tokenizer it needs: reported, not failed.
  if (!tok && fx["tokenizer"].get<std::string>().rfind("cache:", 0) == 0) GTEST_SKIP() << why;
  ASSERT_NE(tok, nullptr) << why;
  auto tmpl = make_chat_template(name, *tok);
  for (const auto& [cname, c] : fx["cases"].items()) {
    SCOPED_TRACE(name + " / " + cname);
    const TokenizedSample s = tmpl->apply(conversation_of(c["record"].get<std::string>()), *tok);
    const auto want_ids = c["ids"].get<std::vector<int32_t>>();
    const auto want_mask = c["mask"].get<std::vector<uint8_t>>();
    EXPECT_EQ(s.input_ids, want_ids);
    EXPECT_EQ(s.loss_mask, want_mask);
    EXPECT_GT(s.loss_tokens(), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Templates, Golden, ::testing::ValuesIn(kTemplates),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n)
                             if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

// mistral-common's goldens: the exact ids (and text) of Mistral's own tokenizer library for v1 / v3.
TEST(MistralCommon, IdsMatchSamples) {
  const std::string samples = testing::data_dir() + "/tokenizers/mistral/samples";
  if (!fs::exists(samples)) GTEST_SKIP() << "no " << samples;
  int checked = 0;
  for (const char* v : {"v1", "v3"}) {
    const std::string dir = std::string(AERIE_BINARY_DIR) + "/models/tokenizers/mistral_" + v;
    if (!fs::exists(dir + "/tokenizer.json")) {
      std::cerr << "not converted: " << dir << " (target test_tokenizers)\n";
      continue;
    }
    auto tok = Tokenizer::load(dir);
    auto tmpl = make_chat_template(std::string("mistral-") + v, *tok);
    const ConfigChatTemplate& ct = dynamic_cast<const ConfigChatTemplate&>(*tmpl);
    for (const auto& e : fs::directory_iterator(samples)) {
      const std::string tokens = e.path().string() + "/tokens_" + v + ".json";
      if (!fs::exists(tokens)) continue;
      SCOPED_TRACE(std::string(v) + " / " + e.path().filename().string());
      const auto sample = nlohmann::ordered_json::parse(read_text(e.path().string() + "/sample.json"));
      const Conversation conv = conversation_of(sample.dump());
      const TokenizedSample s = tmpl->apply(conv, *tok);
      EXPECT_EQ(s.input_ids, json::parse(read_text(tokens))["tokens"].get<std::vector<int32_t>>());
      // The text: mistral-common's pieces with "▁" as a space and byte pieces as bytes.
      std::string want = read_text(e.path().string() + "/text_" + v + ".txt");
      size_t p;
      while ((p = want.find("\u2581")) != std::string::npos) want.replace(p, 3, " ");
      while ((p = want.find("<0x0A>")) != std::string::npos) want.replace(p, 6, "\n");
      EXPECT_EQ(pieces_text(ct.render_pieces(conv)), want);
      // Mask: exactly the tokens of the assistant segments (content, tool calls) and the </s> closing them.
      int64_t eos = 0, eos_masked = 0;
      for (size_t i = 0; i < s.input_ids.size(); ++i)
        if (s.input_ids[i] == tok->eos_id()) ++eos, eos_masked += s.loss_mask[i];
      EXPECT_EQ(eos_masked, eos);
      EXPECT_EQ(s.loss_mask.front(), 0);  // BOS
      ++checked;
    }
  }
  if (checked == 0) GTEST_SKIP() << "no converted Mistral tokenizer";
}

// `aerie prepare --template qwen3` end to end: the golden conversations as one JSONL file give the golden ids
// and masks in prepared.h5, sample by sample.
TEST(ChatTemplate, PrepareWithQwen3MatchesGoldens) {
  const json fx = fixture("qwen3");
  const std::string tokdir = testing::data_dir() + "/" + fx["tokenizer"].get<std::string>();
  if (!fs::exists(tokdir + "/tokenizer.json")) GTEST_SKIP() << "no " << tokdir;
  const std::string dir = testing::scratch_dir("chat_template_prepare_qwen3");
  h5::File f = h5::File::open(testing::prepare_fixture_cases(fx, tokdir, "qwen3", dir));
  EXPECT_EQ(f.string_attr("template"), "qwen3");
}

// Qwen3 thinking vs non-thinking: the same text, but the empty think block of the last turn is trained only
// when the model writes it itself (thinking mode).
TEST(ChatTemplate, Qwen3EmptyThinkBlockIsPromptWithoutThinking) {
  const Conversation conv = conversation_of(
      R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]})");
  ConfigChatTemplate think(ChatTemplateSpec::load(template_file("qwen3")), nullptr);
  ConfigChatTemplate nothink(ChatTemplateSpec::load(template_file("qwen3-nothink")), nullptr);
  const auto a = think.render_pieces(conv), b = nothink.render_pieces(conv);
  const std::string text = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHello!<|im_end|>\n";
  EXPECT_EQ(pieces_text(a), text);
  EXPECT_EQ(pieces_text(b), text);
  const size_t think_at = text.find("<think>"), hello_at = text.find("Hello!"), end = text.rfind('\n');
  EXPECT_EQ(trained_spans(a), (std::vector<std::pair<size_t, size_t>>{{think_at, end}}));
  EXPECT_EQ(trained_spans(b), (std::vector<std::pair<size_t, size_t>>{{hello_at, end}}));
  // The generation prompts: the server's prompt for the next turn.
  Conversation prompt = conv;
  prompt.turns.push_back({ChatRole::User, "Bye"});
  EXPECT_TRUE(pieces_text(nothink.render_pieces(prompt, true)).ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_TRUE(pieces_text(think.render_pieces(prompt, true)).ends_with("Bye<|im_end|>\n<|im_start|>assistant\n"));
}

TEST(ChatTemplate, OpenAIRecordWithToolsAndReasoning) {
  const InputRecord r = parse_json_record(
      R"({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"b": 1, "a": [1.5, "é"]}}}],
          "messages": [{"role": "user", "content": "x"},
                       {"role": "assistant", "content": null, "reasoning_content": "think",
                        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"z": 1, "a": null}}},
                                       {"function": {"name": "g", "arguments": "{\"k\":2}"}}]},
                       {"role": "tool", "tool_call_id": "c1", "name": "f", "content": "ok"},
                       {"role": "assistant", "content": "done"}]})",
      InputFormat::Auto, 100);
  ASSERT_EQ(r.skip, SkipReason::None) << r.detail;
  const Conversation& c = r.conversation;
  // Key order kept, Python's separators, non-ASCII as is.
  EXPECT_EQ(c.tools_json, R"([{"type": "function", "function": {"name": "f", "parameters": {"b": 1, "a": [1.5, "é"]}}}])");
  ASSERT_EQ(c.turns.size(), 4u);
  const ChatTurn& a = c.turns[1];
  EXPECT_TRUE(a.content_null);
  EXPECT_TRUE(a.has_reasoning);
  EXPECT_EQ(a.reasoning, "think");
  ASSERT_EQ(a.tool_calls.size(), 2u);
  EXPECT_EQ(a.tool_calls[0].id, "c1");
  EXPECT_EQ(a.tool_calls[0].arguments, R"({"z": 1, "a": null})");
  EXPECT_FALSE(a.tool_calls[0].arguments_is_string);
  EXPECT_EQ(a.tool_calls[1].name, "g");
  EXPECT_EQ(a.tool_calls[1].arguments, R"({"k":2})");
  EXPECT_TRUE(a.tool_calls[1].arguments_is_string);
  EXPECT_EQ(c.turns[2].tool_call_id, "c1");
  EXPECT_EQ(c.turns[2].name, "f");
  // A null content without tool calls is still an error.
  EXPECT_EQ(parse_json_record(R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": null}]})",
                              InputFormat::OpenAI, 100).skip,
            SkipReason::WrongTypes);
}

// LLaMA-Factory's ShareGPT tool format: a function_call turn becomes tool calls in the template's syntax;
// templates without one keep the JSON text as the assistant's content.
TEST(ChatTemplate, ShareGPTFunctionCallBecomesToolCalls) {
  const InputRecord r = parse_json_record(
      R"({"conversations": [{"from": "human", "value": "Weather in Oslo?"},
          {"from": "function_call", "value": "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}"},
          {"from": "observation", "value": "{\"temp\": -3}"}, {"from": "gpt", "value": "It is -3."},
          {"from": "function_call", "value": "not json"}]})",
      InputFormat::Auto, 100);
  ASSERT_EQ(r.skip, SkipReason::None) << r.detail;
  const ChatTurn& call = r.conversation.turns[1];
  ASSERT_EQ(call.tool_calls.size(), 1u);
  EXPECT_EQ(call.tool_calls[0].name, "get_weather");
  EXPECT_EQ(call.tool_calls[0].arguments, R"({"city": "Oslo"})");
  EXPECT_TRUE(call.text_is_tool_calls);
  EXPECT_TRUE(r.conversation.turns[4].tool_calls.empty());  // not JSON: plain assistant text, with a note
  EXPECT_NE(r.note.find("turn 4: a function_call value that is no JSON"), std::string::npos) << r.note;
  const InputRecord ok = parse_json_record(
      R"({"conversations": [{"from": "human", "value": "Hi"}, {"from": "function_call", "value": "{\"name\": \"f\"}"}]})",
      InputFormat::Auto, 100);
  EXPECT_EQ(ok.note, "");
  ConfigChatTemplate qwen(ChatTemplateSpec::load(template_file("qwen2.5")), nullptr);
  const std::string q = pieces_text(qwen.render_pieces(r.conversation));
  EXPECT_NE(q.find("<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call><|im_end|>"),
            std::string::npos) << q;
  ConfigChatTemplate chatml(ChatTemplateSpec::load(template_file("chatml")), nullptr);
  const std::string c = pieces_text(chatml.render_pieces(r.conversation));
  EXPECT_NE(c.find("<|im_start|>assistant\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}<|im_end|>"),
            std::string::npos) << c;
}

// An answer of aerie generate that reached its token limit ("aerie_finish_reason": "length") keeps its end of
// turn in the text but not in the loss: the target never wrote it there.
TEST(ChatTemplate, AnswerAtTheTokenLimitLeavesItsEndOfTurnUntrained) {
  ConfigChatTemplate chatml(ChatTemplateSpec::load(template_file("chatml")), nullptr);
  for (const bool cut : {false, true}) {
    SCOPED_TRACE(cut);
    const InputRecord r = parse_json_record(
        std::string(R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hel",)") +
            R"( "aerie_response_ids": [1, 2])" + (cut ? R"(, "aerie_finish_reason": "length")" : "") + "}]}",
        InputFormat::OpenAI, 100);
    ASSERT_EQ(r.skip, SkipReason::None) << r.detail;
    const auto pieces = chatml.render_pieces(r.conversation);
    int eot_trained = -1;
    for (const auto& p : pieces)
      if (p.special && p.text == "<|im_end|>") eot_trained = p.trained;  // the last one: the answer's
    EXPECT_EQ(eot_trained, cut ? 0 : 1);
  }
}

TEST(ChatTemplate, PythonJsonAndStrip) {
  using oj = nlohmann::ordered_json;
  EXPECT_EQ(chat::python_json(oj::parse(R"({"b": [1, 2.5, 1e-7, 1e16, true, null, "a\"\n\u0001"], "a": {}})")),
            R"({"b": [1, 2.5, 1e-07, 1e+16, true, null, "a\"\n\u0001"], "a": {}})");
  EXPECT_EQ(chat::python_json(oj::parse(R"({"a": [1, {"b": []}]})"), 2), "{\n  \"a\": [\n    1,\n    {\n      \"b\": []\n    }\n  ]\n}");
  EXPECT_EQ(chat::python_json(oj(3.0)), "3.0");
  EXPECT_EQ(chat::python_json(oj(123456.789)), "123456.789");
  EXPECT_EQ(chat::py_strip(" \t\u00a0 text \u3000\n"), "text");
  EXPECT_EQ(chat::py_strip("\u2003"), "");
  EXPECT_EQ(chat::py_strip("é"), "é");
}

// Integers beyond 64 bits (an id in a tool call, say) as Python's json.loads / json.dumps keep them: digits,
// where nlohmann alone reads a double ("1.2345678901234568e+23"). The expected strings are what CPython 3
// prints for json.dumps(json.loads(text)).
TEST(ChatTemplate, IntegersBeyond64BitsAsPythonWritesThem) {
  using oj = nlohmann::ordered_json;
  EXPECT_EQ(chat::python_json(chat::parse_json_exact(
                R"({"id": 123456789012345678901234, "neg": -98765432109876543210, "u": 18446744073709551615,)"
                R"( "f": 1.5e300, "h": -0, "s": "12345678901234567890123"})")),
            R"({"id": 123456789012345678901234, "neg": -98765432109876543210, "u": 18446744073709551615,)"
            R"( "f": 1.5e+300, "h": 0, "s": "12345678901234567890123"})");
  EXPECT_TRUE(chat::parse_json_exact("{\"a\": 1,}").is_discarded());
  std::istringstream in("[1, 98765432109876543210]");
  EXPECT_EQ(chat::python_json(chat::parse_json_exact(in)), "[1, 98765432109876543210]");
  EXPECT_EQ(chat::exact_integer("42"), oj(42));
  EXPECT_EQ(chat::python_json(chat::exact_integer("-123456789012345678901")), "-123456789012345678901");
  EXPECT_NE(testing::error_of([] { chat::exact_integer("4x2"); }).find("'4x2' is no integer"), std::string::npos);
  EXPECT_NE(testing::error_of([] { chat::exact_integer("007"); }).find("leading zero"), std::string::npos);
  // A record written back (generate) keeps them; a string that starts like the marker stays that string.
  const std::string rec =
      R"({"x":"\u0001aerie-exact-integer-0:5","y":"a\"\u0001aerie-exact-integer-1:6","n":[123456789012345678901234,1],"k":"é"})";
  EXPECT_EQ(chat::dump_exact(chat::parse_json_exact(rec)), rec);
  EXPECT_EQ(chat::dump_exact(oj::parse(R"({"a":"é","b":1.5})")), R"({"a":"é","b":1.5})");
  // The templates: arguments given as an object and as a JSON string (`arguments = normalized`), the tools
  // sorted or not, and Mistral's tool result (a number as Python's int() reads it, of any size).
  ConfigChatTemplate qwen(ChatTemplateSpec::load(template_file("qwen2.5")), nullptr);
  const auto text = [](const ConfigChatTemplate& t, const Conversation& c) {
    std::string all;
    for (const auto& p : t.render_pieces(c)) all += p.text;
    return all;
  };
  for (const char* args : {R"({"id": 123456789012345678901234})", R"("{\"id\":123456789012345678901234}")"}) {
    SCOPED_TRACE(args);
    const std::string rendered = text(qwen, conversation_of(
        std::string(R"({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"maximum": 99999999999999999999999}}}],)"
                    R"( "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "",)"
                    R"( "tool_calls": [{"function": {"name": "f", "arguments": )") + args + "}}]}]}"));
    EXPECT_NE(rendered.find(R"("arguments": {"id": 123456789012345678901234}})"), std::string::npos) << rendered;
    EXPECT_NE(rendered.find(R"("maximum": 99999999999999999999999)"), std::string::npos) << rendered;
  }
  ConfigChatTemplate kimi(ChatTemplateSpec::load(template_file("kimi-k2")), nullptr);  // tools.sort_keys
  const std::string sorted = text(kimi, conversation_of(
      R"({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"z": 1, "maximum": 99999999999999999999999}}}],)"
      R"( "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]})"));
  EXPECT_NE(sorted.find(R"({"maximum": 99999999999999999999999, "z": 1})"), std::string::npos) << sorted;
  ChatTemplateSpec spec = ChatTemplateSpec::load(template_file("mistral-v3"));
  spec.tool_content = "mistral";
  const std::string mistral = text(ConfigChatTemplate(spec, nullptr), conversation_of(
      R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "",)"
      R"( "tool_calls": [{"id": "abcdefghi", "function": {"name": "f", "arguments": {}}}]},)"
      R"( {"role": "tool", "tool_call_id": "abcdefghi", "content": "1234567890123456789012"}]})"));
  EXPECT_NE(mistral.find(R"({"content": 1234567890123456789012, "call_id": "abcdefghi"})"), std::string::npos) << mistral;
}

TEST(ChatTemplate, RegistryAndErrors) {
  // Every name the issue asks for exists and loads.
  for (const char* n : kTemplates) EXPECT_NO_THROW(ChatTemplateSpec::load(find_chat_template(n))) << n;
  EXPECT_EQ(find_chat_template(template_file("chatml")), template_file("chatml"));  // a path
  EXPECT_NE(testing::error_of([] { find_chat_template("no-such-template"); }).find("no-such-template"), std::string::npos);
  const std::string dir = testing::scratch_dir("chat_template_errors");
  std::ofstream(dir + "/typo.ini") << "[template]\neot = </s>\n[user]\nprefx = x\n";
  EXPECT_NE(testing::error_of([&] { ChatTemplateSpec::load(dir + "/typo.ini"); }).find("user.prefx"), std::string::npos);
  std::ofstream(dir + "/bad.ini") << "[system]\nmode = sometimes\n";
  EXPECT_NE(testing::error_of([&] { ChatTemplateSpec::load(dir + "/bad.ini"); }).find("system.mode"), std::string::npos);
  std::ofstream(dir + "/quoted.ini") << "eot = \"<e>\"\n[assistant]\nprefix = \"  A:\\t\\u00e9\\n\"\n";
  EXPECT_EQ(ChatTemplateSpec::load(dir + "/quoted.ini").assistant.prefix, "  A:\t\u00e9\n");
  // Llama 3.1 refuses two tool calls in one message, as its Jinja does.
  ConfigChatTemplate l31(ChatTemplateSpec::load(template_file("llama3.1")), nullptr);
  const Conversation two = conversation_of(
      R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "",
          "tool_calls": [{"function": {"name": "a", "arguments": {}}}, {"function": {"name": "b", "arguments": {}}}]}]})");
  EXPECT_NE(testing::error_of([&] { l31.render_pieces(two); }).find("tool calls"), std::string::npos);
  // Mistral v1 has no tool messages (its Jinja raises).
  ConfigChatTemplate m1(ChatTemplateSpec::load(template_file("mistral-v1")), nullptr);
  const Conversation tool = conversation_of(
      R"({"messages": [{"role": "user", "content": "x"}, {"role": "tool", "content": "1"}, {"role": "assistant", "content": "y"}]})");
  EXPECT_NE(testing::error_of([&] { m1.render_pieces(tool); }).find("tool messages"), std::string::npos);
}

// A template's special token missing from the tokenizer is an error naming the file and the token.
TEST(ChatTemplate, MissingSpecialTokenIsAnError) {
  AERIE_REQUIRE_MODEL();
  auto tok = Tokenizer::load(testing::model_dir());
  const std::string err = testing::error_of([&] { make_chat_template("llama3", *tok); });
  EXPECT_NE(err.find("llama3.ini"), std::string::npos) << err;
  EXPECT_NE(err.find("<|start_header_id|>"), std::string::npos) << err;
  EXPECT_NO_THROW(make_chat_template("plain", *tok));
}

}  // namespace aerie

namespace aerie {
namespace {

// Issue 17, point 11, on a byte-level tokenizer and the INI templates: a regenerated assistant turn's own
// ids (here a non-canonical split of its text, as a sampling target may produce) are what the template
// trains on, unchanged, where it renders the text as it is; the canonical encoding otherwise.
TEST(ChatTemplate, RegeneratedResponseIdsKeptByTheIniTemplates) {
  const std::string tokdir = testing::data_dir() + "/tokenizers/qwen3";
  if (!fs::exists(tokdir + "/tokenizer.json")) GTEST_SKIP() << "no " << tokdir;
  std::string why;
  const Tokenizer* tok = try_tokenizer(tokdir, &why);
  ASSERT_NE(tok, nullptr) << why;
  const std::string text = "Hello there, little cat.";
  std::vector<int32_t> own;
  for (const char* piece : {"Hel", "lo", " there", ",", " little", " cat", "."}) {
    std::vector<int32_t> p = tok->encode(piece);
    own.insert(own.end(), p.begin(), p.end());
  }
  ASSERT_EQ(tok->decode(own), text);
  ASSERT_NE(tok->encode(text), own) << "the split is canonical: pick another";
  for (const char* name : {"chatml", "qwen3"}) {
    SCOPED_TRACE(name);
    auto tmpl = make_chat_template(name, *tok);
    Conversation c{};
    ChatTurn u(ChatRole::User, "Say hello.");
    ChatTurn a(ChatRole::Assistant, text);
    a.ids = own;
    c.turns = {u, a};
    const TokenizedSample s = tmpl->apply(c, *tok);
    const std::string flat = [&] {
      std::string r;
      for (int32_t id : s.input_ids) r += std::to_string(id) + ",";
      return r;
    }();
    std::string want;
    for (int32_t id : own) want += std::to_string(id) + ",";
    EXPECT_NE(flat.find(want), std::string::npos) << "the own ids are not in the sample";
    a.ids.clear();
    c.turns = {u, a};
    std::string canon;
    for (int32_t id : tmpl->apply(c, *tok).input_ids) canon += std::to_string(id) + ",";
    EXPECT_EQ(canon.find(want), std::string::npos) << "the canonical encoding holds the non-canonical split";
  }
}

}  // namespace
}  // namespace aerie
