// aerie prepare: every input form on tiny inline inputs with the real stories260K tokenizer (tok512), loss
// masks exactly on assistant tokens + the EOS closing each assistant turn, skipped records with counts and
// file:line, truncate vs drop, TinyStories text, and a multi-rank run equal to a 1-rank run
// (PrepareParallelTest, also run with 2 ranks by tests/mpi/data.cmake).
#include <nlohmann/json.hpp>
#include <mpi.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>

#include "core/version.h"
#include "data/prepare.h"
#include "io/h5.h"
#include "test_util.h"

namespace aerie {
namespace {

struct Prepared {
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;
  std::vector<int64_t> offsets;
  int64_t samples() const { return static_cast<int64_t>(offsets.size()) - 1; }
  std::vector<int32_t> sample_ids(int64_t i) const {
    return {ids.begin() + offsets[static_cast<size_t>(i)], ids.begin() + offsets[static_cast<size_t>(i + 1)]};
  }
  std::vector<uint8_t> sample_mask(int64_t i) const {
    return {mask.begin() + offsets[static_cast<size_t>(i)], mask.begin() + offsets[static_cast<size_t>(i + 1)]};
  }
};

Prepared read_prepared(const std::string& path) {
  h5::File f = h5::File::open(path);
  EXPECT_EQ(f.string_attr("format"), "aerie.prepared");
  EXPECT_EQ(f.int_attr("format_version"), 1);
  EXPECT_EQ(f.string_attr("aerie_version"), aerie_version_string());  // issue 13 item 5
  Prepared p;
  p.ids = f.open_dataset("input_ids").read_vector<int32_t>();
  p.mask = f.open_dataset("loss_mask").read_vector<uint8_t>();
  p.offsets = f.open_dataset("sample_offsets").read_vector<int64_t>();
  EXPECT_EQ(f.open_dataset("input_ids").dtype(), DType::I32);
  EXPECT_EQ(f.open_dataset("loss_mask").dtype(), DType::U8);
  EXPECT_EQ(f.open_dataset("sample_offsets").dtype(), DType::I64);
  EXPECT_EQ(f.int_attr("num_samples"), p.samples());
  EXPECT_EQ(f.int_attr("num_tokens"), static_cast<int64_t>(p.ids.size()));
  int64_t loss = 0;
  for (uint8_t m : p.mask) loss += m;
  EXPECT_EQ(f.int_attr("num_loss_tokens"), loss);
  EXPECT_EQ(p.offsets.front(), 0);
  EXPECT_EQ(p.offsets.back(), static_cast<int64_t>(p.ids.size()));
  return p;
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

class PrepareTest : public ::testing::Test {
 protected:
  void SetUp() override {
    AERIE_REQUIRE_MODEL();
    tok_ = Tokenizer::load(testing::model_dir());
    dir_ = testing::scratch_dir(std::string("prepare_") + ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  PrepareStats run(const std::string& input_name, const std::string& content, InputFormat format,
                   int64_t max_length = 2048, Overlong overlong = Overlong::Truncate, int64_t max_samples = -1) {
    PrepareOptions o;
    o.input = dir_ + "/" + input_name;
    write_file(o.input, content);
    o.format = format;
    o.tokenizer = testing::model_dir();
    o.output = dir_ + "/prepared.h5";
    o.max_length = max_length;
    o.overlong = overlong;
    o.max_samples = max_samples;
    return run_prepare(o, MPI_COMM_SELF);
  }
  std::vector<int32_t> enc(const std::string& s) const { return tok_->encode(s); }
  // Appends the tokens of `text` with mask m.
  void add(std::vector<int32_t>& ids, std::vector<uint8_t>& mask, const std::vector<int32_t>& t, uint8_t m) const {
    ids.insert(ids.end(), t.begin(), t.end());
    mask.insert(mask.end(), t.size(), m);
  }
  std::unique_ptr<Tokenizer> tok_;
  std::string dir_;
};

const char* kSys = "You are a storyteller.";
const char* kUser1 = "Tell me about a cat.";
const char* kAsst1 = "Once upon a time, there was a cat named Tom.";
const char* kUser2 = "What did Tom like?";
const char* kAsst2 = "Tom liked milk and naps in the sun.";

// Issue 17, point 11: a regenerated response's "aerie_response_ids" (the target's own ids) are what prepare
// trains on, when they decode to the turn's text; encoding the decoded text alone would not give them back
// (a continuation that starts mid-word gains a "▁" piece). An edited text falls back to encoding it.
TEST_F(PrepareTest, RegeneratedResponseIdsSurviveTheRoundTrip) {
  // A response the target could have produced: a suffix of a sentence's ids whose decoded text, encoded
  // alone, gives other ids.
  const std::vector<int32_t> full = enc("Once upon a time, there was a little girl named Lily.");
  std::vector<int32_t> own;
  for (size_t k = 1; k + 1 < full.size() && own.empty(); ++k) {
    std::vector<int32_t> suffix(full.begin() + static_cast<std::ptrdiff_t>(k), full.end());
    if (enc(tok_->decode(suffix)) != suffix) own = suffix;
  }
  ASSERT_FALSE(own.empty()) << "no suffix of the sentence re-encodes differently: pick another sentence";
  const std::string text = tok_->decode(own);
  nlohmann::json ids_json = own;
  auto record = [&](const std::string& value, bool with_ids) {
    nlohmann::json g = {{"from", "gpt"}, {"value", value}};
    if (with_ids) g["aerie_response_ids"] = ids_json;
    return nlohmann::json{{"conversations", {{{"from", "human"}, {"value", kUser1}}, g}}}.dump();
  };
  auto assistant_ids = [&](const std::string& lines) {
    run("regen.jsonl", lines, InputFormat::ShareGPT);
    Prepared p = read_prepared(dir_ + "/prepared.h5");
    std::vector<int32_t> a;
    for (size_t i = 0; i < p.ids.size(); ++i)
      if (p.mask[i] && p.ids[i] != tok_->eos_id()) a.push_back(p.ids[i]);
    return a;
  };
  EXPECT_EQ(assistant_ids(record(text, true) + "\n"), own);
  EXPECT_EQ(assistant_ids(record(text, false) + "\n"), enc(text));
  EXPECT_NE(enc(text), own);
  EXPECT_EQ(assistant_ids(record(text + " Edited.", true) + "\n"), enc(text + " Edited."));
}

// The plain template by hand: BOS, system, user, assistant + EOS, user, assistant + EOS; mask 1 exactly on
// the assistant tokens and their EOS.
TEST_F(PrepareTest, ShareGptMaskOnlyOnAssistantAndEos) {
  std::string line = std::string(R"({"conversations": [{"from": "system", "value": ")") + kSys +
                     R"("}, {"from": "human", "value": ")" + kUser1 + R"("}, {"from": "gpt", "value": ")" + kAsst1 +
                     R"("}, {"from": "human", "value": ")" + kUser2 + R"("}, {"from": "gpt", "value": ")" + kAsst2 +
                     R"("}]})";
  PrepareStats st = run("chat.jsonl", line + "\n", InputFormat::ShareGPT);
  EXPECT_EQ(st.samples, 1);
  EXPECT_EQ(st.skipped, 0);
  Prepared p = read_prepared(dir_ + "/prepared.h5");
  ASSERT_EQ(p.samples(), 1);
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;
  add(ids, mask, {tok_->bos_id()}, 0);
  add(ids, mask, enc(kSys), 0);
  add(ids, mask, enc(kUser1), 0);
  add(ids, mask, enc(kAsst1), 1);
  add(ids, mask, {tok_->eos_id()}, 1);
  add(ids, mask, enc(kUser2), 0);
  add(ids, mask, enc(kAsst2), 1);
  add(ids, mask, {tok_->eos_id()}, 1);
  EXPECT_EQ(p.ids, ids);
  EXPECT_EQ(p.mask, mask);
  // The masked tokens, decoded, are exactly the assistant texts: no system or user text leaks in.
  std::vector<int32_t> masked;
  for (size_t i = 0; i < p.ids.size(); ++i)
    if (p.mask[i] && p.ids[i] != tok_->eos_id()) masked.push_back(p.ids[i]);
  std::vector<int32_t> want = enc(kAsst1), a2 = enc(kAsst2);
  want.insert(want.end(), a2.begin(), a2.end());
  EXPECT_EQ(masked, want);
  EXPECT_EQ(p.ids.front(), tok_->bos_id());
  EXPECT_EQ(p.ids.back(), tok_->eos_id());
  EXPECT_EQ(p.mask.front(), 0);
  h5::File f = h5::File::open(dir_ + "/prepared.h5");
  EXPECT_EQ(f.string_attr("template"), "plain");
  EXPECT_EQ(f.string_attr("overlong"), "truncate");
  EXPECT_EQ(f.int_attr("max_length"), 2048);
  EXPECT_EQ(f.string_attr("source"), dir_ + "/chat.jsonl");
  EXPECT_EQ(f.string_attr("tokenizer"), testing::model_dir());
}

// The same conversation as OpenAI messages (string and list-of-parts content) and as ShareGPT gives the
// same tokens; auto-detection recognises both; a pre-tokenized line passes through unchanged.
TEST_F(PrepareTest, OpenAiAndTokenizedForms) {
  std::string sharegpt = std::string(R"({"conversations": [{"from": "human", "value": ")") + kUser1 +
                         R"("}, {"from": "gpt", "value": ")" + kAsst1 + R"("}]})";
  std::string openai = std::string(R"({"messages": [{"role": "user", "content": ")") + kUser1 +
                       R"("}, {"role": "assistant", "content": [{"type": "text", "text": "Once upon a time, "}, )" +
                       R"({"type": "text", "text": "there was a cat named Tom."}]}]})";
  run("a.jsonl", sharegpt + "\n", InputFormat::ShareGPT);
  Prepared a = read_prepared(dir_ + "/prepared.h5");
  run("b.jsonl", openai + "\n", InputFormat::OpenAI);
  Prepared b = read_prepared(dir_ + "/prepared.h5");
  EXPECT_EQ(a.ids, b.ids);
  EXPECT_EQ(a.mask, b.mask);
  // Auto: one line of each form plus a tokenized one, in order.
  std::string tokenized = R"({"input_ids": [1, 300, 301, 302, 2], "loss_mask": [0, 0, 1, 1, 1]})";
  PrepareStats st = run("c.jsonl", sharegpt + "\n" + tokenized + "\n" + openai + "\n", InputFormat::Auto);
  EXPECT_EQ(st.samples, 3);
  Prepared c = read_prepared(dir_ + "/prepared.h5");
  ASSERT_EQ(c.samples(), 3);
  EXPECT_EQ(c.sample_ids(0), a.ids);
  EXPECT_EQ(c.sample_ids(1), (std::vector<int32_t>{1, 300, 301, 302, 2}));
  EXPECT_EQ(c.sample_mask(1), (std::vector<uint8_t>{0, 0, 1, 1, 1}));
  EXPECT_EQ(c.sample_ids(2), a.ids);
  EXPECT_EQ(c.sample_mask(2), a.mask);
}

