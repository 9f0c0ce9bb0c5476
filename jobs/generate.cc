// aerie generate: decoding with the target alone (no draft), tensor parallel over --tp ranks. Two modes:
//
// One prompt (the baseline that speculative decoding must reproduce token for token, eagle3.md section 6):
//   mpirun -np 1 aerie generate --model build/models/stories260K --prompt "" --max-new 256
// prints, on world rank 0, the decoded continuation (the prompt is not repeated). Every data-parallel
// replica (world size / tp of them) computes the same thing; only rank 0 prints. Greedy unless --temperature.
//
// Regeneration (--input): the assistant turns of a conversation set (ShareGPT / OpenAI messages, JSONL or a
// JSON array) replaced by the target's own responses, written as JSONL in the input's format. --input takes
// what `aerie eval --prompts` takes (data/prompt_input.h): plain prompts are read as conversations (MT-Bench
// "turns": user turns, each answered in turn; "prompt" / "text" / "question" / "instruction": one user turn;
// a .txt file: the first sentence of each story) and written in OpenAI "messages" form:
//   mpirun -np R aerie generate --model DIR --input convs.jsonl --output regen.jsonl --template chatml
//          [--temperature 0.7 --top-p 0.9 --max-new-tokens 512 --seed 0 --tp 1]
// R/tp groups take chunks of conversations from rank 0 (data parallel, like extract); a rerun after a kill
// or a signal (SIGTERM/SIGINT/SIGUSR1: exit 3 after the chunks in hand) does only the missing chunks. The
// work, the output and the resume rules: src/data/regenerate.h. Each group decodes up to --batch-size
// responses at once (model/sampling.h BatchDecoder: one KV cache per sequence, continuous batching: a
// finished sequence's slot is refilled at the next step). Sampling: src/model/sampling.h (the RNG of
// response k of conversation i is seeded by (seed, i, k), so the draws depend neither on R nor on the
// batch size; the logits can, in their last bits: docs/preparing-data.md, Reproducible). --device / --dtype as for extract (jobs/target_device.h): on CUDA one GPU per rank, tp
// over NCCL.
#include <algorithm>
#include <cmath>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "core/error.h"
#include "core/log.h"
#include "core/stop_signals.h"
#include "data/chat_templates.h"
#include "data/prepare_template.h"
#include "data/regenerate.h"
#include "data/shard.h"
#include "io/fingerprint.h"
#include "jobs/jobs.h"
#include "jobs/target_device.h"
#include "model/target.h"
#include "model/sampling.h"
#include "tokenizer/tokenizer.h"

