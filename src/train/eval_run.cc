// `aerie eval`: prompts, speculative decoding against plain greedy decoding, teacher-forced metrics,
// eval.json. eagle3.md sections 4 and 6.
#include <algorithm>
#include <filesystem>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

#include "comm/nccl_communicator.h"
#include "core/device.h"
#include "core/log.h"
#include "core/progress.h"
#include "core/version.h"
#include "data/chat_templates.h"
#include "data/prepare_input.h"
#include "data/prepare_template.h"
#include "data/prompt_input.h"
#include "data/extract.h"
#include "data/shard.h"
#include "io/fingerprint.h"
#include "io/output_lock.h"
#include "tokenizer/tokenizer.h"
#include "train/checkpoint.h"
#include "train/data_order.h"
#include "model/sampling.h"
#include "train/eval.h"

namespace aerie {

void TeacherForced::add(const TTTStats& st) {
  if (correct.size() < st.correct.size()) {
    correct.resize(st.correct.size(), 0);
    acc_rows.resize(st.acc_rows.size(), 0);
  }
  for (size_t k = 0; k < st.correct.size(); ++k) {
    correct[k] += st.correct[k];
    acc_rows[k] += st.acc_rows[k];
  }
  ++samples;
}

std::vector<double> TeacherForced::acc_k() const {
  std::vector<double> a(correct.size(), 0.0);
  for (size_t k = 0; k < a.size(); ++k) a[k] = acc_rows[k] > 0 ? static_cast<double>(correct[k]) / acc_rows[k] : 0.0;
  return a;
}

double TeacherForced::tau_sim() const {
  double tau = 1.0, prod = 1.0;
  for (double a : acc_k()) {
    prod *= a;
    tau += prod;
  }
  return tau;
}

void TeacherForced::all_reduce(Communicator& c, int S) {
  correct.resize(S, 0);
  acc_rows.resize(S, 0);
  std::vector<int64_t> v = correct;
  v.insert(v.end(), acc_rows.begin(), acc_rows.end());
  v.push_back(samples);
  Tensor t = Tensor::from_vector(v, {static_cast<int64_t>(v.size())});
  c.all_reduce_sum(t);
  const int64_t* p = t.data<int64_t>();
  correct.assign(p, p + S);
  acc_rows.assign(p + S, p + 2 * S);
  samples = p[2 * S];
}

std::vector<std::string> read_prompts(const std::string& path, int64_t max_prompts,
                                      std::vector<std::string>* categories) {
  const PromptFile file(path, InputFormat::Auto);
  std::vector<std::string> out;
  if (categories) categories->clear();
  std::string first_skip;  // why the first unusable record was skipped, for the error when none is left
  for (int64_t b = 0; b < file.size() && !(max_prompts > 0 && static_cast<int64_t>(out.size()) >= max_prompts);) {
    const int64_t e = std::min(file.size(), b + 256);
    const std::vector<std::string> records = file.read(b, e);
    for (int64_t i = b; i < e; ++i) {
      if (max_prompts > 0 && static_cast<int64_t>(out.size()) >= max_prompts) break;
      const PromptRecord r = parse_prompt_record(records[static_cast<size_t>(i - b)], file.record_format());
      AERIE_CHECK(r.skip != SkipReason::BadJson, file.where(i) << ": " << r.detail);
      const auto user = std::find_if(r.conversation.turns.begin(), r.conversation.turns.end(),
                                     [](const ChatTurn& t) { return t.role == ChatRole::User; });
      if (r.skip == SkipReason::None && user != r.conversation.turns.end()) {
        out.push_back(user->text);
        if (categories) {  // the record's other keys, a plain prompt's "category" among them
          const nlohmann::json j = nlohmann::json::parse(r.json, nullptr, false);
          const auto c = j.is_object() ? j.find("category") : j.end();
          std::string name;  // a string as it is, a number or list as its JSON text, null as none
          if (j.is_object() && c != j.end() && !c->is_null()) name = c->is_string() ? c->get<std::string>() : c->dump();
          categories->push_back(name);
        }
      } else if (first_skip.empty() && r.skip != SkipReason::Empty) {
        first_skip = file.where(i) + ": " + (r.skip == SkipReason::None ? "no user turn" : r.detail);
      }
    }
    b = e;
  }
  AERIE_CHECK(!out.empty(), "read_prompts: no prompt in " << path << (first_skip.empty() ? "" : " (" + first_skip + ")"));
  return out;
}

std::vector<PromptIdsRecord> read_prompt_ids_file(const std::string& path, int64_t max_records, int64_t vocab_size) {
  std::ifstream in(path);
  AERIE_CHECK(in && !std::filesystem::is_directory(path), "cannot read " << path);
  std::vector<PromptIdsRecord> out;
  std::map<int64_t, int64_t> seen;  // index -> its line
  int64_t line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (max_records > 0 && static_cast<int64_t>(out.size()) >= max_records) break;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(line_no);
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    AERIE_CHECK(!j.is_discarded(), where << ": not JSON");
    AERIE_CHECK(j.is_object(), where << ": a JSON object was expected (a line of aerie eval --write-prompts)");
    PromptIdsRecord r;
    AERIE_CHECK(j.contains("index") && j["index"].is_number_integer() &&
                    (j["index"].is_number_unsigned() || j["index"].get<int64_t>() >= 0) &&
                    j["index"].get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX),
                where << ": no \"index\" >= 0 (the prompt's index in the prompts eval read)");
    r.index = j["index"].get<int64_t>();
    AERIE_CHECK(seen.emplace(r.index, line_no).second,
                where << ": index " << r.index << " again (first on line " << seen[r.index] << ")");
    if (j.contains("category") && !j["category"].is_null()) {
      AERIE_CHECK(j["category"].is_string(), where << ": \"category\" is not a string or null");
      r.category = j["category"].get<std::string>();
    }
    auto ids = [&](const char* key, bool non_empty) {
      AERIE_CHECK(j.contains(key) && j[key].is_array(), where << ": no list \"" << key << "\"");
      std::vector<int32_t> v;
      for (const nlohmann::json& x : j[key]) {
        AERIE_CHECK(x.is_number_integer(), where << ": \"" << key << "\" holds " << x.dump() << ", not a token id");
        const bool negative = !x.is_number_unsigned() && x.get<int64_t>() < 0;
        const bool too_big = x.is_number_unsigned() && x.get<uint64_t>() > static_cast<uint64_t>(INT32_MAX);
        AERIE_CHECK(!negative && !too_big && (vocab_size <= 0 || x.get<int64_t>() < vocab_size),
                    where << ": \"" << key << "\" holds token id " << x.dump() << ", "
                          << (negative                        ? std::string("a negative id")
                              : vocab_size > 0                ? "outside the target's vocabulary [0, " + std::to_string(vocab_size) + ")"
                                                              : std::string("past any vocabulary")));
        v.push_back(static_cast<int32_t>(x.get<int64_t>()));
      }
      AERIE_CHECK(!non_empty || !v.empty(), where << ": \"" << key << "\" is empty");
      return v;
    };
    r.prompt_ids = ids("prompt_ids", true);
    r.stop_ids = ids("stop_ids", false);
    r.greedy_ids = ids("greedy_ids", true);
    for (size_t t = 0; t + 1 < r.greedy_ids.size(); ++t)
      AERIE_CHECK(std::find(r.stop_ids.begin(), r.stop_ids.end(), r.greedy_ids[t]) == r.stop_ids.end(),
                  where << ": \"greedy_ids\" holds stop id " << r.greedy_ids[t] << " at position " << t << " of "
                        << r.greedy_ids.size() << ": an answer ends at its stop id");
    out.push_back(std::move(r));
  }
  AERIE_CHECK(!out.empty(), path << " holds no record (a prompt-ids file of aerie eval --write-prompts)");
  return out;
}