// A file holding one JSON array of records (FastChat's, LLaMA-Factory's .json) reads like the JSONL of
// its elements; skipped elements are reported by index.
TEST_F(PrepareTest, JsonArrayFile) {
  std::string good = R"({"conversations": [{"from": "human", "value": "Hi."}, {"from": "gpt", "value": "Hello there."}]})";
  std::string other = R"({"messages": [{"role": "user", "content": "Who?"}, {"role": "assistant", "content": "Me."}]})";
  std::string none = R"({"conversations": [{"from": "human", "value": "Anyone?"}]})";
  run("a.jsonl", good + "\n" + none + "\n" + other + "\n", InputFormat::Auto);
  Prepared a = read_prepared(dir_ + "/prepared.h5");
  PrepareStats st = run("a.json", "  [\n" + good + ",\n" + none + ",\n" + other + "\n]\n", InputFormat::Auto);
  Prepared b = read_prepared(dir_ + "/prepared.h5");
  EXPECT_EQ(st.samples, 2);
  EXPECT_EQ(st.records, 3);
  ASSERT_EQ(st.examples.size(), 1u);
  EXPECT_EQ(st.examples[0], "a.json[1]: no assistant turn");
  EXPECT_EQ(a.ids, b.ids);
  EXPECT_EQ(a.mask, b.mask);
  EXPECT_EQ(a.offsets, b.offsets);
  EXPECT_THROW(run("broken.json", "[" + good + ",", InputFormat::Auto), Error);
}

