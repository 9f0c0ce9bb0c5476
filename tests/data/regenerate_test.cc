// Regeneration (data/regenerate.h): the generation prompt of a template, one record (turns kept / replaced /
// appended, keys kept, tool calls kept, drops and truncation), and run_regenerate with the real stories260K
// target decoded in batches (model/sampling.h BatchDecoder): chunks, resume after a partial output, refusal
// of another run's parts, stop requests, the same output for every batch size; under
// mpirun -np 2 (tests/mpi/generate.cmake) two data-parallel groups write what one rank writes.
#include <algorithm>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "comm/communicator.h"
#include "data/prompt_input.h"
#include "data/regenerate.h"
#include "model/target.h"
#include "model/sampling.h"
#include "test_util.h"

namespace aerie {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

// A ChatML-like template (header and end-of-turn as text, generation prompt "<assistant>").
class TestChatml : public ChatTemplate {
 public:
  std::string name() const override { return "test-chatml"; }
  std::vector<TemplateSegment> render(const Conversation& c) const override {
    std::vector<TemplateSegment> out;
    for (const ChatTurn& t : c.turns) {
      const bool a = t.role == ChatRole::Assistant;
      out.push_back({std::string("<") + role_name(t.role) + ">", {}, false});
      out.push_back({t.text, {}, a});
      out.push_back({"</s>", {}, a});
      out.push_back({"\n", {}, false});
    }
    return out;
  }
  std::vector<TemplateSegment> render_prompt(const Conversation& c) const override {
    std::vector<TemplateSegment> out = render(c);
    out.push_back({"<assistant>", {}, false});
    return out;
  }
};

ChatTurn turn(ChatRole role, const std::string& text) {
  ChatTurn t{};
  t.role = role;
  t.text = text;
  return t;
}

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<int32_t> concat(std::initializer_list<std::vector<int32_t>> parts) {
  std::vector<int32_t> out;
  for (auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

class RegenerateRecord : public ::testing::Test {
 protected:
  void SetUp() override {
    AERIE_REQUIRE_MODEL();
    tok = Tokenizer::load(testing::model_dir());
    plain = make_chat_template("plain", *tok);
    params.max_new_tokens = 20;
    params.max_length = 400;
    params.stop_ids = {tok->eos_id()};
  }
  struct Call {
    std::vector<int32_t> prompt;
    int64_t max_new, conversation, turn;
  };
  // A stand-in target: "The cat <conversation> <turn>" then EOS (cut to max_new).
  ResponseGenerator fake() {
    return [this](const std::vector<int32_t>& prompt, int64_t max_new, int64_t conv, int64_t turn) {
      calls.push_back({prompt, max_new, conv, turn});
      std::vector<int32_t> ids = tok->encode("The cat " + std::to_string(conv) + " " + std::to_string(turn));
      ids.push_back(tok->eos_id());
      if (static_cast<int64_t>(ids.size()) > max_new) ids.resize(static_cast<size_t>(max_new));
      return ids;
    };
  }
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<ChatTemplate> plain;
  RegenerateParams params;
  std::vector<Call> calls;
};

TEST_F(RegenerateRecord, GenerationPromptEndsAtTheAssistantHeader) {
  Conversation c{};
  c.turns = {turn(ChatRole::System, "Be kind."), turn(ChatRole::User, "Hi.")};
  EXPECT_EQ(generation_prompt(*plain, c, *tok), concat({{tok->bos_id()}, tok->encode("Be kind."), tok->encode("Hi.")}));
  TestChatml chatml;
  std::vector<int32_t> want;
  for (const char* s : {"<system>", "Be kind.", "</s>", "\n", "<user>", "Hi.", "</s>", "\n", "<assistant>"}) {
    std::vector<int32_t> ids = tok->encode(s);
    want.insert(want.end(), ids.begin(), ids.end());
  }
  EXPECT_EQ(generation_prompt(chatml, c, *tok), want);
}

TEST_F(RegenerateRecord, ShareGPTTurnsReplacedKeysKept) {
  const std::string in =
      R"({"id": "x1", "system": "Be kind.", "conversations": [{"from": "human", "value": "Hi."},)"
      R"( {"from": "gpt", "value": "old one"}, {"from": "human", "value": "More."}, {"from": "gpt", "value": "old two"}],)"
      R"( "extra": [1, 2]})";
  RegeneratedRecord r = regenerate_record(in, InputFormat::Auto, 7, *plain, *tok, params, fake());
  ASSERT_TRUE(r.ok) << r.detail;
  EXPECT_EQ(r.responses, 2);
  ojson j = ojson::parse(r.json);
  ojson want = ojson::parse(in);
  want["conversations"][1]["value"] = "The cat 7 0";
  want["conversations"][3]["value"] = "The cat 7 1";
  // Each answer keeps the target's ids beside its text (issue 17, point 11), the stop token dropped.
  for (int k : {1, 3}) {
    const auto ids = j["conversations"][k]["aerie_response_ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok->decode(ids), want["conversations"][k]["value"].get<std::string>());
    EXPECT_TRUE(std::find(ids.begin(), ids.end(), tok->eos_id()) == ids.end());
    want["conversations"][k]["aerie_response_ids"] = ids;
  }
  EXPECT_EQ(j, want);
  EXPECT_EQ(j.begin().key(), "id");  // key order kept
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].prompt, concat({{tok->bos_id()}, tok->encode("Be kind."), tok->encode("Hi.")}));
  // The second prompt holds the regenerated first answer (and its EOS), not the original one.
  EXPECT_EQ(calls[1].prompt, concat({calls[0].prompt, tok->encode("The cat 7 0"), {tok->eos_id()}, tok->encode("More.")}));
  EXPECT_EQ(calls[1].conversation, 7);
  EXPECT_EQ(calls[1].turn, 1);
  EXPECT_EQ(r.prompt_tokens, static_cast<int64_t>(calls[0].prompt.size() + calls[1].prompt.size()));
}

TEST_F(RegenerateRecord, PromptOnlyGetsAnAnswerAppended) {
  RegeneratedRecord r = regenerate_record(R"({"id": "p", "conversations": [{"from": "human", "value": "Tell a story."}]})",
                                          InputFormat::ShareGPT, 3, *plain, *tok, params, fake());
  ASSERT_TRUE(r.ok) << r.detail;
  ojson pj = ojson::parse(r.json);
  pj["conversations"][1].erase("aerie_response_ids");  // checked in ShareGPTTurnsReplacedKeysKept
  EXPECT_EQ(pj, ojson::parse(R"({"id": "p", "conversations": [{"from": "human", "value": "Tell a story."}, )"
                             R"({"from": "gpt", "value": "The cat 3 0"}]})"));
  RegeneratedRecord o = regenerate_record(R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "Go."}]}]})",
                                          InputFormat::Auto, 4, *plain, *tok, params, fake());
  ASSERT_TRUE(o.ok) << o.detail;
  ojson om = ojson::parse(o.json)["messages"][1];
  EXPECT_TRUE(om.contains("aerie_response_ids"));
  om.erase("aerie_response_ids");
  EXPECT_EQ(om, ojson::parse(R"({"role": "assistant", "content": "The cat 4 0"})"));
}