std::vector<int32_t> eval_prompt_ids(const ChatTemplate& tmpl, const std::string& text, const Tokenizer& tok) {
  Conversation conv;
  conv.turns.push_back({ChatRole::User, text});
  // As data/regenerate.h's generation_prompt (what `aerie generate` decodes from): render_prompt, each text
  // segment through encode_text, special segments as their ids.
  std::vector<int32_t> ids;
  for (const TemplateSegment& seg : tmpl.render_prompt(conv)) {
    std::vector<int32_t> part = seg.ids.empty() ? tmpl.encode_text(seg.text, tok) : seg.ids;
    ids.insert(ids.end(), part.begin(), part.end());
  }
  return ids;
}

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The rendered text of an eval prompt, special tokens included (an INI template's pieces; "plain": the
// decoded ids, which drop BOS), for eval.json's example.
std::string eval_prompt_text(const ChatTemplate& tmpl, const std::string& text, const std::vector<int32_t>& ids,
                             const Tokenizer& tok) {
  const auto* ct = dynamic_cast<const ConfigChatTemplate*>(&tmpl);
  if (!ct) return tok.decode(ids);
  Conversation conv;
  conv.turns.push_back({ChatRole::User, text});
  std::string out;
  for (const TemplatePiece& p : ct->render_pieces(conv, true)) out += p.text;
  return out;
}

std::vector<int32_t> default_stop_ids(const TargetConfig& cfg, const Tokenizer& tok, const ChatTemplate& tmpl) {
  std::vector<int32_t> stop;
  // A chat template's end-of-turn token ends the answer (ChatML's <|im_end|>, Llama 3's <|eot_id|>).
  if (const auto* ct = dynamic_cast<const ConfigChatTemplate*>(&tmpl); ct && !ct->spec().eot.empty()) {
    const int32_t eot = tok.token_to_id(ct->spec().eot);
    if (eot >= 0) stop.push_back(eot);
  }
  if (cfg.raw.contains("eos_token_id") && cfg.raw["eos_token_id"].is_array()) {
    for (auto& e : cfg.raw["eos_token_id"]) stop.push_back(e.get<int32_t>());
  } else if (cfg.eos_token_id >= 0) {
    stop.push_back(static_cast<int32_t>(cfg.eos_token_id));
  }
  if (tok.eos_id() >= 0) stop.push_back(tok.eos_id());
  // A BOS inside a text starts a new document (llama2.c); the same rule as `aerie generate`.
  int32_t bos = tok.bos_id() >= 0 ? tok.bos_id() : static_cast<int32_t>(cfg.bos_token_id);
  if (bos >= 0) stop.push_back(bos);
  std::vector<int32_t> unique;  // each id once, in the order found (EOS named by config and tokenizer alike)
  for (int32_t t : stop)
    if (std::find(unique.begin(), unique.end(), t) == unique.end()) unique.push_back(t);
  return unique;
}

/// Sums of the speculative decoding runs of one draft.
struct SpecSums {
  int64_t prompts = 0, generated = 0, passes = 0, verify_tokens = 0, lossless_failures = 0;
  std::vector<int64_t> accepted_at;
  double spec_seconds = 0;

  void add(const SpecDecodeResult& r, bool lossless, double secs) {
    if (accepted_at.empty()) accepted_at.assign(r.accepted_at.size(), 0);
    ++prompts;
    generated += r.generated;
    passes += r.verify_passes;
    verify_tokens += r.verify_tokens;
    lossless_failures += !lossless;
    for (size_t i = 0; i < r.accepted_at.size(); ++i) accepted_at[i] += r.accepted_at[i];
    spec_seconds += secs;
  }
  void all_reduce(Communicator& c, int n) {
    accepted_at.resize(n, 0);
    std::vector<int64_t> v{prompts, generated, passes, verify_tokens, lossless_failures};
    v.insert(v.end(), accepted_at.begin(), accepted_at.end());
    Tensor t = Tensor::from_vector(v, {static_cast<int64_t>(v.size())});
    c.all_reduce_sum(t);
    const int64_t* p = t.data<int64_t>();
    prompts = p[0], generated = p[1], passes = p[2], verify_tokens = p[3], lossless_failures = p[4];
    accepted_at.assign(p + 5, p + 5 + n);
    Tensor s = Tensor::from_vector(std::vector<float>{static_cast<float>(spec_seconds)}, {1});
    c.all_reduce_sum(s);
    spec_seconds = s.data<float>()[0];
  }
  void to_json(nlohmann::json& j, const std::string& suffix) const {
    const double tau = passes > 0 ? static_cast<double>(verify_tokens) / passes : 0.0;
    std::vector<double> rate, cond;
    for (size_t i = 0; i < accepted_at.size(); ++i) {
      rate.push_back(passes > 0 ? static_cast<double>(accepted_at[i]) / passes : 0.0);
      const int64_t reached = i == 0 ? passes : accepted_at[i - 1];
      cond.push_back(reached > 0 ? static_cast<double>(accepted_at[i]) / reached : 0.0);
    }
    j["acceptance_length" + suffix] = tau;
    j["acceptance_rate_per_position" + suffix] = rate;
    j["conditional_acceptance_rate_per_position" + suffix] = cond;
    j["lossless" + suffix] = lossless_failures == 0;
    j["lossless_failures" + suffix] = lossless_failures;
    j["verify_passes" + suffix] = passes;
    j["tokens_generated" + suffix] = generated;
    j["spec_seconds" + suffix] = spec_seconds;
  }
};

// The figures eval.json repeats for the untrained draft, with the suffix "_untrained".
constexpr const char* kUntrainedFigures[] = {
    "acceptance_length", "acceptance_rate_per_position", "conditional_acceptance_rate_per_position", "lossless",
    "lossless_failures", "verify_passes", "tokens_generated", "spec_seconds", "acc_k", "tau_sim", "per_category"};

// The draft variant for the log: "EAGLE-3", or the EAGLE-3.1 options the draft was trained with
// ("EAGLE-3.1: norm_before_residual, norm_output"), prefixed "MLA " for the MLA draft.
std::string draft_variant(const DraftConfig& c) {
  std::string opts;
  for (const auto& [on, name] : {std::pair{c.norm_before_residual, "norm_before_residual"},
                                 std::pair{c.norm_output, "norm_output"}, std::pair{c.norm_before_fc, "norm_before_fc"},
                                 std::pair{c.fc_norm, "fc_norm"}})
    if (on) opts += (opts.empty() ? "" : ", ") + std::string(name);
  const std::string window =
      c.sliding_window > 0 ? ", sliding window " + std::to_string(c.sliding_window) + (c.sliding_window == 1 ? " key" : " keys")
                           : std::string();
  return std::string(c.is_mla() ? "MLA " : "") + (opts.empty() ? "EAGLE-3" : "EAGLE-3.1: " + opts) + window;
}

}  // namespace