// Bad records are skipped with a count per reason and file:line examples; good ones keep input order.
TEST_F(PrepareTest, BadLinesSkippedWithCounts) {
  std::string good = R"({"conversations": [{"from": "human", "value": "Hi."}, {"from": "gpt", "value": "Hello there."}]})";
  std::string lines =
      good + "\n" +                                                                          // 1 ok
      "{not json\n" +                                                                        // 2 bad JSON
      "\n" +                                                                                 // 3 empty
      R"({"conversations": [{"from": "human", "value": "Anyone?"}]})" "\n"                   // 4 no assistant
      R"({"conversations": [{"from": "robot", "value": "x"}, {"from": "gpt", "value": "y"}]})" "\n"  // 5 role
      R"({"conversations": "nope"})" "\n"                                                    // 6 types
      R"({"input_ids": [1, 2, 3], "loss_mask": [0, 1]})" "\n"                                // 7 lengths
      R"({"input_ids": [1, 9999], "loss_mask": [0, 1]})" "\n"                                // 8 id >= V
      R"({"input_ids": [1, 5, 6], "loss_mask": [0, 0, 0]})" "\n"                             // 9 zero loss
      "[1, 2]\n" +                                                                           // 10 not an object
      good + "\n";                                                                           // 11 ok
  PrepareStats st = run("bad.jsonl", lines, InputFormat::Auto);
  EXPECT_EQ(st.records, 11);
  EXPECT_EQ(st.samples, 2);
  EXPECT_EQ(st.skipped, 9);
  auto n = [&](SkipReason r) { return st.skipped_by[static_cast<size_t>(r)]; };
  EXPECT_EQ(n(SkipReason::BadJson), 2);
  EXPECT_EQ(n(SkipReason::Empty), 1);
  EXPECT_EQ(n(SkipReason::NoAssistant), 1);
  EXPECT_EQ(n(SkipReason::WrongTypes), 4);
  EXPECT_EQ(n(SkipReason::ZeroLoss), 1);
  ASSERT_EQ(st.examples.size(), 9u);
  EXPECT_EQ(st.examples[0].rfind("bad.jsonl:2: bad JSON", 0), 0u) << st.examples[0];
  EXPECT_EQ(st.examples[1].rfind("bad.jsonl:3: empty", 0), 0u) << st.examples[1];
  EXPECT_NE(st.examples[3].find("robot"), std::string::npos) << st.examples[3];
  EXPECT_EQ(st.examples[8].rfind("bad.jsonl:10:", 0), 0u) << st.examples[8];
  Prepared p = read_prepared(dir_ + "/prepared.h5");
  EXPECT_EQ(p.samples(), 2);
  EXPECT_EQ(p.sample_ids(0), p.sample_ids(1));
  h5::File f = h5::File::open(dir_ + "/prepared.h5");
  EXPECT_EQ(f.int_attr("num_skipped"), 9);
  // Nothing usable at all is an error, not an empty file.
  EXPECT_THROW(run("none.jsonl", "{not json\n\n", InputFormat::Auto), Error);
}