// Issue 17, point 12: generate takes the plain prompts eval takes (data/prompt_input.h). An MT-Bench line is
// a conversation of its user turns, each answered in turn; a prompt-only line gets one answer; a story of a
// .txt file (format Text) its first sentence answered. The output is the record's other keys + "messages".
TEST_F(RegenerateRecord, MtBenchAndPlainPromptsBecomeConversations) {
  const std::string mt =
      R"({"question_id": 81, "category": "writing", "turns": ["Tell a story.", "Make it shorter."]})";
  RegeneratedRecord r = regenerate_record(mt, InputFormat::Auto, 2, *plain, *tok, params, fake());
  ASSERT_TRUE(r.ok) << skip_name(r.skip) << ": " << r.detail;
  EXPECT_EQ(r.responses, 2);
  ojson j = ojson::parse(r.json);
  for (int k : {1, 3}) {
    ASSERT_TRUE(j["messages"][k].contains("aerie_response_ids"));
    j["messages"][k].erase("aerie_response_ids");
  }
  EXPECT_EQ(j, ojson::parse(R"({"question_id": 81, "category": "writing", "messages": [
      {"role": "user", "content": "Tell a story."}, {"role": "assistant", "content": "The cat 2 0"},
      {"role": "user", "content": "Make it shorter."}, {"role": "assistant", "content": "The cat 2 1"}]})"));
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].prompt, concat({{tok->bos_id()}, tok->encode("Tell a story.")}));
  // The second turn's prompt holds the first answer (and its stop token).
  EXPECT_EQ(calls[1].prompt, concat({calls[0].prompt, tok->encode("The cat 2 0"), {tok->eos_id()},
                                     tok->encode("Make it shorter.")}));

  calls.clear();
  for (const char* key : {"prompt", "text", "question", "instruction"}) {
    const std::string in = std::string(R"({"id": 5, ")") + key + R"(": "Tell a story."})";
    RegeneratedRecord p = regenerate_record(in, InputFormat::Auto, 5, *plain, *tok, params, fake());
    ASSERT_TRUE(p.ok) << key << ": " << skip_name(p.skip) << ": " << p.detail;
    ojson pj = ojson::parse(p.json);
    pj["messages"][1].erase("aerie_response_ids");
    EXPECT_EQ(pj, ojson::parse(R"({"id": 5, "messages": [{"role": "user", "content": "Tell a story."},
        {"role": "assistant", "content": "The cat 5 0"}]})")) << key;
  }
  RegeneratedRecord st = regenerate_record("The sun was hot. Tom ran\nhome.", InputFormat::Text, 1, *plain, *tok, params,
                                           fake());
  ASSERT_TRUE(st.ok) << st.detail;
  ojson sj = ojson::parse(st.json);
  sj["messages"][1].erase("aerie_response_ids");
  EXPECT_EQ(sj, ojson::parse(R"({"messages": [{"role": "user", "content": "The sun was hot."},
      {"role": "assistant", "content": "The cat 1 0"}]})"));
  // An explicit conversation format still takes only conversations.
  EXPECT_EQ(regenerate_record(mt, InputFormat::OpenAI, 0, *plain, *tok, params, fake()).skip, SkipReason::WrongTypes);
}