struct EvalSession::Impl {
  EvalOptions o;
  ParallelGroups groups;
  Device dev = Device::CPU;
  DType dtype = DType::F32;
  std::unique_ptr<NcclCommunicator> nccl;  // the tp group's collectives on device tensors
  std::unique_ptr<TargetModel> model;
  std::unique_ptr<Tokenizer> tok;
  // This replica's prompts (ids as decoded) and their plain greedy answers (prompt + new tokens).
  std::vector<std::vector<int32_t>> prompts, greedy;
  std::vector<size_t> prompt_index;  // their index in --prompts (--follow: the line order of its records)
  std::vector<int64_t> record_index;  // --follow: each of this replica's records' "index"
  int64_t total_prompts = 0;          // --follow: the records of all replicas
  // Every prompt's "category" (all replicas; "" for none) and the categories in sorted order (empty when
  // no prompt has one); greedy_seconds per category (all replicas), as the speed-up's baseline.
  std::vector<std::string> prompt_category, categories;
  std::vector<double> category_greedy_seconds;
  int64_t too_long = 0;         // chat prompts over --max-prompt-tokens, skipped (all replicas)
  double greedy_seconds = 0;    // all replicas
  int64_t greedy_tokens = 0;
  nlohmann::json example;       // the first prompt of world rank 0 and its answer, as text
  std::vector<int32_t> stop;
  // Teacher-forced samples (shard path, sample index) and where they come from; none: the greedy answers.
  std::vector<std::pair<std::string, int64_t>> tf_refs;
  std::string tf_source;
  bool tf_on_shards = false;
  // A streamed run's split (train --prepared): its one "shard" is the prepared file, whose held-out
  // samples' hidden states the target computes here.
  bool tf_from_target = false;

  explicit Impl(const EvalOptions& opts) : o(opts), groups(ParallelGroups::create(opts.tp)) {}
  // The set-up of the constructor, in its order.
  void load_target(const EvalOptions& o);
  std::vector<std::string> read_prompt_texts(const EvalOptions& o);
  void sort_categories();
  void read_followed(const EvalOptions& o);
  void decode_references(const EvalOptions& o, const std::vector<std::string>& texts);
  void sum_references(const EvalOptions& o);
  void choose_teacher_forced_samples(const EvalOptions& o);
  void warn_about_tf_shards(const EvalOptions& o);
  void follow_figures(nlohmann::json& j, std::vector<int64_t> own_difference) const;
  TeacherForced teacher_forced(const LoadedDraft& draft);
};

namespace {
// The option values run_eval needs (jobs/eval.cc checked them already; a library caller may not have).
const EvalOptions& checked(const EvalOptions& o) {
  AERIE_CHECK(o.num_draft_tokens >= 1, "eval: --num-draft-tokens must be >= 1, got " << o.num_draft_tokens);
  AERIE_CHECK(o.max_new_tokens >= 1, "eval: --max-new-tokens must be >= 1, got " << o.max_new_tokens);
  AERIE_CHECK(o.ttt_steps >= 1, "eval: --ttt-steps must be >= 1");
  AERIE_CHECK(std::isfinite(o.temperature) && o.temperature >= 0,
              "eval: --temperature must be a finite number >= 0, got " << o.temperature);
  AERIE_CHECK(o.top_p > 0 && o.top_p <= 1, "eval: --top-p must be in (0, 1], got " << o.top_p);
  AERIE_CHECK(o.tree_topk >= 1 && o.tree_depth >= 0,
              "eval: --tree-topk must be >= 1 and --tree-depth >= 0, got " << o.tree_topk << ", " << o.tree_depth);
  AERIE_CHECK(o.tree_topk == 1 || o.temperature == 0,
              "eval: draft trees (--tree-topk > 1) verify greedily; sampled speculation (--temperature > 0) takes "
              "chains");
  AERIE_CHECK(o.device == "auto" || o.device == "cpu" || o.device == "cuda",
              "eval: --device '" << o.device << "' is not auto, cpu or cuda");
  AERIE_CHECK(o.dtype == "auto" || o.dtype == "f32" || o.dtype == "bf16",
              "eval: --dtype '" << o.dtype << "' is not auto, f32 or bf16");
  return o;
}
}  // namespace

// The target on the device and in the dtype of --device / --dtype (auto: as `aerie extract` picks them),
// its tokenizer.
void EvalSession::Impl::load_target(const EvalOptions& o) {
  Impl& s = *this;
  ParallelGroups& groups = s.groups;
  // The device as `aerie extract` picks it: auto is CUDA when every rank of the node has a GPU of its own.
  bool use_cuda = o.device == "cuda";
  if (o.device == "auto" && cuda::available()) {
    use_cuda = local_size() <= cuda::device_count();  // collective over the world (first call)
    if (!use_cuda && groups.map.world_rank == 0)
      AERIE_LOG(info) << "eval: " << local_size() << " ranks per node but " << cuda::device_count()
                      << " GPU(s): running on the CPU (--device cuda to insist)";
  }
  TargetModelOptions mopt;
  mopt.device = use_cuda ? Device::CUDA : Device::CPU;
  // auto as for extract and generate: bf16 on a GPU, f32 on the CPU.
  mopt.dtype = o.dtype == "bf16" || (o.dtype == "auto" && use_cuda) ? DType::BF16 : DType::F32;
  mopt.expert_parallel = o.expert_parallel;
  mopt.fp8_gemm = o.fp8_gemm;
  s.dev = mopt.device;
  s.dtype = mopt.dtype;
  if (s.dev == Device::CUDA) {
    AERIE_CHECK(cuda::available(), "eval: --device cuda: " << cuda::unavailable_reason());
    cuda::select_device(local_rank());  // collective over the world on first use
    s.nccl = std::make_unique<NcclCommunicator>(*groups.tp);
  }
  Communicator& model_tp = s.nccl ? static_cast<Communicator&>(*s.nccl) : *groups.tp;
  s.model = std::make_unique<TargetModel>(o.model_dir, model_tp, mopt);
  s.tok = Tokenizer::load(o.model_dir);
}

// --prompts (at most --num-prompts) and their categories (sorted; "(none)" for prompts without one when
// others have one).
std::vector<std::string> EvalSession::Impl::read_prompt_texts(const EvalOptions& o) {
  Impl& s = *this;
  ParallelGroups& groups = s.groups;
  std::vector<std::string> texts = read_prompts(o.prompts_path, o.num_prompts, &s.prompt_category);
  if (o.num_prompts > 0 && static_cast<int64_t>(texts.size()) < o.num_prompts && groups.map.world_rank == 0)
    AERIE_LOG(warning) << "eval: --num-prompts " << o.num_prompts << " but " << o.prompts_path << " holds "
                       << texts.size() << " prompt(s): evaluating those (the figures rest on fewer prompts)";
  s.sort_categories();
  return texts;
}