// truncate keeps the first max_length tokens; drop removes the sample; a sample whose assistant tokens all
// lie beyond max_length is skipped (zero loss tokens).
TEST_F(PrepareTest, TruncateVersusDrop) {
  std::string long_answer = R"({"conversations": [{"from": "human", "value": "Hi."}, {"from": "gpt", "value": ")" +
                            std::string(kAsst1) + " " + kAsst2 + R"("}]})";
  std::string short_one = R"({"conversations": [{"from": "human", "value": "Hi."}, {"from": "gpt", "value": "Yes."}]})";
  std::string long_prompt = R"({"conversations": [{"from": "human", "value": ")" + std::string(kAsst1) + " " + kAsst2 +
                            R"("}, {"from": "gpt", "value": "Ok."}]})";
  std::string input = long_answer + "\n" + short_one + "\n" + long_prompt + "\n";
  run("all.jsonl", input, InputFormat::ShareGPT, 4096);
  Prepared full = read_prepared(dir_ + "/prepared.h5");
  ASSERT_EQ(full.samples(), 3);
  const int64_t L = 12;
  ASSERT_GT(static_cast<int64_t>(full.sample_ids(0).size()), L);
  ASSERT_LE(static_cast<int64_t>(full.sample_ids(1).size()), L);
  ASSERT_GT(static_cast<int64_t>(full.sample_ids(2).size()) - 3, L);  // the prompt alone is longer than L

  PrepareStats st = run("all.jsonl", input, InputFormat::ShareGPT, L, Overlong::Truncate);
  EXPECT_EQ(st.samples, 2);
  EXPECT_EQ(st.truncated, 1);
  EXPECT_EQ(st.skipped_by[static_cast<size_t>(SkipReason::ZeroLoss)], 1);
  Prepared t = read_prepared(dir_ + "/prepared.h5");
  ASSERT_EQ(t.samples(), 2);
  std::vector<int32_t> ids0 = full.sample_ids(0);
  std::vector<uint8_t> mask0 = full.sample_mask(0);
  EXPECT_EQ(t.sample_ids(0), std::vector<int32_t>(ids0.begin(), ids0.begin() + L));
  EXPECT_EQ(t.sample_mask(0), std::vector<uint8_t>(mask0.begin(), mask0.begin() + L));
  EXPECT_EQ(t.sample_ids(1), full.sample_ids(1));
  EXPECT_EQ(h5::File::open(dir_ + "/prepared.h5").string_attr("overlong"), "truncate");

  st = run("all.jsonl", input, InputFormat::ShareGPT, L, Overlong::Drop);
  EXPECT_EQ(st.samples, 1);
  EXPECT_EQ(st.skipped_by[static_cast<size_t>(SkipReason::Overlong)], 2);
  Prepared d = read_prepared(dir_ + "/prepared.h5");
  ASSERT_EQ(d.samples(), 1);
  EXPECT_EQ(d.sample_ids(0), full.sample_ids(1));
  EXPECT_EQ(h5::File::open(dir_ + "/prepared.h5").string_attr("overlong"), "drop");
  // --max-samples keeps the first usable samples.
  st = run("all.jsonl", input, InputFormat::ShareGPT, 4096, Overlong::Truncate, 2);
  EXPECT_EQ(st.samples, 2);
  Prepared m = read_prepared(dir_ + "/prepared.h5");
  EXPECT_EQ(m.sample_ids(1), full.sample_ids(1));
}