TEST_F(RegenerateRecord, OpenAIToolCallsKeptReasoningDropped) {
  const std::string in =
      R"({"messages": [{"role": "user", "content": "Weather?"},)"
      R"( {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{}"}}]},)"
      R"( {"role": "tool", "tool_call_id": "c1", "content": "sunny"},)"
      R"( {"role": "assistant", "content": "It is sunny.", "reasoning_content": "the tool said so"}]})";
  RegeneratedRecord r = regenerate_record(in, InputFormat::OpenAI, 0, *plain, *tok, params, fake());
  if (!r.ok) GTEST_SKIP() << "this build's reader rejects tool calls: " << r.detail;
  ojson j = ojson::parse(r.json), want = ojson::parse(in);
  want["messages"][3] = ojson::parse(R"({"role": "assistant", "content": "The cat 0 0"})");
  want["messages"][3]["aerie_response_ids"] = j["messages"][3]["aerie_response_ids"];
  EXPECT_EQ(j, want);
  EXPECT_EQ(r.responses, 1);
}

TEST_F(RegenerateRecord, DropsAndTruncation) {
  auto gen = fake();
  EXPECT_EQ(regenerate_record("", InputFormat::Auto, 0, *plain, *tok, params, gen).skip, SkipReason::Empty);
  EXPECT_EQ(regenerate_record("{oops", InputFormat::Auto, 0, *plain, *tok, params, gen).skip, SkipReason::BadJson);
  EXPECT_EQ(regenerate_record(R"({"id": "a"})", InputFormat::Auto, 0, *plain, *tok, params, gen).skip,
            SkipReason::WrongTypes);
  EXPECT_EQ(regenerate_record(R"({"conversations": [{"from": "alien", "value": "a"}]})", InputFormat::Auto, 0, *plain,
                              *tok, params, gen).skip,
            SkipReason::WrongTypes);
  EXPECT_EQ(regenerate_record(R"({"conversations": [{"from": "system", "value": "a"}]})", InputFormat::Auto, 0, *plain,
                              *tok, params, gen).skip,
            SkipReason::NoAssistant);
  EXPECT_TRUE(calls.empty());
  EXPECT_NE(testing::error_of([&] { regenerate_record("{}", InputFormat::Tokenized, 0, *plain, *tok, params, gen); })
                .find("tokenized"),
            std::string::npos);

  // Room for the first answer only: the record ends after it.
  const std::string two = R"({"conversations": [{"from": "human", "value": "Hi."}, {"from": "gpt", "value": "a"},)"
                          R"( {"from": "human", "value": "Once upon a time there was a big dog."}, {"from": "gpt", "value": "b"}]})";
  const int64_t first = static_cast<int64_t>(concat({{tok->bos_id()}, tok->encode("Hi.")}).size());
  RegenerateParams small = params;
  small.max_length = first + 12;
  RegeneratedRecord r = regenerate_record(two, InputFormat::Auto, 5, *plain, *tok, small, gen);
  ASSERT_TRUE(r.ok);
  EXPECT_TRUE(r.truncated);
  EXPECT_EQ(r.responses, 1);
  EXPECT_EQ(calls.back().max_new, 12);  // min(max_new_tokens, max_length - prompt)
  EXPECT_EQ(ojson::parse(r.json)["conversations"].size(), 2u);
  small.max_length = first;  // no room at all: dropped
  RegeneratedRecord d = regenerate_record(two, InputFormat::Auto, 5, *plain, *tok, small, gen);
  EXPECT_FALSE(d.ok);
  EXPECT_EQ(d.skip, SkipReason::Overlong);
}