// The sorted categories of prompt_category ("(none)" for prompts without one when others have one).
void EvalSession::Impl::sort_categories() {
  Impl& s = *this;
  for (const std::string& c : s.prompt_category)
    if (!c.empty() && std::find(s.categories.begin(), s.categories.end(), c) == s.categories.end())
      s.categories.push_back(c);
  std::sort(s.categories.begin(), s.categories.end());
  if (!s.categories.empty())
    for (std::string& c : s.prompt_category)
      if (c.empty()) c = "(none)";  // prompts without a category, beside those with one
  if (!s.categories.empty() && std::count(s.prompt_category.begin(), s.prompt_category.end(), "(none)") > 0 &&
      std::find(s.categories.begin(), s.categories.end(), "(none)") == s.categories.end())
    s.categories.push_back("(none)");  // (a category named "(none)" shares the entry)
  s.category_greedy_seconds.assign(s.categories.size(), 0.0);
}

// --follow: this replica's records (every dp-th) as prompts, their greedy_ids (cut at --max-new-tokens) as
// the continuations to follow; stop ids from the records (one list for all).
void EvalSession::Impl::read_followed(const EvalOptions& o) {
  Impl& s = *this;
  const TargetConfig& tc = s.model->config();
  std::vector<PromptIdsRecord> recs;
  try {
    recs = read_prompt_ids_file(o.follow_path, o.num_prompts, tc.vocab_size);
  } catch (const Error& e) {
    AERIE_THROW("eval: --follow " << e.what());
  }
  s.total_prompts = static_cast<int64_t>(recs.size());
  s.stop = recs.front().stop_ids;
  const int dp = s.groups.map.dp, dp_rank = s.groups.map.dp_rank;
  for (size_t i = 0; i < recs.size(); ++i) {
    PromptIdsRecord& r = recs[i];
    auto as_set = [](std::vector<int32_t> v) {
      std::sort(v.begin(), v.end());
      v.erase(std::unique(v.begin(), v.end()), v.end());
      return v;
    };
    AERIE_CHECK(as_set(r.stop_ids) == as_set(s.stop), "eval: --follow " << o.follow_path << ": record " << i + 1
                                                                      << " (index " << r.index
                                                                      << ") has other stop_ids than the first record");
    s.prompt_category.push_back(r.category);
    if (static_cast<int64_t>(r.greedy_ids.size()) > o.max_new_tokens) r.greedy_ids.resize(o.max_new_tokens);
    const int64_t max_pos = tc.max_position_embeddings,
                  need = static_cast<int64_t>(r.prompt_ids.size() + r.greedy_ids.size()) + o.num_draft_tokens + 1;
    AERIE_CHECK(max_pos <= 0 || need <= max_pos,
                "eval: --follow " << o.follow_path << ": record " << i + 1 << " (index " << r.index << ") has "
                                  << r.prompt_ids.size() << " prompt and " << r.greedy_ids.size() << " answer tokens; with "
                                  << o.num_draft_tokens + 1 << " verification positions that exceeds the target's "
                                  << "max_position_embeddings " << max_pos);
    if (static_cast<int>(i % dp) != dp_rank) continue;
    s.greedy_tokens += static_cast<int64_t>(r.greedy_ids.size());  // summed over the replicas after
    std::vector<int32_t> all = r.prompt_ids;
    all.insert(all.end(), r.greedy_ids.begin(), r.greedy_ids.end());
    s.prompt_index.push_back(i);
    s.record_index.push_back(r.index);
    s.prompts.push_back(std::move(r.prompt_ids));
    s.greedy.push_back(std::move(all));
  }
  s.sort_categories();
}

// This replica's prompts (each replica takes every dp-th) as ids, and their greedy answers, timed: the
// reference of every draft's lossless check and the speed-up's baseline.
void EvalSession::Impl::decode_references(const EvalOptions& o, const std::vector<std::string>& texts) {
  Impl& s = *this;
  ParallelGroups& groups = s.groups;
  TargetModel& model = *s.model;
  const Tokenizer& tok = *s.tok;
  const int dp = groups.map.dp, dp_rank = groups.map.dp_rank;
  auto category_of = [&](size_t prompt) {
    return static_cast<size_t>(std::find(s.categories.begin(), s.categories.end(), s.prompt_category[prompt]) -
                               s.categories.begin());
  };
  auto tmpl = make_chat_template(o.chat_template, tok);
  const bool plain = o.chat_template == "plain";
  s.stop = default_stop_ids(model.config(), tok, *tmpl);
  // Long work (a large target decodes a few tokens a second) shows progress from world rank 0, its
  // replica's prompts counted; a line every 10 s, none for a short run.
  Progress greedy_progress("eval: greedy decoding (the reference)", "prompts of replica 0",
                           static_cast<double>((texts.size() + static_cast<size_t>(dp - 1 - dp_rank)) / static_cast<size_t>(dp)),
                           groups.map.world_rank, 10.0);
  for (size_t i = 0; i < texts.size(); ++i) {
    if (static_cast<int>(i % dp) != dp_rank) continue;
    std::vector<int32_t> prompt = eval_prompt_ids(*tmpl, texts[i], tok);
    AERIE_CHECK(!prompt.empty(), "eval: prompt " << i << " of " << o.prompts_path << " has no tokens");
    if (o.max_prompt_tokens > 0 && static_cast<int64_t>(prompt.size()) > o.max_prompt_tokens) {
      // A plain prompt is a text prefix: cut it. A chat prompt cut would lose its assistant header: skip it.
      if (!plain) {
        ++s.too_long;
        greedy_progress.add(1);
        continue;
      }
      prompt.resize(o.max_prompt_tokens);
    }
    const int64_t max_pos = model.config().max_position_embeddings,
                  need = static_cast<int64_t>(prompt.size()) + o.max_new_tokens + o.num_draft_tokens + 1;
    AERIE_CHECK(max_pos <= 0 || need <= max_pos,
                "eval: prompt " << i << " of " << o.prompts_path << " has " << prompt.size() << " tokens; with "
                                << o.max_new_tokens << " new tokens and " << o.num_draft_tokens + 1
                                << " verification positions that exceeds the target's max_position_embeddings "
                                << max_pos << ": lower --max-new-tokens or set --max-prompt-tokens (a chat prompt "
                                << "over it is skipped, a plain one cut)");
    if (s.prompts.empty())  // untimed warm-up (a GPU's first kernels, handles and pools), not in greedy_seconds
      (void)greedy_generate(model, prompt, std::min<int64_t>(o.max_new_tokens, 4), s.stop);
    auto t0 = Clock::now();
    std::vector<int32_t> greedy = greedy_generate(model, prompt, o.max_new_tokens, s.stop);
    s.greedy_seconds += seconds_since(t0);
    if (!s.categories.empty()) s.category_greedy_seconds[category_of(i)] += seconds_since(t0);
    s.greedy_tokens += static_cast<int64_t>(greedy.size() - prompt.size());
    if (s.example.is_null()) {
      s.example["decoding"] = "greedy (the reference of the lossless check)";
      s.example["prompt"] = eval_prompt_text(*tmpl, texts[i], prompt, tok);
      s.example["output"] = tok.decode(std::vector<int32_t>(greedy.begin() + static_cast<int64_t>(prompt.size()),
                                                            greedy.end()));
    }
    s.prompt_index.push_back(i);
    s.prompts.push_back(std::move(prompt));
    s.greedy.push_back(std::move(greedy));
    greedy_progress.add(1);
  }
}