// A rerun of prepare (the job) keeps an up-to-date output and refuses to replace another run's without
// --overwrite: prepared_file_outdated names the first setting that differs, as the option, or a newer input.
std::string outdated_why(const PrepareOptions& o) {
  const PreparedFileState st = prepared_file_state(o);
  if (st.kind == PreparedFileState::UpToDate) return "";
  return (st.kind == PreparedFileState::Legacy ? "legacy: " : "") + st.why;
}

TEST_F(PrepareTest, OutdatedNamesTheDifference) {
  const std::string input = R"({"conversations": [{"from": "human", "value": "Hi."}, {"from": "gpt", "value": "Yes."}]})";
  run("a.jsonl", input + "\n", InputFormat::ShareGPT, 64);
  PrepareOptions o;
  o.input = dir_ + "/a.jsonl";
  o.format = InputFormat::ShareGPT;
  o.tokenizer = testing::model_dir();
  o.output = dir_ + "/prepared.h5";
  o.max_length = 64;
  EXPECT_EQ(outdated_why(o), "");
  EXPECT_EQ(nlohmann::json::parse(h5::File::open(o.output).string_attr("settings"))["max_length"], 64);
  PrepareOptions other = o;
  other.max_length = 128;
  EXPECT_EQ(outdated_why(other), "--max-length 128 (the file: 64)");
  other = o;
  other.max_samples = 5;
  EXPECT_EQ(outdated_why(other), "--max-samples 5 (the file: -1)");
  other = o;
  other.chat_template = "chatml";
  EXPECT_EQ(outdated_why(other), "--template \"chatml\" (the file: \"plain\")");
  other = o;
  other.overlong = Overlong::Drop;
  EXPECT_EQ(outdated_why(other), "--overlong \"drop\" (the file: \"truncate\")");
  // The same path relative to another spelling is the same input.
  other = o;
  other.input = dir_ + "/./a.jsonl";
  EXPECT_EQ(outdated_why(other), "");
  // A tokenizer that gives other ids than the one recorded (replaced by an older file: the times say nothing).
  {
    h5::File f = h5::File::open(o.output, h5::Access::ReadWrite);
    const std::string probe = f.string_attr("tokenizer_probe");
    f.set_string_attr("tokenizer_probe", "0123456789abcdef");
    f.close();
    EXPECT_NE(outdated_why(o).find("gives other ids than the tokenizer it was prepared with (tokenizer_probe " + probe +
                                   ", the file: 0123456789abcdef)"),
              std::string::npos)
        << outdated_why(o);
    h5::File g = h5::File::open(o.output, h5::Access::ReadWrite);
    g.set_string_attr("tokenizer_probe", probe);
  }
  EXPECT_EQ(outdated_why(o), "");
  // A newer copy of the same input (the README's block pasted twice) is the same input; an edit of the same
  // size is not.
  std::filesystem::last_write_time(o.input, std::filesystem::last_write_time(o.output) + std::chrono::seconds(5));
  EXPECT_EQ(outdated_why(o), "");
  const auto before = std::filesystem::last_write_time(o.input);
  std::string edited = input + "\n";
  edited.replace(edited.find("Yes."), 4, "No!!");
  write_file(o.input, edited);
  std::filesystem::last_write_time(o.input, before);
  EXPECT_EQ(outdated_why(o).rfind("--input's contents (sha256) \"", 0), 0u) << outdated_why(o);
  // A prepared file of an older aerie has no settings attribute; another file is not a prepared file.
  {
    h5::File f = h5::File::create(dir_ + "/old.h5");
    f.set_string_attr("format", "aerie.prepared");
  }
  other = o;
  other.output = dir_ + "/old.h5";
  EXPECT_EQ(outdated_why(other), "the file " + o.input + " is newer than it");  // an older aerie's file, too
  std::filesystem::last_write_time(other.output, std::filesystem::last_write_time(o.input) + std::chrono::seconds(5));
  EXPECT_EQ(outdated_why(other), "legacy: written by an older aerie, which recorded no settings; those it recorded match");
  {
    h5::File f = h5::File::open(dir_ + "/old.h5", h5::Access::ReadWrite);
    f.set_int_attr("max_length", 2048);
    f.set_string_attr("template", "plain");
  }
  EXPECT_EQ(outdated_why(other), "--max-length 64 (the file, written by an older aerie: 2048)");
  {
    h5::File f = h5::File::create(dir_ + "/other.h5");
    f.set_string_attr("format", "aerie.hidden_states");
  }
  other.output = dir_ + "/other.h5";
  EXPECT_THROW(outdated_why(other), Error);
}

