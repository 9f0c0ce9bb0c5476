// Prompt sets (data/prompt_input.h), the one reader of `aerie generate --input` and `aerie eval --prompts`
// (issue 17, point 12): conversations pass through, plain prompts (MT-Bench turns, prompt / text / question /
// instruction, .txt stories) become conversations of user turns, and PromptFile indexes JSONL lines, JSON
// array elements and stories, on synthetic records and on the real MT-Bench, Spec-Bench, ShareGPT, Alpaca
// and TinyStories files of ../shared/data.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "data/prompt_input.h"
#include "test_util.h"

namespace aerie {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

std::vector<std::pair<ChatRole, std::string>> turns_of(const PromptRecord& r) {
  std::vector<std::pair<ChatRole, std::string>> out;
  for (const ChatTurn& t : r.conversation.turns) out.emplace_back(t.role, t.text);
  return out;
}

void write(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

TEST(PromptRecordTest, MtBenchTurnsAreUserTurnsWithAnswersBetween) {
  const PromptRecord r = parse_prompt_record(
      R"({"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Now shorter."], "reference": ["x"]})",
      InputFormat::Auto);
  ASSERT_EQ(r.skip, SkipReason::None) << r.detail;
  EXPECT_EQ(r.format, InputFormat::OpenAI);
  using P = std::pair<ChatRole, std::string>;
  EXPECT_EQ(turns_of(r), (std::vector<P>{{ChatRole::User, "Write a poem."}, {ChatRole::Assistant, ""},
                                         {ChatRole::User, "Now shorter."}}));
  // The other keys first, in order; the prompt key replaced by messages.
  EXPECT_EQ(ojson::parse(r.json), ojson::parse(R"({"question_id": 81, "category": "writing", "reference": ["x"],
      "messages": [{"role": "user", "content": "Write a poem."}, {"role": "assistant", "content": ""},
                   {"role": "user", "content": "Now shorter."}]})"));
  EXPECT_EQ(ojson::parse(r.json).begin().key(), "question_id");
}

TEST(PromptRecordTest, PromptKeysInOrderSystemAndAlpacaInput) {
  using P = std::pair<ChatRole, std::string>;
  for (const char* key : {"prompt", "text", "question", "instruction"}) {
    const PromptRecord r = parse_prompt_record(std::string(R"({"id": 3, ")") + key + R"(": "Tell a story."})",
                                               InputFormat::Auto);
    ASSERT_EQ(r.skip, SkipReason::None) << key << ": " << r.detail;
    EXPECT_EQ(turns_of(r), (std::vector<P>{{ChatRole::User, "Tell a story."}})) << key;
    EXPECT_EQ(ojson::parse(r.json), ojson::parse(R"({"id": 3, "messages": [{"role": "user", "content": "Tell a story."}]})"));
  }
  // "prompt" before "text"; a key whose value is not a string is passed over (kept in the record).
  PromptRecord r = parse_prompt_record(R"({"text": "second", "prompt": "first"})", InputFormat::Auto);
  EXPECT_EQ(turns_of(r), (std::vector<P>{{ChatRole::User, "first"}}));
  r = parse_prompt_record(R"({"prompt": 7, "question": "Why?"})", InputFormat::Auto);
  EXPECT_EQ(turns_of(r), (std::vector<P>{{ChatRole::User, "Why?"}}));
  EXPECT_EQ(ojson::parse(r.json)["prompt"], 7);
  r = parse_prompt_record(R"({"system": "Be brief.", "instruction": "Sum these.", "input": "1 2", "output": "3"})",
                          InputFormat::Auto);
  EXPECT_EQ(turns_of(r), (std::vector<P>{{ChatRole::System, "Be brief."}, {ChatRole::User, "Sum these.\n\n1 2"}}));
  EXPECT_EQ(ojson::parse(r.json), ojson::parse(R"({"output": "3", "messages": [{"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Sum these.\n\n1 2"}]})"));
}

TEST(PromptRecordTest, ConversationsPassThrough) {
  using P = std::pair<ChatRole, std::string>;
  const std::string sg = R"({"id": "a", "system": "S.", "conversations": [{"from": "human", "value": "Hi."}]})";
  PromptRecord r = parse_prompt_record(sg, InputFormat::Auto);
  ASSERT_EQ(r.skip, SkipReason::None) << r.detail;
  EXPECT_EQ(r.format, InputFormat::ShareGPT);
  EXPECT_EQ(r.json, sg);
  EXPECT_EQ(turns_of(r), (std::vector<P>{{ChatRole::System, "S."}, {ChatRole::User, "Hi."}}));
  const std::string oa = R"({"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}], "text": "t"})";
  r = parse_prompt_record(oa, InputFormat::Auto);
  EXPECT_EQ(r.format, InputFormat::OpenAI);  // a conversation key wins over a prompt key
  EXPECT_EQ(turns_of(r), (std::vector<P>{{ChatRole::User, "Q"}, {ChatRole::Assistant, "A"}}));
  // An explicit conversation format takes only that form.
  EXPECT_EQ(parse_prompt_record(R"({"turns": ["x"]})", InputFormat::ShareGPT).skip, SkipReason::WrongTypes);
  EXPECT_EQ(parse_prompt_record(oa, InputFormat::OpenAI).skip, SkipReason::None);
}