// The references' counts and times summed over the replicas (dp).
void EvalSession::Impl::sum_references(const EvalOptions& o) {
  Impl& s = *this;
  ParallelGroups& groups = s.groups;
  Tensor t = Tensor::from_vector(std::vector<int64_t>{s.too_long, s.greedy_tokens}, {2});
  groups.dp->all_reduce_sum(t);
  s.too_long = t.data<int64_t>()[0];
  s.greedy_tokens = t.data<int64_t>()[1];
  if (s.too_long > 0 && groups.map.world_rank == 0)
    AERIE_LOG(warning) << "eval: " << s.too_long << " chat prompt(s) of " << o.prompts_path << " longer than "
                       << "--max-prompt-tokens " << o.max_prompt_tokens << " skipped (cut, a chat prompt would "
                       << "lose its assistant header); the figures cover the others (prompts_too_long in eval.json)";
  Tensor g = Tensor::from_vector(std::vector<float>{static_cast<float>(s.greedy_seconds)}, {1});
  groups.dp->all_reduce_sum(g);
  s.greedy_seconds = g.data<float>()[0];
  if (!s.categories.empty()) {
    std::vector<float> c(s.category_greedy_seconds.begin(), s.category_greedy_seconds.end());
    Tensor ct = Tensor::from_vector(c, {static_cast<int64_t>(c.size())});
    groups.dp->all_reduce_sum(ct);
    for (size_t k = 0; k < c.size(); ++k) s.category_greedy_seconds[k] = ct.data<float>()[k];
  }
}

// The teacher-forced samples: --data-split's held-out ones, all of --shards, or (neither) the greedy answers.
void EvalSession::Impl::choose_teacher_forced_samples(const EvalOptions& o) {
  Impl& s = *this;
  ParallelGroups& groups = s.groups;
  if (!o.shards_dir.empty() || !o.data_split_path.empty()) {
    s.tf_on_shards = true;
    if (!o.data_split_path.empty()) {
      DataSplit split = DataSplit::from_json(nlohmann::json::parse(read_file(o.data_split_path)));
      // With --shards, the split's shards are read from that folder (by file name: e.g. the same chunks
      // extracted again with --storage fp8), each of which must exist there; without it, where the split
      // says.
      auto where = [&](const std::string& recorded) {
        if (o.shards_dir.empty()) return recorded;
        const std::string p = (std::filesystem::path(o.shards_dir) / std::filesystem::path(recorded).filename()).string();
        AERIE_CHECK(std::filesystem::is_regular_file(p),
                    "eval: --shards " << o.shards_dir << " has no " << std::filesystem::path(recorded).filename().string()
                                      << ", a shard of the held-out samples of --data-split " << o.data_split_path);
        return p;
      };
      // A streamed run's split names the prepared file (train --prepared), not shards.
      s.tf_from_target = split.shards.size() == 1 && o.shards_dir.empty() && [&] {
        try {
          PreparedFile p(split.shards[0]);
          return p.num_samples() == split.shard_sizes[0];
        } catch (const Error&) {
          return false;
        }
      }();
      for (int64_t g : split.eval) {
        SampleRef r = split.locate(g);
        s.tf_refs.emplace_back(s.tf_from_target ? split.shards[r.shard] : where(split.shards[r.shard]), r.index);
      }
      s.tf_source = "held-out samples of " + o.data_split_path +
                    (s.tf_from_target ? " (a streamed run: hidden states from the target, rounded to bf16 as a "
                                        "shard stores them)"
                                      : o.shards_dir.empty() ? std::string() : " read from " + o.shards_dir);
    } else {
      const ShardFolder folder = read_shard_folder(o.shards_dir);  // a copy of a shard is not read twice
      if (groups.map.world_rank == 0)
        for (const SkippedShardFile& f : folder.skipped)
          AERIE_LOG(warning) << "eval: --shards " << o.shards_dir << ": skipping " << f.path << ": " << f.why;
      for (const std::string& path : folder.shards) {
        ShardReader rd(path);
        for (int64_t i = 0; i < rd.num_samples(); ++i) s.tf_refs.emplace_back(path, i);
      }
      s.tf_source = "all samples of " + o.shards_dir;
    }
    AERIE_CHECK(!s.tf_refs.empty(), "eval: " << (o.data_split_path.empty() ? "--shards " + o.shards_dir + " holds no sample"
                                                                           : "--data-split " + o.data_split_path +
                                                                                 " holds no held-out sample (a run trained "
                                                                                 "with --eval-fraction 0)")
                                             << ": drop --data-split and --shards, and the teacher-forced figures come "
                                                "from the target's greedy answers");
    if (o.num_eval_samples > 0 && static_cast<int64_t>(s.tf_refs.size()) > o.num_eval_samples)
      s.tf_refs.resize(o.num_eval_samples);
    if (groups.map.world_rank == 0 && o.data_split_path.empty())
      AERIE_LOG(info) << "eval: teacher-forced figures over " << s.tf_refs.size() << " samples of --shards "
                      << o.shards_dir << ", the training samples among them (--data-split RUN/data_split.json "
                      << "takes only the held-out ones)";
    s.warn_about_tf_shards(o);
  } else {
    s.tf_source = "greedy continuations of the prompts (loss mask on generated tokens)";
  }
}

void EvalSession::Impl::warn_about_tf_shards(const EvalOptions& o) {
  Impl& s = *this;
  ParallelGroups& groups = s.groups;
  // Shards of another target than --model: train refuses them; here a warning, as for a draft trained on
  // another target (a quantized copy of the model is a fair case), since tau_sim then scores the draft on
  // that target's hidden states.
  if (!s.tf_from_target && groups.map.world_rank == 0) {
    const ShardInfo info = ShardReader(s.tf_refs.front().first).info();
    if (info.has_provenance() && !info.target.random()) {
      const std::string diff = info.target.difference(TargetFingerprint::of_model(o.model_dir));
      if (!diff.empty())
        AERIE_LOG(warning) << "eval: the shards of the teacher-forced figures (" << s.tf_refs.front().first
                           << ") were extracted from another target (" << info.target_model << ") than --model "
                           << o.model_dir << ": " << diff << "; tau_sim and acc_k score the draft on that "
                           << "target's hidden states";
    }
    // W8A8 shards with a plain verifying target, or the reverse: the two halves of eval.json disagree.
    if (info.target_gemm.empty() == o.fp8_gemm)
      AERIE_LOG(warning) << "eval: the shards of the teacher-forced figures (" << s.tf_refs.front().first
                         << ") hold hidden states of "
                         << (info.target_gemm.empty() ? std::string("the target's own GEMMs") : info.target_gemm)
                         << ", the verifying target runs " << (o.fp8_gemm ? "W8A8 (--fp8-gemm)" : "without --fp8-gemm")
                         << ": tau_sim and acc_k come from the shards' kind, the acceptance length from this one";
  }
}

