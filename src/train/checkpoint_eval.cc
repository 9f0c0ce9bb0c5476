// The checkpoint table of a run (train/checkpoint_eval.h): its file, the checkpoint selection, the choice
// of the best checkpoint and `aerie eval --run`.
#include "train/checkpoint_eval.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#include "comm/communicator.h"
#include "core/error.h"
#include "core/log.h"
#include "core/version.h"
#include "io/fingerprint.h"
#include "io/output_lock.h"
#include "train/checkpoint.h"

namespace aerie {

namespace fs = std::filesystem;

namespace {

std::string absolute_path(const std::string& p) {
  return p.empty() ? p : fs::weakly_canonical(fs::absolute(p)).string();
}

}  // namespace

double CheckpointEvalRow::acceptance_length() const {
  AERIE_CHECK(figures.is_object() && figures.contains("acceptance_length") && figures["acceptance_length"].is_number(),
              "checkpoint table: the row of step " << step << " has no acceptance_length");
  return figures["acceptance_length"].get<double>();
}

const CheckpointEvalRow* CheckpointEvalTable::find(int64_t step) const {
  for (const CheckpointEvalRow& r : rows)
    if (r.step == step) return &r;
  return nullptr;
}

void CheckpointEvalTable::put(CheckpointEvalRow row) {
  auto it = std::lower_bound(rows.begin(), rows.end(), row.step,
                             [](const CheckpointEvalRow& r, int64_t s) { return r.step < s; });
  if (it != rows.end() && it->step == row.step)
    *it = std::move(row);
  else
    rows.insert(it, std::move(row));
}

nlohmann::json CheckpointEvalTable::to_json() const {
  nlohmann::json list = nlohmann::json::array();
  for (const CheckpointEvalRow& r : rows) {
    nlohmann::json e = r.figures;
    e["step"] = r.step;
    e["checkpoint"] = r.checkpoint;
    e["fingerprint"] = r.fingerprint;
    list.push_back(std::move(e));
  }
  nlohmann::json j = {{"format", kCheckpointEvalFormat},
                      {"format_version", kCheckpointEvalFormatVersion},
                      {"aerie_version", aerie_version_string()},
                      {"run", run_dir},
                      {"selected_by", "acceptance_length"},
                      {"settings", settings},
                      {"checkpoints", std::move(list)}};
  if (!untrained.is_null()) j["untrained"] = untrained;
  return j;
}

CheckpointEvalTable CheckpointEvalTable::from_json(const nlohmann::json& j, const std::string& path) {
  AERIE_CHECK(j.is_object() && j.value("format", "") == kCheckpointEvalFormat,
              path << ": not a checkpoint table (format " << kCheckpointEvalFormat << ", written by aerie eval --run)");
  AERIE_CHECK(j.value("format_version", int64_t{0}) == kCheckpointEvalFormatVersion,
              path << ": checkpoint table format version " << j.value("format_version", int64_t{0}) << ", expected "
                   << kCheckpointEvalFormatVersion);
  CheckpointEvalTable t;
  try {
    t.run_dir = j.at("run").get<std::string>();
    t.settings = j.at("settings");
    AERIE_CHECK(t.settings.is_object(), path << ": settings is not an object");
    if (j.contains("untrained")) t.untrained = j["untrained"];
    for (const nlohmann::json& e : j.at("checkpoints")) {
      CheckpointEvalRow r;
      r.step = e.at("step").get<int64_t>();
      r.checkpoint = e.at("checkpoint").get<std::string>();
      r.fingerprint = e.at("fingerprint").get<std::string>();
      r.figures = e;
      for (const char* k : {"step", "checkpoint", "fingerprint"}) r.figures.erase(k);
      AERIE_CHECK(!t.find(r.step), path << ": two rows of step " << r.step);
      r.acceptance_length();  // present and a number
      t.put(std::move(r));
    }
  } catch (const nlohmann::json::exception& e) {
    AERIE_THROW(path << ": " << e.what());
  } catch (const Error& e) {
    AERIE_THROW(path << ": " << e.what());
  }
  return t;
}

std::string checkpoint_eval_path(const std::string& run_dir) {
  return (fs::path(run_dir) / "checkpoint_eval.json").string();
}

CheckpointEvalTable read_checkpoint_eval(const std::string& path) {
  AERIE_CHECK(fs::is_regular_file(path), "no checkpoint table " << path
                                             << " (aerie eval --run RUN_DIR writes RUN_DIR/checkpoint_eval.json)");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::exception& e) {
    AERIE_THROW(path << " is not JSON: " << e.what());
  }
  return CheckpointEvalTable::from_json(j, path);
}