// ------------------------------------------------------------------------------------ run_regenerate

// A conversation set for stories260K: prompt-only and multi-turn ShareGPT, OpenAI, and unusable lines.
void write_input(const std::string& path, int n) {
  std::ofstream out(path);
  const char* starts[] = {"Once upon a time, there was a little girl.", "Tom had a red ball.",
                          "The sun was hot.", "Lily saw a big dog.", "Ben and Sue went to the park."};
  for (int i = 0; i < n; ++i) {
    const std::string s = starts[i % 5];
    if (i % 7 == 3) out << "not json\n";
    else if (i % 7 == 5) out << "\n";
    else if (i % 3 == 0)
      out << R"({"id": )" << i << R"(, "conversations": [{"from": "human", "value": ")" << s << R"("}]})" << "\n";
    else if (i % 3 == 1)
      out << R"({"conversations": [{"from": "human", "value": ")" << s
          << R"("}, {"from": "gpt", "value": "x"}, {"from": "human", "value": "Then she was happy."}, {"from": "gpt", "value": "y"}]})"
          << "\n";
    else
      out << R"({"messages": [{"role": "user", "content": ")" << s << R"("}, {"role": "assistant", "content": "z"}]})" << "\n";
  }
}

struct Target {
  std::unique_ptr<MpiCommunicator> self;
  std::unique_ptr<TargetModel> model;
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<ChatTemplate> tmpl;
  SamplingParams sp{0.9, 0.95};
  std::vector<int32_t> stop;
  explicit Target(Communicator& tp) {
    model = std::make_unique<TargetModel>(testing::model_dir(), tp);
    tok = Tokenizer::load(testing::model_dir());
    tmpl = make_chat_template("plain", *tok);
    stop = {tok->bos_id(), tok->eos_id()};
  }
  static SampleRng rng_of(int64_t conv, int64_t turn) {
    return SampleRng(sequence_seed(sequence_seed(9, static_cast<uint64_t>(conv)), static_cast<uint64_t>(turn)));
  }
  // One response at a time (sample_generate): the reference.
  ResponseGenerator gen() {
    return [this](const std::vector<int32_t>& prompt, int64_t max_new, int64_t conv, int64_t turn) {
      SampleRng rng = rng_of(conv, turn);
      return sample_generate(*model, prompt, max_new, stop, sp, rng);
    };
  }
  // Batched decoding as aerie generate does it (a BatchDecoder of `batch` sequences).
  ResponseEngine engine(int64_t batch) {
    auto dec = std::make_shared<BatchDecoder>(*model, batch, stop, sp);
    ResponseEngine e;
    e.batch_size = batch;
    e.submit = [dec](int64_t key, const ResponseRequest& r) {
      dec->submit(key, r.prompt, r.max_new, rng_of(r.conversation, r.turn));
    };
    e.step = [dec] {
      std::vector<ResponseResult> out;
      for (BatchDecoder::Finished& f : dec->step()) out.push_back({f.key, std::move(f.ids)});
      return out;
    };
    return e;
  }
  RegenerateOptions options(const std::string& dir) const {
    RegenerateOptions o;
    o.input = dir + "/in.jsonl";
    o.output = dir + "/out.jsonl";
    o.params.max_new_tokens = 40;
    o.params.max_length = 512;
    o.params.stop_ids = stop;
    o.conversations_per_chunk = 3;
    o.run_signature = R"({"seed": 9})";
    return o;
  }
  // The expected output: every record regenerated in order, usable ones written.
  std::string expected(const RegenerateOptions& o, int n) {
    std::ifstream in(o.input);
    std::string line, text;
    for (int i = 0; i < n && std::getline(in, line); ++i) {
      RegeneratedRecord r = regenerate_record(line, o.format, i, *tmpl, *tok, o.params, gen());
      if (r.ok) text += r.json + "\n";
    }
    return text;
  }
};