// --follow's eval.json: no lossless check or speed-up (the output is the followed text by construction, and
// nothing was decoded greedily here); own_greedy_agreement (records where this target's argmax is the followed
// token at every position it was fed the followed text) and own_first_difference {median, min, max} (the new
// token where it first is not, over the other records). own_difference: evaluate's slots, summed here.
void EvalSession::Impl::follow_figures(nlohmann::json& j, std::vector<int64_t> own_difference) const {
  Tensor t = Tensor::from_vector(own_difference, {static_cast<int64_t>(own_difference.size())});
  groups.dp->all_reduce_sum(t);
  std::vector<int64_t> parts;
  int64_t agree = 0;
  for (int64_t i = 0; i < t.numel(); ++i) {
    const int64_t v = t.data<int64_t>()[i] - 2;
    if (v < 0)
      ++agree;
    else
      parts.push_back(v);
  }
  for (const char* key : {"lossless", "lossless_failures", "speedup"}) j.erase(key);
  j["own_greedy_agreement"] = agree;
  if (!parts.empty()) {
    std::sort(parts.begin(), parts.end());
    j["own_first_difference"] = {{"median", parts[parts.size() / 2]}, {"min", parts.front()}, {"max", parts.back()}};
  }
}

EvalSession::EvalSession(const EvalOptions& o) : impl_(std::make_unique<Impl>(checked(o))) {
  Impl& s = *impl_;
  s.load_target(o);
  // Prompts: one user turn through the chat template of training data with its generation prompt (the
  // assistant header the served model answers after; plain: BOS + text). Their greedy answers do not
  // depend on the draft: decoded once, the reference of every draft's lossless check.
  if (o.follow_path.empty())
    s.decode_references(o, s.read_prompt_texts(o));
  else
    s.read_followed(o);  // another engine's answers: no greedy decoding here
  s.sum_references(o);
  s.choose_teacher_forced_samples(o);
}

EvalSession::~EvalSession() = default;

int EvalSession::world_rank() const { return impl_->groups.map.world_rank; }

LoadedDraft EvalSession::load(const std::string& path) const {
  const TargetConfig& tc = impl_->model->config();
  LoadedDraft draft = load_draft(path, tc.num_hidden_layers);
  AERIE_CHECK(draft.cfg.target_hidden_size == tc.hidden_size && draft.cfg.vocab_size == tc.vocab_size &&
                  draft.cfg.hidden_size == tc.hidden_size,
              "eval: draft " << path << " (H " << draft.cfg.hidden_size << ", H_t " << draft.cfg.target_hidden_size
                             << ", V " << draft.cfg.vocab_size << ") does not fit the target " << impl_->o.model_dir);
  for (int a : draft.cfg.aux_layers)
    AERIE_CHECK(a >= 0 && a <= tc.num_hidden_layers,
                "eval: draft " << path << " reads the hidden states of target layer " << a
                               << " (its aux layers, eagle_aux_hidden_state_layer_ids in an export), but the target "
                               << impl_->o.model_dir << " has " << tc.num_hidden_layers << " layers");
  // A checkpoint knows its target: a warning when this is another (as export warns; a draft trained on one
  // copy of a model may be evaluated on another, e.g. a quantized one).
  if (draft.provenance.is_object() && draft.provenance.contains("target") && impl_->groups.map.world_rank == 0) {
    const nlohmann::json& t = draft.provenance["target"];
    TargetFingerprint trained;
    trained.config_sha256 = t.value("config_sha256", "");
    trained.weights_sha256 = t.value("weights_sha256", "");
    const std::string diff = trained.difference(TargetFingerprint::of_model(impl_->o.model_dir));
    if (!diff.empty())
      AERIE_LOG(warning) << "eval: --model " << impl_->o.model_dir << " is not the target " << path
                         << " was trained with (" << t.value("model", std::string("?")) << "): " << diff;
  }
  // The draft runs beside the target (F32 weights; the target's embedding table, in its dtype).
  if (impl_->dev != Device::CPU) draft.weights = draft.weights.to_device(impl_->dev);
  return draft;
}

LoadedDraft EvalSession::untrained(const LoadedDraft& like, uint64_t seed) const {
  // The draft training started from: init_draft_weights with the same config, vocabulary and seed (from
  // a host F32 copy of the target's lm_head, as train does).
  const TargetModel& model = *impl_->model;
  Tensor lm = model.lm_head().device() == Device::CPU ? model.lm_head() : model.lm_head().to_device(Device::CPU);
  if (lm.dtype() != DType::F32) lm = lm.to(DType::F32);
  LoadedDraft u{like.cfg, init_draft_weights(like.cfg, lm, like.vocab.selected(), seed), like.vocab, nlohmann::json()};
  if (impl_->dev != Device::CPU) u.weights = u.weights.to_device(impl_->dev);
  return u;
}

nlohmann::json EvalSession::context() const {
  const Impl& s = *impl_;
  nlohmann::json j;
  j["model"] = s.o.model_dir;
  j["prompts"] = s.o.follow_path.empty() ? s.o.prompts_path : s.o.follow_path;
  if (!s.o.follow_path.empty()) j["follow"] = s.o.follow_path;
  if (s.o.follow_path.empty()) j["chat_template"] = s.o.chat_template;  // --follow: the file's ids as given
  j["device"] = device_name(s.dev);
  j["dtype"] = dtype_name();
  j["tp"] = s.o.tp;
  j["expert_parallel"] = s.o.expert_parallel;
  j["fp8_gemm"] = s.o.fp8_gemm;
  j["prompts_too_long"] = s.too_long;
  j["num_draft_tokens"] = s.o.num_draft_tokens;
  j["max_new_tokens"] = s.o.max_new_tokens;
  if (s.o.follow_path.empty()) j["greedy_seconds"] = s.greedy_seconds;  // --follow decodes nothing greedily
  j["greedy_tokens"] = s.greedy_tokens;
  j["teacher_forced_source"] = s.tf_source;
  j["ttt_steps"] = s.o.ttt_steps;
  if (!s.example.is_null()) j["example"] = s.example;  // world rank 0 holds prompt 0
  return j;
}

std::string EvalSession::dtype_name() const { return impl_->dtype == DType::BF16 ? "bf16" : "f32"; }