nlohmann::json checkpoint_eval_settings(const EvalOptions& o, const std::string& dtype) {
  const TargetFingerprint target = TargetFingerprint::of_model(o.model_dir);
  nlohmann::json s = {{"model", absolute_path(o.model_dir)},
                      {"target_config_sha256", target.config_sha256},
                      {"target_weights_sha256", target.weights_sha256},
                      {"prompts", absolute_path(o.prompts_path)},
                      {"prompts_sha256", sha256_file(o.prompts_path)},
                      {"num_prompts", o.num_prompts},
                      {"max_prompt_tokens", o.max_prompt_tokens},
                      {"chat_template", o.chat_template},
                      {"max_new_tokens", o.max_new_tokens},
                      {"num_draft_tokens", o.num_draft_tokens},
                      {"data_split", absolute_path(o.data_split_path)},
                      {"data_split_sha256", o.data_split_path.empty() ? "" : sha256_file(o.data_split_path)},
                      {"shards", absolute_path(o.shards_dir)},
                      {"num_eval_samples", o.num_eval_samples},
                      {"ttt_steps", o.ttt_steps},
                      {"dtype", dtype}};
  if (o.tree_topk > 1)  // a tree's acceptance length is another measure than a chain's
    s["tree"] = {{"topk", o.tree_topk}, {"depth", o.tree_depth}};
  if (o.temperature > 0)  // sampled acceptance lengths are another measure than greedy ones
    s["sampling"] = {{"temperature", o.temperature}, {"top_p", o.top_p}, {"sample_seed", o.sample_seed}};
  // Verification by a W8A8 target is another measure (absent when off: the tables of earlier runs match).
  if (o.fp8_gemm) s["fp8_gemm"] = true;
  return s;
}

std::string settings_difference(const nlohmann::json& was, const nlohmann::json& now,
                                const std::vector<std::string>& ignore) {
  std::set<std::string> keys;
  for (const auto* j : {&was, &now})
    if (j->is_object())
      for (auto it = j->begin(); it != j->end(); ++it) keys.insert(it.key());
  std::ostringstream os;
  for (const std::string& k : keys) {
    if (std::find(ignore.begin(), ignore.end(), k) != ignore.end()) continue;
    const nlohmann::json a = was.is_object() && was.contains(k) ? was[k] : nlohmann::json("(none)");
    const nlohmann::json b = now.is_object() && now.contains(k) ? now[k] : nlohmann::json("(none)");
    if (a == b) continue;
    if (os.tellp() > 0) os << "; ";
    os << k << ": " << a.dump() << " -> " << b.dump();
  }
  return os.str();
}

std::string checkpoint_fingerprint(const std::string& dir) {
  const std::string path = (fs::path(dir) / "draft.safetensors").string();
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  AERIE_CHECK(!ec, "cannot read the size of " << path << ": " << ec.message());
  const std::string state = read_file((fs::path(dir) / "state.json").string());
  int64_t step = -1;
  try {
    step = nlohmann::json::parse(state).at("step").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    AERIE_THROW(dir << "/state.json: " << e.what());
  }
  Sha256 h;
  h.update("step " + std::to_string(step) + " draft.safetensors " + std::to_string(size) + "\n");
  hash_sampled_range(h, path, 0, static_cast<int64_t>(size));
  return h.hex();
}