TEST(PrepareStoryTest, FirstSentenceIsThePrompt) {
  InputRecord r = parse_story("Tom had a ball. He liked it! \"Wow!\" said Sue.\nThe end.");
  ASSERT_EQ(r.skip, SkipReason::None);
  ASSERT_EQ(r.conversation.turns.size(), 2u);
  EXPECT_EQ(r.conversation.turns[0].role, ChatRole::User);
  EXPECT_EQ(r.conversation.turns[0].text, "Tom had a ball.");
  EXPECT_EQ(r.conversation.turns[1].role, ChatRole::Assistant);
  EXPECT_EQ(r.conversation.turns[1].text, "He liked it! \"Wow!\" said Sue.\nThe end.");
  // '!' followed by a quote does not end the sentence; '?' followed by a newline does.
  r = parse_story("\"Wow!\" said Sue. Then she ran.");
  EXPECT_EQ(r.conversation.turns.at(0).text, "\"Wow!\" said Sue.");
  r = parse_story("Why?\nBecause.");
  EXPECT_EQ(r.conversation.turns.at(0).text, "Why?");
  EXPECT_EQ(r.conversation.turns.at(1).text, "Because.");
  EXPECT_EQ(parse_story("Only one sentence.").skip, SkipReason::NoRest);
  EXPECT_EQ(parse_story("Only one sentence.   \n").skip, SkipReason::NoRest);
  EXPECT_EQ(parse_story("   ").skip, SkipReason::Empty);
}

