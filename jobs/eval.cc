// aerie eval: how good a draft is (eagle3.md section 6). Real speculative decoding with the target (greedy,
// chain of n draft tokens, verified in one target forward per cycle), checked token for token against
// plain greedy decoding (lossless), plus the teacher-forced acc_k / tau_sim of section 4.
//
//   mpirun -np 1 aerie eval --model build/models/stories260K --draft runs/demo/export ...
//       --prompts ../shared/data/tinystories/tinystories_val.txt --num-prompts 16 --max-new-tokens 64 ...
//       --num-draft-tokens 7 --untrained --output eval.json
//
// Chat targets: --chat-template NAME (as for prepare); each prompt is one user turn rendered with the
// template's generation prompt, e.g. for SmolLM2 (tools/smollm2_pipeline):
//   mpirun -np 1 aerie eval --model MODEL --draft RUN/export --prompts ../shared/data/mt-bench/question.jsonl ...
//       --chat-template smollm2 --num-prompts 80 --max-new-tokens 256 --device cuda --output RUN/eval.json
// --prompts: the prompt sets `aerie generate --input` takes (src/data/prompt_input.h; the first user turn of
// each record is the prompt).
// --device auto|cpu|cuda: on CUDA each rank uses GPU local_rank() (tp groups over NCCL), the target in
// --dtype f32|bf16|auto (default f32), the draft in f32.
// --draft: an export directory (config.json + model.safetensors) or a training checkpoint / run directory.
// --untrained: the same figures for the draft training started from (init_draft_weights, --seed).
// --run RUN_DIR instead of --draft: every complete checkpoint of a training run (or --every N, --steps LIST),
// one row each in the checkpoint table RUN_DIR/checkpoint_eval.json (train/checkpoint_eval.h), which
// `aerie export --best` chooses from:
//   mpirun -np 2 aerie eval --model MODEL --run runs/demo/train --prompts PROMPTS ...
//       --shards runs/demo/shards --data-split runs/demo/train/data_split.json
// --temperature T > 0 (and --top-p): speculative sampling, the acceptance length as the serving engines
// report it at that temperature (Leviathan et al. 2023's rejection rule; no lossless check).
// --tree-topk K --tree-depth D: draft trees of --num-draft-tokens nodes (EAGLE-2; SGLang's eagle_topk /
// num_steps / num_draft_tokens - 1), verified greedily in one target forward (still lossless).
// Teacher-forced metrics: on --data-split's held-out samples (RUN_DIR/data_split.json), or on all samples
// of --shards, or (neither given) on the target's greedy continuations of the prompts.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/chat_templates.h"
#include "data/shard.h"
#include "jobs/jobs.h"
#include "model/target_config.h"
#include "train/checkpoint.h"
#include "train/checkpoint_eval.h"
#include "train/data_order.h"
#include "train/eval.h"