namespace aerie::jobs {

namespace {

void add_ids(const nlohmann::json& j, std::vector<int32_t>& out) {
  if (j.is_array()) {
    for (auto& e : j)
      if (e.is_number_integer()) out.push_back(e.get<int32_t>());
  } else if (j.is_number_integer()) {
    out.push_back(j.get<int32_t>());
  }
}

// The ids that end a response: --stop-id if given; else the eos_token_id(s) of config.json and
// generation_config.json, the tokenizer's EOS, and BOS (a BOS inside a text starts a new document, as in
// llama2.c's run.c). Plus the ids of --stop-token strings.
std::vector<int32_t> stop_ids(const po::variables_map& vm, const std::string& dir, const TargetConfig& cfg,
                              const Tokenizer& tok, int32_t bos) {
  std::vector<int32_t> stop;
  if (vm.count("stop-id")) {
    stop = vm["stop-id"].as<std::vector<int32_t>>();
  } else {
    if (cfg.raw.contains("eos_token_id")) add_ids(cfg.raw["eos_token_id"], stop);
    else if (cfg.eos_token_id >= 0) stop.push_back(static_cast<int32_t>(cfg.eos_token_id));
    const auto gen_path = std::filesystem::path(dir) / "generation_config.json";
    if (std::filesystem::exists(gen_path)) {
      std::ifstream in(gen_path);
      nlohmann::json g = nlohmann::json::parse(in, nullptr, false);
      if (!g.is_discarded() && g.contains("eos_token_id")) add_ids(g["eos_token_id"], stop);
    }
    if (tok.eos_id() >= 0) stop.push_back(tok.eos_id());
    if (bos >= 0) stop.push_back(bos);
  }
  if (vm.count("stop-token")) {
    for (const std::string& s : vm["stop-token"].as<std::vector<std::string>>()) {
      int32_t id = tok.token_to_id(s);
      AERIE_CHECK(id >= 0, "aerie generate: --stop-token '" << s << "' is not a token of " << dir);
      stop.push_back(id);
    }
  }
  std::sort(stop.begin(), stop.end());
  stop.erase(std::unique(stop.begin(), stop.end()), stop.end());
  return stop;
}

int regenerate(const po::variables_map& vm, ParallelGroups& groups, TargetModel& model, const Tokenizer& tok,
               const std::string& dir, const std::vector<int32_t>& stop_default, const SamplingParams& sp,
               int64_t max_new) {
  AERIE_CHECK(vm.count("output"), "aerie generate: --input needs --output (a JSONL file)");
  const TargetConfig& cfg = model.config();
  RegenerateOptions opt;
  opt.input = vm["input"].as<std::string>();
  opt.output = follow_output_link("aerie generate", vm["output"].as<std::string>());
  opt.format = input_format_from_name(vm["format"].as<std::string>());
  opt.params.max_new_tokens = max_new;
  int64_t max_length = vm["max-length"].as<int64_t>();
  if (max_length <= 0) max_length = cfg.max_position_embeddings > 0 ? cfg.max_position_embeddings : 2048;
  AERIE_CHECK(cfg.max_position_embeddings <= 0 || max_length <= cfg.max_position_embeddings,
              "aerie generate: --max-length " << max_length << " exceeds the model's max_position_embeddings "
                                              << cfg.max_position_embeddings);
  opt.params.max_length = max_length;
  opt.conversations_per_chunk = vm["conversations-per-chunk"].as<int64_t>();
  opt.max_conversations = vm["max-conversations"].as<int64_t>();
  const std::string template_name = vm["template"].as<std::string>();
  const uint64_t seed = vm["seed"].as<uint64_t>();
  nlohmann::json signature = {{"model", std::filesystem::weakly_canonical(dir).string()},
                               {"template", template_name},
                               {"temperature", sp.temperature},
                               {"top_p", sp.top_p},
                               {"seed", seed}};
  // Only when set, so that the run.json of an earlier run without the option still matches.
  if (vm["fp8-gemm"].as<bool>()) signature["fp8_gemm"] = fp8_gemm_tag(vm["tp"].as<int>());
  // What else decides the answers (a resume must not mix two): the target's config and weights (sampled
  // fingerprint, io/fingerprint.h: a model replaced in place), the compute dtype, and every byte of the input
  // (an edited file of the same record count). Rank 0 alone writes and compares run.json.
  const TargetFingerprint fp = fingerprint_target(dir, -1);
  signature["target_config_sha256"] = fp.config_sha256;
  signature["target_weights_sha256"] = fp.weights_sha256;
  signature["dtype"] = model.dtype() == DType::BF16 ? "bf16" : "f32";  // as --dtype spells it
  if (groups.map.world_rank == 0) signature["input_sha256"] = sha256_file(opt.input);
  opt.run_signature = signature.dump();
  std::unique_ptr<ChatTemplate> tmpl = make_chat_template(template_name, tok);
  // The template's end of turn (e.g. <|im_end|>) ends a response too, unless --stop-id replaced the defaults.
  std::vector<int32_t> stop = stop_default;
  if (const auto* ct = dynamic_cast<const ConfigChatTemplate*>(tmpl.get()); ct && !vm.count("stop-id")) {
    const int32_t eot = ct->spec().eot.empty() ? -1 : tok.token_to_id(ct->spec().eot);
    if (eot >= 0 && std::find(stop.begin(), stop.end(), eot) == stop.end()) stop.push_back(eot);
  }
  opt.params.stop_ids = stop;
  if (groups.map.world_rank == 0) {
    AERIE_LOG(info) << "generate: regenerating " << opt.input << " -> " << opt.output << " with " << dir
                    << ", template " << template_name << ", temperature " << sp.temperature << ", top-p "
                    << sp.top_p << ", seed " << seed << ", up to " << max_new << " new tokens per turn, max length "
                    << max_length << ", " << stop.size() << " stop id(s), tp " << groups.map.tp << ", batch "
                    << vm["batch-size"].as<int64_t>() << " on " << device_name(model.device()) << " in "
                    << dtype_name(model.dtype());
  }
  const int64_t batch_size = vm["batch-size"].as<int64_t>();
  AERIE_CHECK(batch_size >= 1, "aerie generate: --batch-size must be >= 1, got " << batch_size);
  BatchDecoder decoder(model, batch_size, stop, sp);
  ResponseEngine engine;
  engine.batch_size = batch_size;
  engine.submit = [&](int64_t key, const ResponseRequest& r) {
    SampleRng rng(sequence_seed(sequence_seed(seed, static_cast<uint64_t>(r.conversation)), static_cast<uint64_t>(r.turn)));
    decoder.submit(key, r.prompt, r.max_new, rng);
  };
  engine.step = [&] {
    std::vector<ResponseResult> out;
    for (BatchDecoder::Finished& f : decoder.step()) out.push_back({f.key, std::move(f.ids)});
    return out;
  };
  StopSignals stop_signals;
  opt.stop_requested = [] { return StopSignals::received() != 0; };
  RegenerateStats stats = run_regenerate(opt, groups, *tmpl, tok, engine);
  if (!stats.complete) {
    if (groups.map.world_rank == 0) {
      AERIE_LOG(warning) << "generate: stopped with " << stats.chunks_skipped + stats.chunks_done << " of "
                         << stats.chunks << " chunks complete; rerun the same command to finish";
    }
    return kPreemptedExitCode;
  }
  if (stats.conversations == 0 && stats.dropped > 0) {  // every record of this run was dropped
    if (groups.map.world_rank == 0) {
      AERIE_LOG(error) << "generate: all " << stats.dropped << " records of --input " << opt.input
                       << " were dropped (reasons in the line above); " << opt.output << " holds no conversation";
    }
    return 1;
  }
  return 0;
}

/// A bad option value: aerie::UsageError (exit status 2) prefixed with the job.
#define GENERATE_REQUIRE(cond, msg) AERIE_USAGE_CHECK(cond, "aerie generate: " << msg)

/// The checks of the regeneration mode that need no model, before the target loads (minutes for a large
/// checkpoint): option values (UsageError, exit 2), the --input file, an --output that is not a folder, and
/// the --template file (aerie::Error naming the option and path).
void check_regenerate_inputs(const po::variables_map& vm) {
  namespace fs = std::filesystem;
  GENERATE_REQUIRE(vm.count("output"), "--input needs --output (a JSONL file)");
  const int64_t batch_size = vm["batch-size"].as<int64_t>();
  GENERATE_REQUIRE(batch_size >= 1, "--batch-size must be >= 1, got " << batch_size);
  const int64_t per_chunk = vm["conversations-per-chunk"].as<int64_t>();
  GENERATE_REQUIRE(per_chunk >= 1, "--conversations-per-chunk must be >= 1, got " << per_chunk);
  const int64_t max_length = vm["max-length"].as<int64_t>();
  GENERATE_REQUIRE(max_length >= 0, "--max-length " << max_length << " is negative (0: the model's maximum)");
  const int64_t max_conv = vm["max-conversations"].as<int64_t>();
  GENERATE_REQUIRE(max_conv >= -1, "--max-conversations " << max_conv << " is negative (-1: all)");
  GENERATE_REQUIRE(max_conv != 0, "--max-conversations 0 leaves no record to generate (-1: all records)");
  const std::string format = vm["format"].as<std::string>();
  GENERATE_REQUIRE(format == "auto" || format == "sharegpt" || format == "openai" || format == "text",
                   "--format '" << format << "' is not auto, sharegpt, openai or text");
  const std::string input = vm["input"].as<std::string>();
  const std::string output = follow_output_link("aerie generate", vm["output"].as<std::string>(), false);
  AERIE_CHECK(fs::is_regular_file(input),
              "aerie generate: --input " << input << (fs::exists(input) ? " is not a file" : ": no such file"));
  AERIE_CHECK(fs::file_size(input) > 0, "aerie generate: --input " << input << " is empty: no record to generate");
  AERIE_CHECK(!fs::is_directory(output),
              "aerie generate: --output " << output << " is a folder (a JSONL file is written)");
  AERIE_CHECK(!fs::exists(output) || !fs::equivalent(input, output),
              "aerie generate: --output " << output << " is the --input file; name another file");
  // Anything but generate's own output is refused, not replaced when the job ends: a prepared file, a
  // model's weights, and a JSONL dataset (say the training conversations). Its own: OUTPUT.parts/run.json
  // of a run (a rerun continues or refuses it), or records whose answers carry aerie_response_ids.
  check_output_replaceable(
      "aerie generate", output, "an output of aerie generate (answers with aerie_response_ids)",
      [&output](const std::string& p) {
        if (fs::exists(fs::path(output + ".parts") / "run.json")) return true;
        std::ifstream in(p);
        std::string line;
        if (!std::getline(in, line)) return true;  // empty
        const nlohmann::json r = nlohmann::json::parse(line);
        for (const char* key : {"conversations", "messages"})
          if (r.is_object() && r.contains(key) && r[key].is_array())
            for (const auto& turn : r[key])
              if (turn.is_object() && turn.contains("aerie_response_ids")) return true;
        return false;
      });
  const std::string template_name = vm["template"].as<std::string>();
  if (template_name != "plain") {
    try {
      find_chat_template(template_name);
    } catch (const Error& e) {
      AERIE_THROW("aerie generate: --template " << template_name << ": " << e.what());
    }
  }
}

}  // namespace

int generate(const std::vector<std::string>& args) {
  po::options_description desc = job_options("aerie generate: generation with the target (one prompt, or regeneration of a "
                               "conversation set / answers to a prompt set with --input)");
  desc.add_options()("model", po::value<std::string>()->required(),
                     "Hugging Face model directory (config.json, model.safetensors, tokenizer.json)")(
      "prompt", po::value<std::string>()->default_value(""), "one-prompt mode: prompt text (BOS is prepended)")(
      "max-new", po::value<int64_t>()->default_value(256), "maximum number of new tokens (per response)")(
      "max-new-tokens", po::value<int64_t>(), "the same as --max-new")(
      "tp", po::value<int>()->default_value(1), "tensor parallel size (divides the world size)")(
      "temperature", po::value<double>()->default_value(0.0), "sampling temperature; 0 = greedy")(
      "top-p", po::value<double>()->default_value(1.0), "nucleus sampling mass in (0, 1]")(
      "seed", po::value<uint64_t>()->default_value(0), "sampling seed (response k of conversation i: seed, i, k)")(
      "stop-id", po::value<std::vector<int32_t>>()->multitoken(),
      "token ids that end the generation (default: the eos_token_id of config.json and generation_config.json, "
      "the tokenizer's EOS, and BOS: a BOS inside a text starts a new document, as in llama2.c's run.c)")(
      "stop-token", po::value<std::vector<std::string>>()->multitoken(),
      "token strings that also end it (e.g. \"<|eot_id|>\")")(
      "input", po::value<std::string>(),
      "regeneration mode: conversations or prompts, the files eval --prompts takes: JSONL or a JSON array of "
      "ShareGPT / OpenAI conversations (the assistant turns are regenerated; one ending with a user turn gets "
      "an answer appended) or plain prompts, each read as a conversation: MT-Bench \"turns\" (user turns, each "
      "answered), \"prompt\", \"text\", \"question\" or \"instruction\" (+ Alpaca's \"input\"), optional \"system\"; "
      "or a .txt file of blank-line separated stories (the first sentence of each). Plain prompts are written "
      "as their other keys + OpenAI \"messages\"")(
      "output", po::value<std::string>(), "regeneration mode: output JSONL (chunks in OUTPUT.parts/)")(
      "format", po::value<std::string>()->default_value("auto"),
      "input format: auto (conversations and plain prompts by key; .txt: stories), sharegpt, openai (only "
      "conversations of that form), text (stories, whatever the name)")(
      "template", po::value<std::string>()->default_value("plain"), "chat template that renders the prompts")(
      "max-length", po::value<int64_t>()->default_value(0),
      "prompt + response tokens of one turn (0: the model's max_position_embeddings); a turn whose prompt "
      "leaves no room ends the conversation after the previous answer")(
      "conversations-per-chunk", po::value<int64_t>()->default_value(16), "input records per chunk (unit of work)")(
      "max-conversations", po::value<int64_t>()->default_value(-1), "use only the first N input records")(
      "batch-size", po::value<int64_t>()->default_value(16),
      "regeneration mode: responses decoded together per tp group (continuous batching; the random draws do "
      "not depend on it, the GEMMs' last bits can, which flips a rare sampled token near a tie)");
  add_target_device_options(desc);
  add_lock_options(desc);
  po::variables_map vm;
  if (!parse_options("generate", args, desc, vm)) return 0;
  const std::string dir = vm["model"].as<std::string>();
  AERIE_CHECK(!(vm.count("max-new-tokens") && !vm["max-new"].defaulted()),
              "aerie generate: give --max-new or --max-new-tokens, not both");
  const int64_t max_new = vm.count("max-new-tokens") ? vm["max-new-tokens"].as<int64_t>() : vm["max-new"].as<int64_t>();
  GENERATE_REQUIRE(max_new >= 1, "--max-new must be >= 1 (new tokens per answer), got " << max_new);
  SamplingParams sp{vm["temperature"].as<double>(), vm["top-p"].as<double>()};
  GENERATE_REQUIRE(std::isfinite(sp.temperature) && sp.temperature >= 0,
                   "--temperature must be >= 0 (0: greedy), got " << sp.temperature);
  GENERATE_REQUIRE(sp.top_p > 0 && sp.top_p <= 1, "--top-p must lie in (0, 1], got " << sp.top_p);
  GENERATE_REQUIRE(sp.temperature > 0 || vm["top-p"].defaulted(),
                   "--top-p acts only with --temperature > 0 (greedy decoding draws nothing), as in eval");
  check_sampling_params(sp);
  if (vm.count("input")) check_regenerate_inputs(vm);
  // Regeneration writes OUTPUT and OUTPUT.parts/: locked (OUTPUT.lock) before the target loads; OUTPUT a
  // symbolic link's target, where the job writes (no LINK.lock beside the link).
  const OutputLock lock =
      vm.count("input") ? lock_output(vm, "generate",
                                      follow_output_link("aerie generate", vm["output"].as<std::string>(), false),
                                      LockTarget::File)
                        : OutputLock();

  ParallelGroups groups = ParallelGroups::create(vm["tp"].as<int>());
  TargetDevice target = resolve_target_device(vm, groups, "generate");
  // config.json and the tokenizer first: a bad --stop-token is reported before the weights load.
  const TargetConfig cfg = load_model_option("generate", "model", dir);
  auto tok = Tokenizer::load(dir);
  const int32_t bos = tok->bos_id() >= 0 ? tok->bos_id() : static_cast<int32_t>(cfg.bos_token_id);
  const std::vector<int32_t> stop = stop_ids(vm, dir, cfg, *tok, bos);
  if (vm.count("stop-id"))
    for (int32_t id : vm["stop-id"].as<std::vector<int32_t>>())
      GENERATE_REQUIRE(id >= 0 && id < cfg.vocab_size, "--stop-id " << id << " is not a token id of " << dir
                                                                    << " (vocab_size " << cfg.vocab_size
                                                                    << "): it could never end a response");
  TargetModel model(dir, *target.tp, target.options);
  if (vm.count("input")) {
    const int rc = regenerate(vm, groups, model, *tok, dir, stop, sp, max_new);
    if (model.device() == Device::CUDA) log_gpu_memory("generate", groups.map.world_rank);
    return rc;
  }

  std::vector<int32_t> prompt;
  if (bos >= 0) prompt.push_back(bos);
  for (int32_t id : tok->encode(vm["prompt"].as<std::string>())) prompt.push_back(id);
  AERIE_CHECK(!prompt.empty(), "aerie generate: empty prompt and the tokenizer has no BOS");
  // The target's context: prompt + new tokens stay within max_position_embeddings.
  const int64_t positions = model.config().max_position_embeddings;
  int64_t max_new_here = max_new;
  if (positions > 0) {
    AERIE_CHECK(static_cast<int64_t>(prompt.size()) < positions,
                "aerie generate: the prompt has " << prompt.size() << " tokens, the model's max_position_embeddings is "
                                                  << positions);
    if (static_cast<int64_t>(prompt.size()) + max_new > positions) {
      max_new_here = positions - static_cast<int64_t>(prompt.size());
      if (groups.map.world_rank == 0)
        AERIE_LOG(warning) << "generate: --max-new " << max_new << " cut to " << max_new_here << ": the prompt's "
                           << prompt.size() << " tokens + new tokens stop at max_position_embeddings " << positions;
    }
  }

  AERIE_LOG(info) << "generate: " << prompt.size() << " prompt tokens, up to " << max_new_here << " new, tp "
                  << groups.map.tp << ", model " << dir;
  auto t0 = std::chrono::steady_clock::now();
  std::vector<int32_t> generated;
  if (sp.temperature == 0) {
    std::vector<int32_t> ids = greedy_generate(model, prompt, max_new_here, stop);
    generated.assign(ids.begin() + static_cast<int64_t>(prompt.size()), ids.end());
  } else {
    SampleRng rng(sequence_seed(vm["seed"].as<uint64_t>(), 0));
    generated = sample_generate(model, prompt, max_new_here, stop, sp, rng);
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int64_t n_new = static_cast<int64_t>(generated.size());
  if (!generated.empty() && std::find(stop.begin(), stop.end(), generated.back()) != stop.end())
    generated.pop_back();  // the stop token is not text
  if (groups.map.world_rank == 0) {
    // Decode prompt + continuation and print what follows the prompt's text, so that the first
    // generated piece keeps its leading space (decode strips it from the first piece of a text).
    std::vector<int32_t> prompt_text(prompt.begin() + (bos >= 0 ? 1 : 0), prompt.end());
    std::vector<int32_t> all = prompt_text;
    all.insert(all.end(), generated.begin(), generated.end());
    const std::string full = tok->decode(all), head = tok->decode(prompt_text);
    std::cout << (full.rfind(head, 0) == 0 ? full.substr(head.size()) : tok->decode(generated)) << std::endl;
    AERIE_LOG(info) << "generate: " << n_new << " tokens in " << secs << " s ("
                    << (secs > 0 ? n_new / secs : 0.0) << " tokens/s)";
  }
  return 0;
}

}  // namespace aerie::jobs
