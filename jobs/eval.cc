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
// --device auto|cpu|cuda: on CUDA each rank uses GPU local_rank() (tp groups over NCCL), the target in
// --dtype f32|bf16|auto (default f32), the draft in f32.
// --draft: an export directory (config.json + model.safetensors) or a training checkpoint / run directory.
// --untrained: the same figures for the draft training started from (init_draft_weights, --seed).
// Teacher-forced metrics: on --data-split's held-out samples (RUN_DIR/data_split.json), or on all samples
// of --shards, or (neither given) on the target's greedy continuations of the prompts.
#include "jobs/jobs.h"
#include "train/eval.h"

namespace aerie::jobs {

int eval(const std::vector<std::string>& args) {
  EvalOptions o;
  po::options_description desc("aerie eval: acceptance length of a draft");
  desc.add_options()("model", po::value<std::string>(&o.model_dir)->required(), "target model directory (Hugging Face)")(
      "draft", po::value<std::string>(&o.draft_path)->required(),
      "draft export directory, or a training checkpoint / run directory")(
      "prompts", po::value<std::string>(&o.prompts_path)->required(),
      "prompts: .txt stories (first sentence) or JSONL (turns[0], prompt, text, ShareGPT/OpenAI first user turn)")(
      "num-prompts", po::value<int64_t>(&o.num_prompts)->default_value(16), "number of prompts (0: all)")(
      "max-new-tokens", po::value<int64_t>(&o.max_new_tokens)->default_value(64), "new tokens per prompt")(
      "max-prompt-tokens", po::value<int64_t>(&o.max_prompt_tokens)->default_value(0),
      "cut prompts to their first N tokens (0: whole)")(
      "chat-template", po::value<std::string>(&o.chat_template)->default_value("plain"),
      "how a prompt (one user turn) becomes token ids: the template of aerie prepare, with its generation "
      "prompt (the assistant header)")(
      "num-draft-tokens", po::value<int>(&o.num_draft_tokens)->default_value(7), "draft chain length n per cycle")(
      "untrained", po::bool_switch(&o.untrained), "also evaluate the untrained draft (init weights, --seed)")(
      "seed", po::value<uint64_t>(&o.seed)->default_value(0), "init seed of the untrained draft (train's --seed)")(
      "shards", po::value<std::string>(&o.shards_dir)->default_value(""),
      "extraction shards for the teacher-forced metrics")(
      "data-split", po::value<std::string>(&o.data_split_path)->default_value(""),
      "RUN_DIR/data_split.json of training: teacher-forced metrics on its held-out samples")(
      "num-eval-samples", po::value<int64_t>(&o.num_eval_samples)->default_value(64),
      "at most this many teacher-forced samples (0: all)")(
      "ttt-steps", po::value<int>(&o.ttt_steps)->default_value(7), "TTT steps of the teacher-forced metrics")(
      "tp", po::value<int>(&o.tp)->default_value(1), "tensor parallel size of the target")(
      "device", po::value<std::string>(&o.device)->default_value("auto"),
      "auto (cuda when every rank of the node has a GPU), cpu or cuda: where the target and the draft run")(
      "dtype", po::value<std::string>(&o.dtype)->default_value("f32"),
      "compute dtype of the target: f32 (the reference: greedy equality is exact), bf16, or auto (bf16 on "
      "cuda, f32 on cpu, as extract); the draft computes in f32")(
      "output", po::value<std::string>(&o.output_path)->default_value("eval.json"), "eval.json path");
  po::variables_map vm;
  if (!parse_options("eval", args, desc, vm)) return 0;
  run_eval(o);
  return 0;
}

}  // namespace aerie::jobs