// The teacher-forced sums of acc_k / tau_sim (eagle3.md section 4): ttt_forward_backward without gradients over
// the samples choose_teacher_forced_samples picked, summed over the replicas.
TeacherForced EvalSession::Impl::teacher_forced(const LoadedDraft& draft) {
  Impl& s = *this;
  TargetModel& model = *s.model;
  const TargetConfig& tc = model.config();
  const int dp = s.groups.map.dp, dp_rank = s.groups.map.dp_rank;
  const int S = s.o.ttt_steps;
  const std::vector<double> ones(S, 1.0);
  TeacherForced tf;
  const std::vector<int> aux =
      draft.cfg.aux_layers.empty() ? default_aux_layers(tc.num_hidden_layers) : draft.cfg.aux_layers;
  auto score = [&](TTTSample&& t) {
    tf.add(ttt_forward_backward(draft.cfg, draft.weights, model.embed_tokens(), t, draft.vocab.d2t, draft.vocab.t2d, S,
                                ones, nullptr));
  };
  const std::vector<int64_t> selected = draft.vocab.selected();
  if (s.tf_from_target) {
    std::unique_ptr<PreparedFile> prepared;
    for (size_t i = 0; i < s.tf_refs.size(); ++i) {
      if (static_cast<int>(i % dp) != dp_rank) continue;
      if (!prepared) prepared = std::make_unique<PreparedFile>(s.tf_refs[i].first);
      std::vector<int32_t> ids;
      std::vector<uint8_t> mask;
      prepared->read_tokens(s.tf_refs[i].second, s.tf_refs[i].second + 1, ids, mask);
      TargetOutput out = model.forward(ids, nullptr, aux, false);  // collective over the tp group
      // The bf16 rounding of a shard (and of the streamed messages), so tau_sim is the run's own.
      auto as_shard = [](const Tensor& t) {
        Tensor h = t.device() == Device::CPU ? t : t.to_device(Device::CPU);
        return (h.dtype() == DType::BF16 ? h : h.to(DType::BF16)).to(DType::F32);
      };
      Tensor z = as_shard(out.final_hidden);
      if (model.lm_head().device() != Device::CPU) z = z.to_device(model.lm_head().device());
      score(make_ttt_sample(std::move(ids), std::move(mask), as_shard(out.aux_hidden), z, model.lm_head(), selected));
    }
  } else if (s.tf_on_shards) {
    std::string open_path;
    std::unique_ptr<ShardReader> rd;
    for (size_t i = 0; i < s.tf_refs.size(); ++i) {
      if (static_cast<int>(i % dp) != dp_rank) continue;
      if (s.tf_refs[i].first != open_path) {
        rd = std::make_unique<ShardReader>(s.tf_refs[i].first);
        open_path = s.tf_refs[i].first;
        AERIE_CHECK(rd->info().hidden_size == tc.hidden_size && rd->info().aux_layers == aux,
                    "eval: shard " << open_path << " (H " << rd->info().hidden_size
                                   << ") was not extracted with this target and the draft's aux layers");
      }
      HiddenSample h = rd->read(s.tf_refs[i].second);
      score(make_ttt_sample(std::move(h.ids), std::move(h.loss_mask), std::move(h.aux_hidden), h.final_hidden,
                            model.lm_head(), selected));
    }
  } else {
    // No shards: the target's own greedy continuations, loss mask on the generated tokens.
    for (size_t i = 0; i < s.greedy.size(); ++i) {
      TargetOutput out = model.forward(s.greedy[i], nullptr, aux, false);
      std::vector<uint8_t> mask(s.greedy[i].size(), 0);
      for (size_t t = s.prompts[i].size(); t < mask.size(); ++t) mask[t] = 1;
      // f goes through the host (make_ttt_sample widens a BF16 copy there); z stays where W_lm is.
      Tensor f = out.aux_hidden.device() == Device::CPU ? out.aux_hidden : out.aux_hidden.to_device(Device::CPU);
      score(make_ttt_sample(s.greedy[i], mask, f, out.final_hidden, model.lm_head(), selected));
    }
  }
  tf.all_reduce(*s.groups.dp, S);
  return tf;
}

nlohmann::json EvalSession::evaluate(const LoadedDraft& draft, const std::string& name) {
  Impl& s = *impl_;
  TargetModel& model = *s.model;
  const int n = s.o.num_draft_tokens;
  const bool sampled = s.o.temperature > 0, following = !s.o.follow_path.empty();
  // --follow: where the target's own argmax first parts from each record's answer (-1: never), slot i of
  // record i as value + 2 (0: another replica's), summed over the replicas below.
  std::vector<int64_t> own_difference(static_cast<size_t>(s.total_prompts), 0);
  AERIE_CHECK(s.o.tree_topk <= draft.vocab.draft_vocab_size(),
              "eval: --tree-topk " << s.o.tree_topk << " exceeds the draft vocabulary of "
                                   << (name.empty() ? std::string("the draft") : name) << " (K = "
                                   << draft.vocab.draft_vocab_size() << "): a node has at most K children");
  SpecSums sums;
  std::vector<SpecSums> by_category(s.categories.size());  // the same sums per prompt category
  Progress progress("eval: speculative decoding" + (name.empty() ? std::string() : " (" + name + ")"),
                    "prompts of replica 0", static_cast<double>(s.prompts.size()), s.groups.map.world_rank, 10.0);
  for (size_t i = 0; i < s.prompts.size(); ++i) {
    SpecDecodeOptions so;
    so.num_draft_tokens = n;
    so.max_new = s.o.max_new_tokens;
    so.stop_ids = s.stop;
    so.sampling = SamplingParams{s.o.temperature, s.o.top_p};
    so.seed = sequence_seed(s.o.sample_seed, s.prompt_index[i]);
    so.tree_topk = s.o.tree_topk;
    so.tree_depth = s.o.tree_depth;
    if (following)
      so.follow.assign(s.greedy[i].begin() + static_cast<int64_t>(s.prompts[i].size()), s.greedy[i].end());
    if (i == 0) {  // untimed warm-up of this draft's kernels and buffers, not in spec_seconds
      SpecDecodeOptions warm = so;
      warm.max_new = std::min<int64_t>(so.max_new, 2 * (n + 1));
      (void)speculative_generate(model, draft, s.prompts[i], warm);
    }
    const auto t0 = Clock::now();
    SpecDecodeResult r = speculative_generate(model, draft, s.prompts[i], so);
    const double secs = seconds_since(t0);
    if (following) own_difference[s.prompt_index[i]] = r.own_first_difference + 2;
    const bool same = sampled || r.tokens == s.greedy[i];  // a sampled output is not greedy decoding's
    if (!same)
      AERIE_LOG(warning) << "eval: prompt "
                         << (s.record_index.empty() ? static_cast<int64_t>(s.prompt_index[i]) : s.record_index[i])
                         << (name.empty() ? "" : " (" + name + ")")
                         << (following ? ": speculative output differs from the followed answer"
                                       : ": speculative output differs from greedy decoding")
                         << (s.dev == Device::CPU && s.dtype == DType::BF16
                                 ? " (BF16 on the CPU: OpenBLAS's GEMMs round a row differently with the number of "
                                   "rows in the pass, so a near-tie can flip between a verification pass and greedy "
                                   "decoding's one row; check with --dtype f32)"
                                 : "");
    sums.add(r, same, secs);
    if (!s.categories.empty()) {
      const std::string& c = s.prompt_category[s.prompt_index[i]];
      by_category[std::find(s.categories.begin(), s.categories.end(), c) - s.categories.begin()].add(r, same, secs);
    }
    progress.add(1);
  }
  // Positions a pass can accept: the chain's n, a tree's depth.
  const int positions = s.o.tree_topk > 1 && s.o.tree_depth > 0 ? std::min(s.o.tree_depth, n) : n;
  sums.all_reduce(*s.groups.dp, positions);
  for (SpecSums& c : by_category) c.all_reduce(*s.groups.dp, positions);  // every rank knows every category

  // Teacher-forced acc_k / tau_sim (eagle3.md section 4) with ttt_forward_backward, no gradients.
  const TeacherForced tf = s.teacher_forced(draft);

  nlohmann::json j;
  j["num_prompts"] = sums.prompts;
  sums.to_json(j, "");
  j["speedup"] = sums.spec_seconds > 0 ? s.greedy_seconds / sums.spec_seconds : 0.0;
  if (following) s.follow_figures(j, std::move(own_difference));
  if (!s.categories.empty()) {  // the prompts' "category" (MT-Bench, Spec-Bench): one entry each
    nlohmann::json per = nlohmann::json::object();
    for (size_t k = 0; k < s.categories.size(); ++k) {
      nlohmann::json c;
      c["num_prompts"] = by_category[k].prompts;
      by_category[k].to_json(c, "");
      c["speedup"] = by_category[k].spec_seconds > 0 ? s.category_greedy_seconds[k] / by_category[k].spec_seconds : 0.0;
      if (sampled || following) {
        c.erase("lossless");
        c.erase("lossless_failures");
      }
      if (following) c.erase("speedup");
      per[s.categories[k]] = c;
    }
    j["per_category"] = per;
  }
  j["acc_k"] = tf.acc_k();
  j["tau_sim"] = tf.tau_sim();
  j["teacher_forced_samples"] = tf.samples;
  if (s.o.tree_topk > 1)
    j["tree"] = {{"topk", s.o.tree_topk},
                 {"depth", positions},
                 {"num_draft_tokens", n}};
  if (sampled) {  // no lossless check: a sampled output is compared with nothing
    j.erase("lossless");
    j.erase("lossless_failures");
    j["sampling"] = {{"temperature", s.o.temperature}, {"top_p", s.o.top_p}, {"sample_seed", s.o.sample_seed}};
  }
  return j;
}