TEST(RegenerateRun, ChunksResumeAndRefuseAnotherRun) {
  AERIE_REQUIRE_MODEL();
  ParallelGroups g = ParallelGroups::create(1);
  if (g.map.world_size != 1) GTEST_SKIP() << "single-rank test";
  const std::string dir = testing::scratch_dir("regenerate_run");
  write_input(dir + "/in.jsonl", 11);
  Target t(*g.tp);
  RegenerateOptions o = t.options(dir);
  RegenerateStats s = run_regenerate(o, g, *t.tmpl, *t.tok, t.engine(4));
  EXPECT_TRUE(s.complete);
  EXPECT_EQ(s.records, 11);
  EXPECT_EQ(s.chunks, 4);
  EXPECT_EQ(s.chunks_done, 4);
  EXPECT_EQ(s.dropped, 3);  // records 3 and 10 ("not json") and 5 (blank)
  EXPECT_EQ(s.conversations, 8);
  EXPECT_GT(s.new_tokens, 9);
  const std::string want = t.expected(o, 11);
  const std::string got = read(o.output);
  EXPECT_EQ(got, want);
  std::istringstream lines(got);
  std::string line;
  int n = 0;
  while (std::getline(lines, line)) {
    ojson j = ojson::parse(line);
    ++n;
    if (j.contains("conversations")) {
      EXPECT_EQ(j["conversations"].back()["from"], "gpt");
      EXPECT_NE(j["conversations"].back()["value"], "x");
    }
  }
  EXPECT_EQ(n, 8);

  // A partial output: chunk 2 and the output lost, a stale .tmp left. The rerun redoes chunk 2 only.
  fs::remove(dir + "/out.jsonl.parts/chunk-00002.jsonl");
  fs::remove(o.output);
  std::ofstream(dir + "/out.jsonl.parts/chunk-00002.jsonl.tmp") << "garbage";
  RegenerateStats r = run_regenerate(o, g, *t.tmpl, *t.tok, t.engine(2));
  EXPECT_TRUE(r.complete);
  EXPECT_EQ(r.chunks_skipped, 3);
  EXPECT_EQ(r.chunks_done, 1);
  EXPECT_EQ(read(o.output), want);
  EXPECT_FALSE(fs::exists(dir + "/out.jsonl.parts/chunk-00002.jsonl.tmp"));

  // A stop requested before any chunk: nothing done, no output, the rerun finishes.
  fs::remove(dir + "/out.jsonl.parts/chunk-00001.jsonl");
  fs::remove(o.output);
  RegenerateOptions stopping = o;
  stopping.stop_requested = [] { return true; };
  RegenerateStats st = run_regenerate(stopping, g, *t.tmpl, *t.tok, t.gen());
  EXPECT_TRUE(st.stopped);
  EXPECT_FALSE(st.complete);
  EXPECT_EQ(st.chunks_done, 0);
  EXPECT_FALSE(fs::exists(o.output));
  EXPECT_TRUE(run_regenerate(o, g, *t.tmpl, *t.tok, t.gen()).complete);
  EXPECT_EQ(read(o.output), want);

  // Parts of another run (other sampling) are refused, naming run.json and the setting that differs.
  RegenerateOptions other = o;
  other.run_signature = R"({"seed": 10})";
  const std::string e = testing::error_of([&] { run_regenerate(other, g, *t.tmpl, *t.tok, t.gen()); });
  EXPECT_NE(e.find("run.json records another run"), std::string::npos) << e;
  EXPECT_NE(e.find("--seed 10 (the earlier run: "), std::string::npos) << e;
  // --max-conversations: the first N records.
  RegenerateOptions few = t.options(testing::scratch_dir("regenerate_run_few"));
  fs::copy_file(o.input, few.input);
  few.max_conversations = 4;
  RegenerateStats f = run_regenerate(few, g, *t.tmpl, *t.tok, t.gen());
  EXPECT_EQ(f.records, 4);
  EXPECT_EQ(f.chunks, 2);
  EXPECT_EQ(read(few.output), t.expected(few, 4));
}