// The first stories of the real TinyStories file: blocks split on blank lines, first sentence = prompt,
// the rest = answer (masked), single-sentence blocks skipped.
TEST_F(PrepareTest, TinyStoriesText) {
  std::ifstream in(testing::data_dir() + "/tinystories/tinystories_val.txt");
  if (!in) GTEST_SKIP() << "no tinystories_val.txt in " << testing::data_dir();
  std::string text, line;
  std::vector<std::string> blocks(1);
  for (int i = 0; i < 40 && std::getline(in, line); ++i) {
    text += line + "\n";
    if (line.find_first_not_of(" \t\r") == std::string::npos) {
      if (!blocks.back().empty()) blocks.emplace_back();
    } else {
      blocks.back() += (blocks.back().empty() ? "" : "\n") + line;
    }
  }
  if (blocks.back().empty()) blocks.pop_back();
  int64_t usable = 0;
  for (const auto& b : blocks) usable += parse_story(b).skip == SkipReason::None;
  ASSERT_GT(usable, 3);
  PrepareStats st = run("stories.txt", text, InputFormat::Auto);
  EXPECT_EQ(st.records, static_cast<int64_t>(blocks.size()));
  EXPECT_EQ(st.samples, usable);
  EXPECT_EQ(st.skipped, static_cast<int64_t>(blocks.size()) - usable);
  Prepared p = read_prepared(dir_ + "/prepared.h5");
  EXPECT_EQ(h5::File::open(dir_ + "/prepared.h5").string_attr("input_format"), "text");
  int64_t k = 0;
  for (const auto& b : blocks) {
    InputRecord r = parse_story(b);
    if (r.skip != SkipReason::None) continue;
    const std::string& prompt = r.conversation.turns[0].text;
    const std::string& answer = r.conversation.turns[1].text;
    std::vector<int32_t> ids = {tok_->bos_id()};
    std::vector<uint8_t> mask = {0};
    add(ids, mask, enc(prompt), 0);
    add(ids, mask, enc(answer), 1);
    add(ids, mask, {tok_->eos_id()}, 1);
    EXPECT_EQ(p.sample_ids(k), ids) << "story " << k;
    EXPECT_EQ(p.sample_mask(k), mask) << "story " << k;
    // The story survives: decoding the sample gives prompt + answer.
    EXPECT_EQ(tok_->decode(p.sample_ids(k)), tok_->decode(enc(prompt)) + " " + tok_->decode(enc(answer)));
    ++k;
  }
  EXPECT_EQ(k, p.samples());
}

