// aerie generate: greedy decoding with the target alone (no draft), tensor parallel over --tp ranks.
// The baseline that speculative decoding must reproduce token for token (eagle3.md section 6).
//
//   mpirun -np 1 aerie generate --model build/models/stories260K --prompt "" --max-new 256
//
// prints, on world rank 0, the decoded continuation (the prompt is not repeated). Every data-parallel
// replica (world size / tp of them) computes the same thing; only rank 0 prints.
#include <algorithm>
#include <chrono>
#include <iostream>

#include "comm/communicator.h"
#include "core/error.h"
#include "core/log.h"
#include "jobs/jobs.h"
#include "model/llama.h"
#include "tokenizer/tokenizer.h"

namespace aerie::jobs {

int generate(const std::vector<std::string>& args) {
  po::options_description desc("aerie generate: greedy generation with the target");
  desc.add_options()("model", po::value<std::string>()->required(),
                     "Hugging Face model directory (config.json, model.safetensors, tokenizer.json)")(
      "prompt", po::value<std::string>()->default_value(""), "prompt text (BOS is prepended)")(
      "max-new", po::value<int64_t>()->default_value(256), "maximum number of new tokens")(
      "tp", po::value<int>()->default_value(1), "tensor parallel size (divides the world size)")(
      "stop-id", po::value<std::vector<int32_t>>()->multitoken(),
      "token ids that end the generation (default: the config's eos_token_id and the BOS id; a BOS "
      "inside a text starts a new document, as in llama2.c's run.c)");
  po::variables_map vm;
  if (!parse_options("generate", args, desc, vm)) return 0;
  const std::string dir = vm["model"].as<std::string>();
  const int64_t max_new = vm["max-new"].as<int64_t>();
  AERIE_CHECK(max_new >= 0, "aerie generate: --max-new must be >= 0, got " << max_new);

  ParallelGroups groups = ParallelGroups::create(vm["tp"].as<int>());
  LlamaModel model(dir, *groups.tp);
  auto tok = Tokenizer::load(dir);
  const LlamaConfig& cfg = model.config();

  std::vector<int32_t> prompt;
  int32_t bos = tok->bos_id() >= 0 ? tok->bos_id() : static_cast<int32_t>(cfg.bos_token_id);
  if (bos >= 0) prompt.push_back(bos);
  for (int32_t id : tok->encode(vm["prompt"].as<std::string>())) prompt.push_back(id);
  AERIE_CHECK(!prompt.empty(), "aerie generate: empty prompt and the tokenizer has no BOS");

  std::vector<int32_t> stop;
  if (vm.count("stop-id")) {
    stop = vm["stop-id"].as<std::vector<int32_t>>();
  } else {
    if (cfg.raw.contains("eos_token_id") && cfg.raw["eos_token_id"].is_array()) {
      for (auto& e : cfg.raw["eos_token_id"]) stop.push_back(e.get<int32_t>());
    } else if (cfg.eos_token_id >= 0) {
      stop.push_back(static_cast<int32_t>(cfg.eos_token_id));
    }
    if (tok->eos_id() >= 0) stop.push_back(tok->eos_id());
    if (bos >= 0) stop.push_back(bos);
  }

  AERIE_LOG(info) << "generate: " << prompt.size() << " prompt tokens, up to " << max_new << " new, tp "
                  << groups.map.tp << ", model " << dir;
  auto t0 = std::chrono::steady_clock::now();
  std::vector<int32_t> ids = greedy_generate(model, prompt, max_new, stop);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<int32_t> generated(ids.begin() + static_cast<int64_t>(prompt.size()), ids.end());
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