std::vector<int64_t> select_checkpoint_steps(const std::vector<int64_t>& available, int64_t every,
                                             const std::vector<int64_t>& steps) {
  AERIE_CHECK(!available.empty(), "the run has no complete checkpoint (step-X folder with DONE under checkpoints/)");
  AERIE_CHECK(every >= 0, "--every " << every << " is negative");
  auto list = [&] {
    std::ostringstream os;
    for (size_t i = 0; i < available.size(); ++i) os << (i ? ", " : "") << available[i];
    return os.str();
  };
  if (!steps.empty()) {
    std::vector<int64_t> out;
    for (int64_t s : steps) {
      AERIE_CHECK(s > 0, "--steps: step " << s << " is not positive");
      AERIE_CHECK(std::binary_search(available.begin(), available.end(), s),
                  "--steps: no complete checkpoint of step " << s << " (the run has steps " << list() << ")");
      out.push_back(s);
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
  }
  if (every == 0) return available;
  std::vector<int64_t> out;
  for (int64_t s : available)
    if (s % every == 0 || s == available.back()) out.push_back(s);
  return out;
}

const CheckpointEvalRow& best_checkpoint(const CheckpointEvalTable& table, const std::string& path) {
  AERIE_CHECK(!table.rows.empty(), path << ": the checkpoint table has no row (aerie eval --run evaluates the checkpoints)");
  const CheckpointEvalRow* best = &table.rows.front();
  for (const CheckpointEvalRow& r : table.rows) {
    const double a = r.acceptance_length(), b = best->acceptance_length();
    if (a > b || (a == b && r.step > best->step)) best = &r;
  }
  return *best;
}

std::string format_checkpoint_table(const CheckpointEvalTable& table) {
  std::ostringstream os;
  os << "      step  acceptance length  tau_sim  lossless\n";
  auto line = [&](const std::string& label, const nlohmann::json& f, bool best) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "%10s  %17s  %7s  %-8s%s\n", label.c_str(),
                  format_fixed(f.value("acceptance_length", 0.0), 3).c_str(),
                  format_fixed(f.value("tau_sim", 0.0), 3).c_str(),
                  !f.contains("lossless") ? "sampled" : f.value("lossless", false) ? "yes" : "no",
                  best ? "  * best" : "");
    os << buf;
  };
  if (table.untrained.is_object()) line("untrained", table.untrained, false);
  const CheckpointEvalRow* best = table.rows.empty() ? nullptr : &best_checkpoint(table, "");
  for (const CheckpointEvalRow& r : table.rows) line(std::to_string(r.step), r.figures, &r == best);
  return os.str();
}