TEST(PromptRecordTest, StoriesAndSkips) {
  using P = std::pair<ChatRole, std::string>;
  PromptRecord r = parse_prompt_record("Once upon a time, a cat sat. It was\nhappy.", InputFormat::Text);
  ASSERT_EQ(r.skip, SkipReason::None) << r.detail;
  EXPECT_EQ(turns_of(r), (std::vector<P>{{ChatRole::User, "Once upon a time, a cat sat."}}));
  EXPECT_EQ(ojson::parse(r.json), ojson::parse(R"({"messages": [{"role": "user", "content": "Once upon a time, a cat sat."}]})"));
  EXPECT_EQ(parse_prompt_record("One sentence only.", InputFormat::Text).skip, SkipReason::NoRest);
  EXPECT_EQ(parse_prompt_record("  ", InputFormat::Auto).skip, SkipReason::Empty);
  EXPECT_EQ(parse_prompt_record("{oops", InputFormat::Auto).skip, SkipReason::BadJson);
  EXPECT_EQ(parse_prompt_record("[1, 2]", InputFormat::Auto).skip, SkipReason::BadJson);
  const PromptRecord none = parse_prompt_record(R"({"id": 1})", InputFormat::Auto);
  EXPECT_EQ(none.skip, SkipReason::WrongTypes);
  EXPECT_NE(none.detail.find("'turns'"), std::string::npos) << none.detail;
  EXPECT_EQ(parse_prompt_record(R"({"turns": []})", InputFormat::Auto).skip, SkipReason::WrongTypes);
  EXPECT_EQ(parse_prompt_record(R"({"turns": ["a", 2]})", InputFormat::Auto).skip, SkipReason::WrongTypes);
  EXPECT_EQ(parse_prompt_record(R"({"system": 1, "prompt": "a"})", InputFormat::Auto).skip, SkipReason::WrongTypes);
  // An empty prompt asks nothing (eval would measure the draft on the template's header alone).
  const PromptRecord empty = parse_prompt_record(R"({"prompt": " \n", "system": "Be brief."})", InputFormat::Auto);
  EXPECT_EQ(empty.skip, SkipReason::Empty);
  EXPECT_EQ(empty.detail, "the prompt ('prompt') is empty");
  EXPECT_EQ(parse_prompt_record(R"({"turns": ["", ""]})", InputFormat::Auto).skip, SkipReason::Empty);
  EXPECT_EQ(parse_prompt_record(R"({"turns": ["", "Go on."]})", InputFormat::Auto).skip, SkipReason::None);
  EXPECT_NE(testing::error_of([] { parse_prompt_record("{}", InputFormat::Tokenized); }).find("tokenized"),
            std::string::npos);
}