namespace aerie::jobs {

namespace {

namespace fs = std::filesystem;

/// A bad option value: aerie::UsageError (exit status 2) prefixed with the job.
#define EVAL_REQUIRE(cond, msg) AERIE_USAGE_CHECK(cond, "aerie eval: " << msg)

/// The checks that need no model, before run_eval loads the target (minutes for a large checkpoint) and
/// decodes every prompt: option values (UsageError, exit 2), then the files (aerie::Error naming the
/// option and path): --prompts readable with a prompt, --draft an export or a checkpoint, --chat-template
/// found, --data-split a file, --shards a folder with shards, --output not a folder.
/// --write-prompts (a symbolic link already followed): a .jsonl file in an existing folder that is none of the
/// job's other files, and if it exists an earlier --write-prompts file (its first line an object with
/// "prompt_ids"), never a device, a folder or another kind of file. Throws aerie::Error naming the path.
void check_prompts_out(const EvalOptions& o) {
  const std::string& p = o.prompts_out;
  const fs::path dir = fs::path(p).parent_path();
  AERIE_CHECK(dir.empty() || fs::is_directory(dir),
              "eval: --write-prompts " << p << ": the folder " << dir.string() << " does not exist");
  auto same = [&](const std::string& other) {
    std::error_code ec;
    return !other.empty() && fs::exists(other) && fs::exists(p) && fs::equivalent(p, other, ec);
  };
  auto spelled_same = [&](const std::string& other) {
    return !other.empty() && fs::absolute(other).lexically_normal() == fs::absolute(p).lexically_normal();
  };
  for (const auto& [name, other] : {std::pair<const char*, std::string>{"--output", o.output_path},
                                    {"--prompts", o.prompts_path}, {"--follow", o.follow_path},
                                    {"--data-split", o.data_split_path}})
    AERIE_CHECK(!same(other) && !spelled_same(other),
                "eval: --write-prompts " << p << " is also " << name << ": give it a file of its own");
  if (!fs::exists(p)) return;
  AERIE_CHECK(fs::is_regular_file(p), "eval: --write-prompts " << p << " exists and is not a regular file ("
                                                               << (fs::is_directory(p) ? "a folder" : "a device or socket")
                                                               << "): give a .jsonl path");
  std::ifstream in(p);
  std::string first;
  std::getline(in, first);
  const nlohmann::json j = nlohmann::json::parse(first, nullptr, false);
  AERIE_CHECK(fs::file_size(p) == 0 || (j.is_object() && j.contains("prompt_ids")),
              "eval: --write-prompts " << p << " exists and is not a prompt-ids file of aerie eval: refusing to "
                                       << "replace it; give another path");
}

void check_eval_inputs(const EvalOptions& o, const CheckpointEvalOptions& run) {
  EVAL_REQUIRE(o.num_prompts >= 0, "--num-prompts " << o.num_prompts << " is negative (0: all)");
  EVAL_REQUIRE(o.max_new_tokens >= 1, "--max-new-tokens must be >= 1, got " << o.max_new_tokens);
  EVAL_REQUIRE(o.max_prompt_tokens >= 0, "--max-prompt-tokens " << o.max_prompt_tokens << " is negative (0: whole)");
  EVAL_REQUIRE(o.num_draft_tokens >= 1, "--num-draft-tokens must be >= 1, got " << o.num_draft_tokens);
  EVAL_REQUIRE(o.num_eval_samples >= 0, "--num-eval-samples " << o.num_eval_samples << " is negative (0: all)");
  EVAL_REQUIRE(o.ttt_steps >= 1, "--ttt-steps must be >= 1, got " << o.ttt_steps);
  EVAL_REQUIRE(o.tp >= 1, "--tp must be >= 1, got " << o.tp);
  EVAL_REQUIRE(std::isfinite(o.temperature) && o.temperature >= 0,
               "--temperature must be a finite number >= 0, got " << o.temperature);
  EVAL_REQUIRE(o.top_p > 0 && o.top_p <= 1, "--top-p must be in (0, 1], got " << o.top_p);
  EVAL_REQUIRE(o.tree_topk >= 1, "--tree-topk must be >= 1, got " << o.tree_topk);
  EVAL_REQUIRE(o.tree_depth >= 0, "--tree-depth must be >= 0 (0: --num-draft-tokens), got " << o.tree_depth);
  EVAL_REQUIRE(o.tree_topk == 1 || o.temperature == 0,
               "--tree-topk > 1 verifies greedily; --temperature > 0 takes chains (--tree-topk 1)");
  EVAL_REQUIRE(o.tree_depth == 0 || o.tree_topk > 1,
               "--tree-depth " << o.tree_depth << " needs --tree-topk > 1 (a chain's length is --num-draft-tokens)");
  if (o.tree_topk > 1) {
    // The most nodes a tree of this shape holds: topk at depth 1, topk^2 at each further depth.
    const int64_t depth = o.tree_depth > 0 ? o.tree_depth : o.num_draft_tokens;
    const int64_t cap = o.tree_topk + (depth - 1) * static_cast<int64_t>(o.tree_topk) * o.tree_topk;
    EVAL_REQUIRE(o.num_draft_tokens <= cap, "--num-draft-tokens " << o.num_draft_tokens << " (the tree's nodes) exceeds "
                                                                  << cap << ", what --tree-topk " << o.tree_topk
                                                                  << " --tree-depth " << depth << " can hold");
    EVAL_REQUIRE(o.tree_depth <= o.num_draft_tokens,
                 "--tree-depth " << o.tree_depth << " exceeds --num-draft-tokens " << o.num_draft_tokens
                                 << " (a path holds at most every node)");
  }
  EVAL_REQUIRE(o.temperature > 0 || (o.top_p == 1.0 && o.sample_seed == 0),
               "--top-p and --sample-seed act only with --temperature > 0 (greedy decoding draws nothing)");
  EVAL_REQUIRE(o.device == "auto" || o.device == "cpu" || o.device == "cuda",
               "--device '" << o.device << "' is not auto, cpu or cuda");
  EVAL_REQUIRE(o.dtype == "auto" || o.dtype == "f32" || o.dtype == "bf16",
               "--dtype '" << o.dtype << "' is not auto, f32 or bf16");
  EVAL_REQUIRE(o.prompts_path.empty() != o.follow_path.empty(),
               (o.prompts_path.empty() ? "give --prompts (prompts to decode), or --follow (a prompt-ids file with "
                                         "the answers to follow)"
                                       : "--prompts and --follow exclude each other (--follow's file holds its prompts)"));
  const std::string& input = o.follow_path.empty() ? o.prompts_path : o.follow_path;
  AERIE_CHECK(fs::is_regular_file(input), "eval: " << (o.follow_path.empty() ? "--prompts " : "--follow ") << input
                                                   << (fs::exists(input) ? " is not a file" : ": no such file"));
  if (!o.follow_path.empty()) {
    EVAL_REQUIRE(run.run_dir.empty(), "--follow goes with --draft (one draft), not --run");
    EVAL_REQUIRE(o.temperature == 0 && o.tree_topk == 1,
                 "--follow measures greedy chains along the given answers: drop --temperature and --tree-topk");
    EVAL_REQUIRE(o.chat_template == "plain" && o.max_prompt_tokens == 0,
                 "--follow takes the prompts' ids as the file gives them: drop --chat-template and --max-prompt-tokens");
    try {
      read_prompt_ids_file(o.follow_path, o.num_prompts);  // names the line and field of a bad record
    } catch (const Error& e) {
      AERIE_THROW("eval: --follow " << e.what());
    }
  } else {
    try {
      read_prompts(o.prompts_path, o.num_prompts);  // names the line of a bad JSONL line, or no prompt at all
    } catch (const Error& e) {
      AERIE_THROW("eval: --prompts " << o.prompts_path << ": " << e.what());
    }
  }
  EVAL_REQUIRE(o.draft_path.empty() != run.run_dir.empty(),
               (o.draft_path.empty() ? "give --draft (one draft) or --run (every checkpoint of a training run)"
                                     : "--draft and --run exclude each other"));
  EVAL_REQUIRE(run.every >= 0, "--every " << run.every << " is negative (0: every checkpoint)");
  EVAL_REQUIRE(!run.run_dir.empty() || (run.every == 0 && run.steps.empty()), "--every and --steps need --run");
  EVAL_REQUIRE(run.every == 0 || run.steps.empty(), "--every and --steps exclude each other");
  if (!run.run_dir.empty()) {
    AERIE_CHECK(fs::is_directory(run.run_dir), "eval: --run " << run.run_dir << ": no such folder");
    AERIE_CHECK(!complete_checkpoints(run.run_dir).empty(),
                "eval: --run " << run.run_dir << " has no complete checkpoint (checkpoints/step-X with DONE): "
                               << "the --output folder of aerie train");
  }
  AERIE_CHECK(!run.run_dir.empty() || fs::exists(o.draft_path),
              "eval: --draft " << o.draft_path << ": no such file or folder");
  const bool is_export = fs::exists(fs::path(o.draft_path) / "model.safetensors") &&
                         fs::exists(fs::path(o.draft_path) / "config.json");
  if (run.run_dir.empty() && !is_export) {
    try {
      resolve_checkpoint(o.draft_path);
    } catch (const Error& e) {
      AERIE_THROW("eval: --draft " << o.draft_path << " is neither an export folder (config.json and "
                                   << "model.safetensors of aerie export) nor a complete checkpoint or run folder of "
                                   << "aerie train");
    }
  }
  if (o.chat_template != "plain") {
    try {
      find_chat_template(o.chat_template);
    } catch (const Error& e) {
      AERIE_THROW("eval: --chat-template " << o.chat_template << ": " << e.what());
    }
  }
  if (!o.data_split_path.empty()) {
    AERIE_CHECK(fs::is_regular_file(o.data_split_path),
                "eval: --data-split " << o.data_split_path
                                      << (fs::exists(o.data_split_path) ? " is not a file" : ": no such file")
                                      << " (RUN_DIR/data_split.json of aerie train)");
    try {  // small: the held-out sample ids and the shard names
      DataSplit::from_json(nlohmann::json::parse(read_file(o.data_split_path)));
    } catch (const std::exception& e) {
      AERIE_THROW("eval: --data-split " << o.data_split_path << " is not a data_split.json of aerie train: "
                                        << e.what());
    }
  }
  if (!o.shards_dir.empty())  // with --data-split too: a missing folder is named as such, not by a shard
    AERIE_CHECK(fs::is_directory(o.shards_dir) && !list_shards(o.shards_dir).empty(),
                "eval: --shards " << o.shards_dir
                                  << (fs::is_directory(o.shards_dir) ? " holds no shard-*.h5 files" : ": no such folder")
                                  << " (the --output folder of aerie extract)");
  if (!o.prompts_out.empty()) {
    EVAL_REQUIRE(run.run_dir.empty(), "--write-prompts goes with --draft (the prompts are the same for every "
                                      "checkpoint of --run: write them with one of them)");
    EVAL_REQUIRE(o.temperature == 0 && o.tree_topk == 1,
                 "--write-prompts records greedy answers for an engine's greedy chains: drop --temperature and "
                 "--tree-topk");
    check_prompts_out(o);
  }
  const std::string out = run.run_dir.empty() ? o.output_path : run.table_path;
  AERIE_CHECK(!fs::is_directory(out), "eval: --output " << out << " is a folder (a .json file is written)");
  // A file of another kind (a prepared file, a model's weights) is refused, not replaced when the job ends;
  // an earlier eval.json or checkpoint table (both carry aerie_version) is replaced or continued as before.
  const bool table = !run.run_dir.empty();
  check_output_replaceable("eval", out, table ? "a checkpoint table of aerie eval --run" : "an eval.json of aerie eval",
                           [table](const std::string& p) {
                             std::ifstream in(p);
                             const nlohmann::json j = nlohmann::json::parse(in);
                             const bool is_table = j.is_object() && j.value("format", "") == kCheckpointEvalFormat;
                             return j.is_object() && j.contains("aerie_version") && is_table == table;
                           });
  const fs::path parent = fs::path(out).parent_path();
  AERIE_CHECK(parent.empty() || fs::is_directory(parent),
              "eval: --output " << out << ": the folder " << parent.string() << " does not exist");
  // Last: the checks above name their inputs without reading the model. A missing folder, or a draft
  // export given as the target, is named with the option.
  load_model_option("eval", "model", o.model_dir);
}

/// "200,600,1000" -> {200, 600, 1000}. UsageError naming the item that is not a step number.
std::vector<int64_t> parse_steps(const std::string& text) {
  std::vector<int64_t> steps;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    const std::optional<int64_t> v = parse_int64(item);
    EVAL_REQUIRE(v && *v > 0,
                 "--steps " << text << ": '" << item << "' is not a positive step number (e.g. --steps 200,600,1000)");
    steps.push_back(*v);
  }
  EVAL_REQUIRE(!steps.empty(), "--steps is empty (e.g. --steps 200,600,1000)");
  return steps;
}

}  // namespace

