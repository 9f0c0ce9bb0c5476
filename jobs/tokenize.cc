// aerie tokenize: the token ids of a text, with the tokenizer of a Hugging Face model folder.
//
//   echo -n "Hello world" | aerie tokenize --tokenizer DIR [--offsets] [--bos]
//
// The whole of stdin is one string (newlines included; nothing is stripped). Prints on world rank 0 one
// line of space-separated ids: encode(text), i.e. Hugging Face's encode(text, add_special_tokens=False),
// without BOS unless --bos (then the tokenizer's BOS, if it has one, comes first). With --offsets a
// second line holds, per id, "begin:end", the byte range [begin, end) of stdin it stands for (BOS: 0:0).
#include <mpi.h>

#include <iostream>
#include <iterator>

#include "jobs/jobs.h"
#include "tokenizer/tokenizer.h"

namespace aerie::jobs {

int tokenize(const std::vector<std::string>& args) {
  po::options_description desc = job_options("aerie tokenize: text on stdin -> token ids on stdout");
  desc.add_options()("tokenizer", po::value<std::string>()->required(), "directory with tokenizer.json or tiktoken.model (or the file)")(
      "offsets", po::bool_switch(), "also print the byte offsets of every token (a second line)")(
      "bos", po::bool_switch(), "put the tokenizer's BOS first (encode() itself never adds it)");
  po::variables_map vm;
  if (!parse_options("tokenize", args, desc, vm)) return 0;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) return 0;
  auto tok = Tokenizer::load(vm["tokenizer"].as<std::string>());
  const std::string text((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  Encoding enc = tok->encode_with_offsets(text);
  if (vm["bos"].as<bool>() && tok->bos_id() >= 0) {
    enc.ids.insert(enc.ids.begin(), tok->bos_id());
    enc.offsets.insert(enc.offsets.begin(), {0, 0});
  }
  std::string line;
  for (size_t k = 0; k < enc.ids.size(); ++k) line.append(k ? " " : "").append(std::to_string(enc.ids[k]));
  std::cout << line << "\n";
  if (vm["offsets"].as<bool>()) {
    line.clear();
    for (size_t k = 0; k < enc.offsets.size(); ++k)
      line.append(k ? " " : "").append(std::to_string(enc.offsets[k].first)).append(":").append(
          std::to_string(enc.offsets[k].second));
    std::cout << line << "\n";
  }
  std::cout.flush();
  return 0;
}

}  // namespace aerie::jobs