TEST(PromptFileTest, JsonlLinesArrayElementsAndStories) {
  const std::string dir = testing::scratch_dir("prompt_file");
  write(dir + "/p.jsonl", "{\"prompt\": \"a\"}\n\n{\"turns\": [\"b\"]}\r\n{\"text\": \"c\"}");
  PromptFile jl(dir + "/p.jsonl", InputFormat::Auto);
  EXPECT_EQ(jl.record_format(), InputFormat::Auto);
  ASSERT_EQ(jl.size(), 4);  // the blank line is a record (dropped as Empty), so record i is line i + 1
  EXPECT_EQ(jl.read(0, 4), (std::vector<std::string>{"{\"prompt\": \"a\"}", "", "{\"turns\": [\"b\"]}", "{\"text\": \"c\"}"}));
  EXPECT_EQ(jl.read(2, 3), (std::vector<std::string>{"{\"turns\": [\"b\"]}"}));
  EXPECT_EQ(jl.where(3), dir + "/p.jsonl:4");
  EXPECT_THROW(jl.read(3, 5), Error);

  write(dir + "/a.json", " [{\"prompt\": \"a\"}, {\"question\": \"b\"}]");
  PromptFile arr(dir + "/a.json", InputFormat::Auto);
  ASSERT_EQ(arr.size(), 2);
  EXPECT_EQ(ojson::parse(arr.read(1, 2)[0]), ojson::parse("{\"question\": \"b\"}"));
  EXPECT_EQ(arr.where(1), dir + "/a.json element 1");
  write(dir + "/bad.json", "[{\"prompt\": \"a\"},");
  EXPECT_NE(testing::error_of([&] { PromptFile f(dir + "/bad.json", InputFormat::Auto); }).find("not one valid JSON array"),
            std::string::npos);
  EXPECT_NE(testing::error_of([&] { PromptFile f(dir + "/missing.jsonl", InputFormat::Auto); }).find("no such file"),
            std::string::npos);
  // A prepared HDF5 file or another binary file given as prompts: named as such, not as line 1's bad JSON.
  write(dir + "/p.h5", std::string("\x89HDF\r\n\x1a\n\0\0\0", 11));
  EXPECT_NE(testing::error_of([&] { PromptFile f(dir + "/p.h5", InputFormat::Auto); }).find("is an HDF5 file"),
            std::string::npos);
  write(dir + "/w.bin", std::string("abc\0\0def", 8));
  EXPECT_NE(testing::error_of([&] { PromptFile f(dir + "/w.bin", InputFormat::Auto); })
                .find("is a binary file (NUL bytes from byte offset 3 on)"),
            std::string::npos);
  // One NUL byte in a line of a text file is that record's damage, not a binary file: the record is
  // skipped naming the column (eval --prompts names its file:line, generate drops it naming file:line).
  write(dir + "/nul.jsonl", std::string("{\"prompt\": \"a\"}\n{\"prompt\": \"b\0c\"}\n{\"prompt\": \"d\"}\n", 50));
  PromptFile nul(dir + "/nul.jsonl", InputFormat::Auto);
  ASSERT_EQ(nul.size(), 3);
  const std::vector<std::string> recs = nul.read(0, 3);
  EXPECT_EQ(parse_prompt_record(recs[0], InputFormat::Auto).skip, SkipReason::None);
  const PromptRecord bad = parse_prompt_record(recs[1], InputFormat::Auto);
  EXPECT_EQ(bad.skip, SkipReason::BadJson);
  EXPECT_EQ(bad.detail, "a NUL byte at column 14: not valid JSON");
  EXPECT_EQ(nul.where(1), dir + "/nul.jsonl:2");
  EXPECT_EQ(parse_prompt_record(recs[2], InputFormat::Auto).skip, SkipReason::None);
  EXPECT_EQ(parse_prompt_record(std::string("One.\0 Two.", 11), InputFormat::Text).detail,
            "a NUL byte at column 5 of the story");

  write(dir + "/s.txt", "\nOne. Two\nthree.\n\n\n  \nFour! Five.\nSix.\n\nSeven only.\n");
  PromptFile st(dir + "/s.txt", InputFormat::Auto);
  EXPECT_EQ(st.record_format(), InputFormat::Text);
  ASSERT_EQ(st.size(), 3);
  EXPECT_EQ(st.read(0, 3), (std::vector<std::string>{"One. Two\nthree.", "Four! Five.\nSix.", "Seven only."}));
  EXPECT_EQ(st.read(1, 2), (std::vector<std::string>{"Four! Five.\nSix."}));
  EXPECT_EQ(st.where(1), dir + "/s.txt:7");
  // --format text reads stories whatever the name.
  fs::copy_file(dir + "/s.txt", dir + "/s.stories");
  EXPECT_EQ(PromptFile(dir + "/s.stories", InputFormat::Text).size(), 3);
}