// The ranks of MPI_COMM_WORLD together must write exactly what one rank writes: same tokens, masks,
// offsets and counts, for JSONL with bad lines and for text. With 1 rank this compares a run with itself.
TEST(PrepareParallelTest, WorldEqualsOneRank) {
  AERIE_REQUIRE_MODEL();
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::string name = "prepare_parallel_np" + std::to_string(size);
  std::string dir = testing::scratch_root() + "/" + name;
  if (rank == 0) {
    dir = testing::scratch_dir(name);
    // JSONL: 23 lines of varying length with bad lines mixed in, so rank ranges split inside.
    std::ofstream out(dir + "/in.jsonl");
    for (int i = 0; i < 23; ++i) {
      if (i % 7 == 3) {
        out << "{broken " << i << "\n";
        continue;
      }
      std::string answer;
      for (int k = 0; k <= i % 5; ++k) answer += "The cat sat on the mat number " + std::to_string(i) + ". ";
      out << R"({"conversations": [{"from": "human", "value": "Story )" << i << R"(?"}, {"from": "gpt", "value": ")"
          << answer << R"("}]})" << "\n";
    }
    out.close();
    // The same records as one JSON array (split by element index).
    std::ifstream lines(dir + "/in.jsonl");
    std::ofstream arr(dir + "/in.json");
    std::string l;
    arr << "[";
    for (bool first = true; std::getline(lines, l); first = false) {
      if (l.rfind("{broken", 0) == 0) l = R"({"conversations": []})";
      arr << (first ? "\n" : ",\n") << l;
    }
    arr << "\n]\n";
    arr.close();
    std::ifstream in(testing::data_dir() + "/tinystories/tinystories_val.txt");
    std::ofstream txt(dir + "/in.txt");
    std::string line;
    for (int i = 0; i < 120 && std::getline(in, line); ++i) txt << line << "\n";
  }
  MPI_Barrier(MPI_COMM_WORLD);
  // (input, --max-samples): with a limit, the counts must also equal a single reader's that stops early.
  const std::vector<std::pair<std::string, int64_t>> runs = {
      {"in.jsonl", -1}, {"in.json", -1}, {"in.txt", -1}, {"in.jsonl", 9}, {"in.txt", 4}, {"in.json", 1}};
  for (const auto& [input, max_samples] : runs) {
    PrepareOptions o;
    o.input = dir + "/" + input;
    o.max_samples = max_samples;
    o.tokenizer = testing::model_dir();
    o.max_length = 40;
    o.output = dir + "/world.h5";
    PrepareStats world = run_prepare(o, MPI_COMM_WORLD);
    if (rank == 0) {
      o.output = dir + "/one.h5";
      PrepareStats one = run_prepare(o, MPI_COMM_SELF);
      if (max_samples >= 0) {
        EXPECT_EQ(one.samples, max_samples) << input;
      }
      EXPECT_EQ(world.records, one.records) << input;
      EXPECT_EQ(world.samples, one.samples) << input;
      EXPECT_EQ(world.skipped, one.skipped) << input;
      EXPECT_EQ(world.truncated, one.truncated) << input;
      EXPECT_EQ(world.examples, one.examples) << input;
      EXPECT_EQ(world.skipped_by, one.skipped_by) << input;
      Prepared a = read_prepared(dir + "/world.h5"), b = read_prepared(dir + "/one.h5");
      EXPECT_GT(a.samples(), max_samples >= 0 ? max_samples - 1 : 5) << input;
      EXPECT_EQ(a.ids, b.ids) << input;
      EXPECT_EQ(a.mask, b.mask) << input;
      EXPECT_EQ(a.offsets, b.offsets) << input;
      EXPECT_FALSE(std::filesystem::exists(dir + "/world.h5.tmp"));
      // Stronger: the files are byte-identical (no object times, fixed creation order).
      auto bytes = [](const std::string& path) {
        std::ifstream in(path, std::ios::binary);
        return std::string(std::istreambuf_iterator<char>(in), {});
      };
      EXPECT_TRUE(bytes(dir + "/world.h5") == bytes(dir + "/one.h5")) << input;
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

}  // namespace
}  // namespace aerie