void EvalSession::write_prompt_records(const std::string& path) const {
  const Impl& s = *impl_;
  // This replica's records as JSONL text, gathered over the replicas (every tp rank of a replica holds
  // the same prompts): lengths first, then the bytes padded to the longest, one byte per I32.
  std::string mine;
  for (size_t i = 0; i < s.prompts.size(); ++i) {
    const std::string& c = s.prompt_category.empty() ? std::string() : s.prompt_category[s.prompt_index[i]];
    nlohmann::json r = {{"index", s.record_index.empty() ? static_cast<int64_t>(s.prompt_index[i]) : s.record_index[i]},
                        {"category", c.empty() || c == "(none)" ? nlohmann::json() : nlohmann::json(c)},
                        {"prompt_ids", s.prompts[i]},
                        {"stop_ids", s.stop},
                        {"greedy_ids", std::vector<int32_t>(s.greedy[i].begin() + static_cast<int64_t>(s.prompts[i].size()),
                                                            s.greedy[i].end())}};
    mine += r.dump() + "\n";
  }
  Communicator& dp = *s.groups.dp;
  Tensor len = Tensor::from_vector(std::vector<int64_t>{static_cast<int64_t>(mine.size())}, {1});
  Tensor lens = Tensor::zeros({static_cast<int64_t>(dp.size())}, DType::I64);
  dp.all_gather(len, lens);
  int64_t longest = 0;
  for (int r = 0; r < dp.size(); ++r) longest = std::max(longest, lens.data<int64_t>()[r]);
  std::vector<int32_t> bytes(static_cast<size_t>(std::max<int64_t>(longest, 1)), 0);
  for (size_t i = 0; i < mine.size(); ++i) bytes[i] = static_cast<unsigned char>(mine[i]);
  Tensor in = Tensor::from_vector(bytes, {static_cast<int64_t>(bytes.size())});
  Tensor all = Tensor::zeros({static_cast<int64_t>(dp.size()) * static_cast<int64_t>(bytes.size())}, DType::I32);
  dp.all_gather(in, all);
  if (s.groups.map.world_rank != 0) return;
  std::vector<std::pair<int64_t, std::string>> lines;  // (index in --prompts, line), sorted below
  for (int r = 0; r < dp.size(); ++r) {
    const int32_t* b = all.data<int32_t>() + static_cast<int64_t>(r) * static_cast<int64_t>(bytes.size());
    std::string text(static_cast<size_t>(lens.data<int64_t>()[r]), '\0');
    for (size_t i = 0; i < text.size(); ++i) text[i] = static_cast<char>(b[i]);
    std::istringstream in_lines(text);
    for (std::string line; std::getline(in_lines, line);)
      lines.emplace_back(nlohmann::json::parse(line)["index"].get<int64_t>(), line);
  }
  std::sort(lines.begin(), lines.end());
  std::string out;
  for (const auto& l : lines) out += l.second + "\n";
  try {
    write_file_atomic(path, out);
  } catch (const Error& e) {
    AERIE_THROW("eval: --write-prompts " << path << ": " << e.what());
  }
  AERIE_LOG(info) << "eval: the " << lines.size() << " prompts' ids, stop ids and greedy answers -> " << path
                  << " (tools/engine_eval --prompt-ids reads it)";
}

nlohmann::json run_eval(const EvalOptions& o) {
  EvalSession session(o);
  const LoadedDraft draft = session.load(o.draft_path);  // a draft that does not fit is refused first
  if (!o.prompts_out.empty()) session.write_prompt_records(o.prompts_out);
  nlohmann::json j = session.context();
  j["draft"] = o.draft_path;
  j["draft_variant"] = draft_variant(draft.cfg);  // the layer as the log line names it
  j.update(session.evaluate(draft));
  if (o.untrained) {
    const nlohmann::json u = session.evaluate(session.untrained(draft, o.seed), "untrained draft");
    for (const char* key : kUntrainedFigures)
      if (u.contains(key)) j[std::string(key) + "_untrained"] = u[key];
    if (j.contains("lossless")) j["lossless"] = j["lossless"].get<bool>() && u["lossless"].get<bool>();
  }
  if (session.world_rank() == 0) {
    // The log rounds to 4 decimals (seed noise is in the second); the JSON keeps every digit.
    const auto f4 = [](const nlohmann::json& v) {
      return v.is_number() ? format_fixed(v.get<double>(), 4) : v.dump();
    };
    AERIE_LOG(info) << "eval: acceptance length " << f4(j["acceptance_length"]) << " over " << j["verify_passes"]
                    << " verification passes, "
                    << (j.contains("lossless")         ? "lossless " + j["lossless"].dump()
                        : !o.follow_path.empty() ? "following " + o.follow_path + " (this target's own argmaxes agree "
                                                       "throughout in " + j["own_greedy_agreement"].dump() + " of " +
                                                       j["num_prompts"].dump() + " prompts)"
                                                 : "sampled at temperature " + std::to_string(o.temperature))
                    << ", tau_sim " << f4(j["tau_sim"]) << "; draft " << o.draft_path << " (" << draft_variant(draft.cfg)
                    << ")";
    if (o.untrained)
      AERIE_LOG(info) << "eval: untrained draft (--seed " << o.seed << "): acceptance length "
                      << f4(j["acceptance_length_untrained"]) << ", tau_sim " << f4(j["tau_sim_untrained"]);
    if (j.contains("per_category")) {
      std::ostringstream t;
      t << "eval: per category (prompts, acceptance length, speed-up):";
      for (const auto& [name, c] : j["per_category"].items()) {
        t << "\n  " << name << ": ";
        if (c["num_prompts"].get<int64_t>() == 0)
          t << "no prompts (skipped)";
        else
          t << c["num_prompts"] << ", " << f4(c["acceptance_length"]) << ", "
            << (c.contains("speedup") ? f4(c["speedup"]) : std::string("-"));
      }
      AERIE_LOG(info) << t.str();
    }
    if (!o.output_path.empty()) {
      j["aerie_version"] = aerie_version_string();
      write_file_atomic(o.output_path, j.dump(2) + "\n", unique_tmp_path(o.output_path));
    }
  }
  return j;
}

}  // namespace aerie