TEST(RegenerateRun, JsonArrayInput) {
  AERIE_REQUIRE_MODEL();
  ParallelGroups g = ParallelGroups::create(1);
  if (g.map.world_size != 1) GTEST_SKIP() << "single-rank test";
  const std::string dir = testing::scratch_dir("regenerate_array");
  std::ofstream(dir + "/in.json") << R"([{"id": "a", "conversations": [{"from": "human", "value": "Tom had a red ball."}]},)"
                                  << R"( {"id": "b", "conversations": [{"from": "human", "value": "The sun was hot."}]}])";
  Target t(*g.tp);
  RegenerateOptions o = t.options(dir);
  o.input = dir + "/in.json";
  RegenerateStats s = run_regenerate(o, g, *t.tmpl, *t.tok, t.gen());
  EXPECT_TRUE(s.complete);
  EXPECT_EQ(s.conversations, 2);
  std::istringstream lines(read(o.output));
  std::string line;
  std::vector<std::string> ids;
  while (std::getline(lines, line)) ids.push_back(ojson::parse(line)["id"]);
  EXPECT_EQ(ids, (std::vector<std::string>{"a", "b"}));
}

// Issue 17, point 12: the real prompt sets eval takes, regenerated by run_regenerate: MT-Bench (two user
// turns, two answers each) and TinyStories stories (a .txt file: the first sentence of each answered), in
// the form prepare reads (OpenAI "messages"), equal to the records regenerated one by one.
TEST(RegenerateRun, MtBenchAndStoryPromptSets) {
  AERIE_REQUIRE_MODEL();
  ParallelGroups g = ParallelGroups::create(1);
  if (g.map.world_size != 1) GTEST_SKIP() << "single-rank test";
  const std::string mt = testing::data_dir() + "/mt-bench/question.jsonl";
  const std::string stories = testing::data_dir() + "/tinystories/tinystories_val.txt";
  if (!fs::exists(mt) || !fs::exists(stories)) GTEST_SKIP() << "no MT-Bench / TinyStories in " << testing::data_dir();
  Target t(*g.tp);
  const std::string dir = testing::scratch_dir("regenerate_prompt_sets");
  RegenerateOptions o = t.options(dir);
  o.input = mt;
  o.params.max_new_tokens = 8;
  o.max_conversations = 4;
  RegenerateStats s = run_regenerate(o, g, *t.tmpl, *t.tok, t.gen());
  EXPECT_TRUE(s.complete);
  EXPECT_EQ(s.conversations, 4);
  EXPECT_EQ(s.responses, 8);
  EXPECT_EQ(read(o.output), t.expected(o, 4));
  std::istringstream lines(read(o.output));
  std::string line;
  while (std::getline(lines, line)) {
    const ojson j = ojson::parse(line);
    EXPECT_FALSE(j.contains("turns"));
    ASSERT_EQ(j["messages"].size(), 4u) << line;
    EXPECT_EQ(j["messages"][2]["role"], "user");
    EXPECT_EQ(j["messages"][3]["role"], "assistant");
  }

  o.input = stories;
  o.output = dir + "/stories.jsonl";
  o.max_conversations = 5;
  s = run_regenerate(o, g, *t.tmpl, *t.tok, t.gen());
  EXPECT_TRUE(s.complete);
  const PromptFile f(stories, InputFormat::Auto);
  std::string want;
  int64_t usable = 0;
  for (int64_t i = 0; i < 5; ++i) {
    RegeneratedRecord r = regenerate_record(f.read(i, i + 1)[0], InputFormat::Text, i, *t.tmpl, *t.tok, o.params, t.gen());
    if (r.ok) want += r.json + "\n", ++usable;
  }
  EXPECT_GT(usable, 0);
  EXPECT_EQ(s.conversations, usable);
  EXPECT_EQ(read(o.output), want);
}