CheckpointEvalTable run_checkpoint_eval(const EvalOptions& eval, const CheckpointEvalOptions& opts) {
  const std::string path = opts.table_path.empty() ? checkpoint_eval_path(opts.run_dir) : opts.table_path;
  const std::unique_ptr<MpiCommunicator> world = MpiCommunicator::world();
  const int rank = world->rank();
  std::map<int64_t, std::string> all;
  std::vector<int64_t> available, selected;
  nlohmann::json settings;
  CheckpointEvalTable table;
  bool resumed = false;
  // The table so far: the same settings (the dtype once the session resolved it) and the same checkpoints.
  // The target, prompts and data split are compared by content (fingerprint, sha256), not by path, so
  // that a run moved to other storage with them keeps its table (the shards folder is compared by path:
  // it has no hash here, and other shards give another tau_sim).
  const std::vector<std::string> moved = {"model", "prompts", "data_split"};
  std::vector<int64_t> todo;
  std::map<int64_t, std::string> fingerprints;
  // Every rank reads the same run and table: a refusal ends the job once, with status 1 (no MPI_Abort).
  agree_on_refusal(*world, "eval", [&] {
    all = complete_checkpoints(opts.run_dir);
    for (const auto& [step, dir] : all) available.push_back(step);
    try {
      selected = select_checkpoint_steps(available, opts.every, opts.steps);
    } catch (const Error& e) {
      AERIE_THROW("eval --run " << opts.run_dir << ": " << e.what());
    }

    settings = checkpoint_eval_settings(eval, "");
    table.run_dir = opts.run_dir;
    resumed = fs::exists(path);
    if (resumed) {
      table = read_checkpoint_eval(path);
      std::vector<std::string> ignore = moved;
      ignore.push_back("dtype");
      const std::string diff = settings_difference(table.settings, settings, ignore);
      AERIE_CHECK(diff.empty(), "eval --run: " << path << " was made with other eval settings (" << diff
                                               << "); its rows are kept: write this table elsewhere (--output) or "
                                               << "remove " << path);
      if (eval.untrained && table.untrained.is_object())
        AERIE_CHECK(table.untrained.value("seed", uint64_t{0}) == eval.seed,
                    "eval --run: " << path << " holds the untrained draft of --seed " << table.untrained.value("seed", 0)
                                   << ", not " << eval.seed << ": write this table elsewhere (--output)");
    }
    for (int64_t step : selected) {
      fingerprints[step] = checkpoint_fingerprint(all.at(step));
      const CheckpointEvalRow* row = table.find(step);
      if (!row) {
        todo.push_back(step);
        continue;
      }
      AERIE_CHECK(row->fingerprint == fingerprints[step],
                  "eval --run: " << path << " holds step " << step << " of another checkpoint than " << all.at(step)
                                 << " (the run was trained again into " << opts.run_dir
                                 << "?): write this table elsewhere (--output) or remove " << path);
    }
  });
  const bool untrained_todo = eval.untrained && !table.untrained.is_object();
  if (rank == 0)
    AERIE_LOG(info) << "eval --run: " << selected.size() << " of " << available.size() << " checkpoints of "
                    << opts.run_dir << " selected, " << selected.size() - todo.size() << " already in " << path
                    << ", " << todo.size() << " to evaluate" << (untrained_todo ? " and the untrained draft" : "");

  if (!todo.empty() || untrained_todo) {
    EvalSession session(eval);
    settings["dtype"] = session.dtype_name();
    agree_on_refusal(*world, "eval", [&] {
      if (!resumed) return;
      const std::string diff = settings_difference(table.settings, settings, moved);
      AERIE_CHECK(diff.empty(), "eval --run: " << path << " was made with other eval settings (" << diff
                                               << "); its rows are kept: write this table elsewhere (--output) or "
                                               << "remove " << path);
    });
    table.settings = settings;
    auto save = [&] {
      if (rank == 0) write_file_atomic(path, table.to_json().dump(2) + "\n", unique_tmp_path(path));
    };
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t i = 0; i < todo.size(); ++i) {
      const int64_t step = todo[i];
      const LoadedDraft draft = session.load(all.at(step));
      CheckpointEvalRow row;
      row.step = step;
      row.checkpoint = all.at(step);
      row.fingerprint = fingerprints.at(step);
      row.figures = session.evaluate(draft, "step " + std::to_string(step));
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (rank == 0)
        AERIE_LOG(info) << "eval --run: step " << step << " (" << i + 1 << "/" << todo.size() << ", "
                        << format_fixed(secs, 0) << " s, ETA " << format_fixed(secs / (i + 1) * (todo.size() - i - 1), 0)
                        << " s): acceptance length " << format_fixed(row.figures["acceptance_length"].get<double>(), 3)
                        << ", tau_sim " << format_fixed(row.figures["tau_sim"].get<double>(), 3)
                        << (row.figures.contains("lossless") ? ", lossless " + row.figures["lossless"].dump()
                                                             : std::string(", sampled"));
      table.put(std::move(row));
      save();  // a killed eval keeps every checkpoint finished so far
      if (untrained_todo && i == 0) {  // the untrained draft of this draft's config and vocabulary, once
        table.untrained = session.evaluate(session.untrained(draft, eval.seed), "untrained draft");
        table.untrained["seed"] = eval.seed;
        save();
      }
    }
    if (todo.empty()) {  // only the untrained draft: of the newest checkpoint's config and vocabulary
      const LoadedDraft draft = session.load(all.rbegin()->second);
      table.untrained = session.evaluate(session.untrained(draft, eval.seed), "untrained draft");
      table.untrained["seed"] = eval.seed;
      save();
    }
  }
  if (rank == 0) {
    std::cout << "checkpoints of " << opts.run_dir << " (" << path << "):\n" << format_checkpoint_table(table);
    const CheckpointEvalRow& best = best_checkpoint(table, path);
    if (!all.count(best.step))
      std::cout << "note: the best row, step " << best.step << ", is a checkpoint no longer in " << opts.run_dir
                << " (export --best refuses it and names the best one left)\n";
    // The table's own path in the hint when it is not the run's default one (export --best reads that).
    const bool default_table = opts.table_path.empty() || fs::path(opts.table_path) == fs::path(checkpoint_eval_path(opts.run_dir));
    std::cout << "best: step " << best.step << " (acceptance length " << format_fixed(best.acceptance_length(), 3)
              << "; aerie export --checkpoint " << opts.run_dir << " --best"
              << (default_table ? std::string() : " --eval-table " + path) << " exports it)\n";
    std::cout.flush();
  }
  return table;
}

}  // namespace aerie