// The real prompt sets of ../shared/data: every record is read as a conversation with a user turn.
TEST(PromptFileTest, RealPromptSets) {
  struct Case {
    std::string file;
    int64_t records;
    std::string first_user;  // the first user turn of record 0 (its beginning)
    size_t turns0;           // turns of record 0
  };
  const std::vector<Case> cases = {
      {"mt-bench/question.jsonl", 80, "Compose an engaging travel blog post about a recent trip to Hawaii", 3},
      {"spec-bench/question.jsonl", 480, "Compose an engaging travel blog post about a recent trip to Hawaii", 3},
      {"eagle-eval-questions/alpaca/question.jsonl", 80, "What would be the best type of exercise", 1},
      {"sharegpt-v3-prompts/ShareGPT_V3_filtered_500.json", 500, "How to stop automatic updates from the WSUS", 1},
      {"sharegpt-fastchat/dummy_conversation.json", -1, "Who are you?", 0},
      {"llama-factory-demo/alpaca_en_demo.json", -1, "Describe a process of making crepes.", 1},
      {"tinystories/tinystories_val.txt", -1, "", 1},
  };
  int checked = 0;
  for (const Case& c : cases) {
    const std::string path = testing::data_dir() + "/" + c.file;
    if (!fs::exists(path)) continue;
    ++checked;
    PromptFile f(path, InputFormat::Auto);
    if (c.records >= 0) {
      EXPECT_EQ(f.size(), c.records) << c.file;
    }
    const std::vector<std::string> recs = f.read(0, f.size());
    int64_t usable = 0;
    for (int64_t i = 0; i < f.size(); ++i) {
      const PromptRecord r = parse_prompt_record(recs[static_cast<size_t>(i)], f.record_format());
      if (r.skip != SkipReason::None) continue;
      ++usable;
      EXPECT_TRUE(std::any_of(r.conversation.turns.begin(), r.conversation.turns.end(),
                              [](const ChatTurn& t) { return t.role == ChatRole::User; }))
          << f.where(i);
      if (i == 0) {
        EXPECT_EQ(r.conversation.turns.at(0).role, ChatRole::User) << c.file;
        EXPECT_EQ(r.conversation.turns.at(0).text.rfind(c.first_user, 0), 0u) << c.file << ": " << r.conversation.turns[0].text;
        if (c.turns0 > 0) {
          EXPECT_EQ(r.conversation.turns.size(), c.turns0) << c.file;
        }
      }
    }
    EXPECT_GT(usable, f.size() * 9 / 10) << c.file;  // stories: a few single-sentence paragraphs are skipped
  }
  if (checked == 0) GTEST_SKIP() << "no prompt sets in " << testing::data_dir();
}

}  // namespace
}  // namespace aerie