// The output does not depend on the batch size nor on which responses share a batch: batch 1 and 4, greedy
// and sampled, equal the responses generated one at a time (sample_generate).
TEST(RegenerateRun, BatchSizeDoesNotChangeTheOutput) {
  AERIE_REQUIRE_MODEL();
  ParallelGroups g = ParallelGroups::create(1);
  if (g.map.world_size != 1) GTEST_SKIP() << "single-rank test";
  Target t(*g.tp);
  for (double temperature : {0.0, 0.9}) {
    t.sp = {temperature, 0.95};
    std::string want;
    for (int64_t batch : {1, 4}) {
      const std::string dir = testing::scratch_dir("regenerate_batch_" + std::to_string(batch));
      write_input(dir + "/in.jsonl", 9);
      RegenerateOptions o = t.options(dir);
      o.conversations_per_chunk = 2;  // the batch spans chunks: 4 sequences of up to 3 chunks at once
      if (want.empty()) want = t.expected(o, 9);
      RegenerateStats s = run_regenerate(o, g, *t.tmpl, *t.tok, t.engine(batch));
      EXPECT_TRUE(s.complete);
      EXPECT_EQ(read(o.output), want) << "batch " << batch << ", temperature " << temperature;
      EXPECT_EQ(s.conversations, 7);
    }
  }
}

// Under mpirun -np 2: two data-parallel groups write the file that one rank computes record by record.
TEST(RegenerateMpi, TwoGroupsEqualOneRank) {
  AERIE_REQUIRE_MODEL();
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size < 2) GTEST_SKIP() << "run under mpirun -np 2 (tests/mpi/generate.cmake)";
  ParallelGroups g = ParallelGroups::create(1);
  const std::string dir = (fs::path(testing::scratch_root()) / "regenerate_mpi").string();
  if (g.map.world_rank == 0) {
    testing::scratch_dir("regenerate_mpi");
    write_input(dir + "/in.jsonl", 13);
  }
  g.world->barrier();
  Target t(*g.tp);
  RegenerateOptions o = t.options(dir);
  o.conversations_per_chunk = 2;
  RegenerateStats s = run_regenerate(o, g, *t.tmpl, *t.tok, t.engine(3));
  EXPECT_TRUE(s.complete);
  EXPECT_EQ(s.chunks_done, 7);
  EXPECT_EQ(s.conversations + s.dropped, 13);
  if (g.map.world_rank == 0) {
    EXPECT_EQ(read(o.output), t.expected(o, 13));
  }
  g.world->barrier();
}

}  // namespace
}  // namespace aerie