int eval(const std::vector<std::string>& args) {
  EvalOptions o;
  po::options_description desc = job_options(
      "aerie eval: acceptance length of a draft (--draft), or of every checkpoint of a training run (--run: the "
      "checkpoint table that export --best chooses from)");
  CheckpointEvalOptions run;
  std::string steps;
  desc.add_options()("model", po::value<std::string>(&o.model_dir)->required(), "target model directory (Hugging Face)")(
      "draft", po::value<std::string>(&o.draft_path)->default_value(""),
      "draft export directory, or a training checkpoint / run directory (its newest checkpoint)")(
      "run", po::value<std::string>(&run.run_dir)->default_value(""),
      "instead of --draft: every complete checkpoint of this training run folder, one row each in the "
      "checkpoint table (RUN/checkpoint_eval.json, or --output; a rerun evaluates only the missing ones; "
      "aerie export --best exports the row of the highest acceptance length on --prompts: give prompts the "
      "draft was not trained on)")(
      "every", po::value<int64_t>(&run.every)->default_value(0),
      "with --run: only the checkpoints whose step is a multiple of N, and the newest (0: all)")(
      "steps", po::value<std::string>(&steps)->default_value(""),
      "with --run: only these checkpoint steps, e.g. 200,600,1000")(
      "prompts", po::value<std::string>(&o.prompts_path)->default_value(""),
      "prompts, the files generate --input takes: a .txt file of blank-line separated stories (the first "
      "sentence of each), or JSONL / a JSON array of plain prompts (MT-Bench \"turns\"[0], \"prompt\", \"text\", "
      "\"question\", \"instruction\") or ShareGPT / OpenAI conversations (the first user turn)")(
      "num-prompts", po::value<int64_t>(&o.num_prompts)->default_value(16), "number of prompts (0: all)")(
      "max-new-tokens", po::value<int64_t>(&o.max_new_tokens)->default_value(64), "new tokens per prompt")(
      "max-prompt-tokens", po::value<int64_t>(&o.max_prompt_tokens)->default_value(0),
      "cut plain prompts to their first N tokens; a longer chat prompt (--chat-template) is skipped, as a cut "
      "would lose its assistant header, and counted in prompts_too_long (0: whole)")(
      "chat-template", po::value<std::string>(&o.chat_template)->default_value("plain"),
      "how a prompt (one user turn) becomes token ids: the template of aerie prepare, with its generation "
      "prompt (the assistant header)")(
      "num-draft-tokens", po::value<int>(&o.num_draft_tokens)->default_value(7),
      "draft tokens per verification pass: the chain's length, or with --tree-topk the tree's nodes (SGLang's "
      "num_draft_tokens - 1: SGLang counts the verified last token too)")(
      "untrained", po::bool_switch(&o.untrained), "also evaluate the untrained draft (init weights, --seed)")(
      "seed", po::value<uint64_t>(&o.seed)->default_value(0), "init seed of the untrained draft (train's --seed)")(
      "temperature", po::value<double>(&o.temperature)->default_value(0.0),
      "0: greedy chains, checked against greedy decoding (lossless); > 0: speculative sampling with the "
      "standard rejection rule (output distributed as the target's sampling at this temperature)")(
      "top-p", po::value<double>(&o.top_p)->default_value(1.0), "nucleus mass of the sampling (with --temperature)")(
      "sample-seed", po::value<uint64_t>(&o.sample_seed)->default_value(0),
      "seed of the sampling draws (prompt i: a hash of this seed and i)")(
      "tree-topk", po::value<int>(&o.tree_topk)->default_value(1),
      "1: chains of --num-draft-tokens; K > 1: draft trees of --num-draft-tokens nodes, each node's top K "
      "children expanded from the K best nodes of each depth (EAGLE-2; SGLang's eagle_topk), verified in one "
      "target forward with a tree mask (greedy; GQA targets)")(
      "tree-depth", po::value<int>(&o.tree_depth)->default_value(0),
      "depth of the draft trees (SGLang's num_steps; 0: --num-draft-tokens)")(
      "shards", po::value<std::string>(&o.shards_dir)->default_value(""),
      "extraction shards for the teacher-forced metrics")(
      "data-split", po::value<std::string>(&o.data_split_path)->default_value(""),
      "RUN_DIR/data_split.json of training: teacher-forced metrics on its held-out samples")(
      "num-eval-samples", po::value<int64_t>(&o.num_eval_samples)->default_value(64),
      "at most this many teacher-forced samples (0: all)")(
      "ttt-steps", po::value<int>(&o.ttt_steps)->default_value(7), "TTT steps of the teacher-forced metrics")(
      "tp", po::value<int>(&o.tp)->default_value(1), "tensor parallel size of the target")(
      "expert-parallel", po::bool_switch(&o.expert_parallel),
      "MoE targets: the routed experts split over the --tp ranks by expert (1/tp of them whole per rank) "
      "instead of every expert by its intermediate size: the same results up to the order of fp32 sums; tp "
      "must divide n_routed_experts")(
      "fp8-gemm", po::bool_switch(&o.fp8_gemm),
      "verify with the target's linears as W8A8 block-FP8 GEMMs (as extract --fp8-gemm; as vLLM and SGLang "
      "serve block-FP8 checkpoints): the acceptance length against the target as such an engine serves it")(
      "device", po::value<std::string>(&o.device)->default_value("auto"),
      "auto (cuda when every rank of the node has a GPU), cpu or cuda: where the target and the draft run")(
      "dtype", po::value<std::string>(&o.dtype)->default_value("f32"),
      "compute dtype of the target: f32 (the reference: greedy equality is exact), bf16, or auto (bf16 on "
      "cuda, f32 on cpu, as extract); the draft computes in f32")(
      "output", po::value<std::string>(&o.output_path)->default_value("eval.json"),
      "eval.json path; with --run the checkpoint table's (default RUN/checkpoint_eval.json)")(
      "write-prompts", po::value<std::string>(&o.prompts_out)->default_value(""),
      "also write FILE.jsonl: each evaluated prompt's token ids, stop ids and greedy answer, what "
      "tools/engine_eval feeds vLLM or SGLang to measure the same prompts there (docs/formats.md)")(
      "follow", po::value<std::string>(&o.follow_path)->default_value(""),
      "instead of --prompts: a prompt-ids file (--write-prompts's format; tools/engine_eval --write-answers "
      "writes one with an engine's answers): its prompts, each speculative run following the record's "
      "greedy_ids instead of this target's argmaxes, so that the acceptance length is measured along the "
      "engine's text where its target parts from this one (no lossless check or speed-up; eval.json's "
      "own_greedy_agreement and own_first_difference say where this target parts)");
  add_lock_options(desc);
  po::variables_map vm;
  if (!parse_options("eval", args, desc, vm)) return 0;
  if (!steps.empty()) run.steps = parse_steps(steps);
  o.output_path = follow_output_link("eval", o.output_path);
  if (!o.prompts_out.empty()) o.prompts_out = follow_output_link("eval", o.prompts_out, /*log=*/false);
  if (!run.run_dir.empty())
    run.table_path = vm["output"].defaulted() ? follow_output_link("eval", checkpoint_eval_path(run.run_dir))
                                              : o.output_path;
  // A refused input ends every rank with its message once (not each rank's line and MPI_Abort's banner); a usage
  // error (exit 2) stays one: every rank parsed the same arguments and fails alike.
  std::optional<UsageError> usage;
  MpiCommunicator world(MPI_COMM_WORLD, false);
  agree_on_refusal(world, "eval", [&] {
    try {
      check_eval_inputs(o, run);
    } catch (const UsageError& e) {
      usage = e;
    }
  });
  if (usage) throw *usage;
  if (run.run_dir.empty()) {
    // OUTPUT.lock: a second eval into the same eval.json is refused while this one runs.
    const OutputLock lock =
        o.output_path.empty() ? OutputLock() : lock_output(vm, "eval", o.output_path, LockTarget::File);
    // PROMPTS.lock likewise for --write-prompts (two evals with other --output into one prompt-ids file).
    const OutputLock prompts_lock =
        o.prompts_out.empty() ? OutputLock() : lock_output(vm, "eval", o.prompts_out, LockTarget::File);
    run_eval(o);
    return 0;
  }
  // TABLE.lock: a second eval --run into the same table is refused while this one runs (a train still
  // writing checkpoints into the run is not: its lock is RUN/.aerie.lock).
  const OutputLock lock = lock_output(vm, "eval", run.table_path, LockTarget::File);
  run_checkpoint_eval(o, run);
  return 0;
}

}  // namespace aerie::jobs
