// ChunkDispatcher: rank 0's work queue and the leaders' requests (see chunk_dispatcher.h).
#include "data/chunk_dispatcher.h"

#include <algorithm>
#include <iomanip>
#include <sstream>

#include "core/error.h"
#include "core/log.h"

namespace aerie {

ChunkDispatcher::ChunkDispatcher(MpiCommunicator& world, int num_groups, std::deque<int64_t> todo, std::string what,
                                 std::vector<Counter> counters, int request_tag, int reply_tag, double interval_s)
    : world_(world), others_(num_groups - 1), todo_(std::move(todo)), what_(std::move(what)),
      request_tag_(request_tag), reply_tag_(reply_tag), counters_(std::move(counters)),
      done_(counters_.size(), 0.0), interval_s_(interval_s), start_(std::chrono::steady_clock::now()),
      last_(start_) {
  AERIE_CHECK(num_groups >= 1, what_ << ": ChunkDispatcher needs at least one group, got " << num_groups);
}

int64_t ChunkDispatcher::request(MpiCommunicator& world, int group, int64_t finished_chunk,
                                 const std::vector<int64_t>& counts, bool stop, int request_tag, int reply_tag) {
  std::vector<int64_t> req = {group, finished_chunk};
  req.insert(req.end(), counts.begin(), counts.end());
  req.push_back(stop ? 1 : 0);
  world.send(req, 0, request_tag);
  return world.recv(0, reply_tag).at(0);
}

int64_t ChunkDispatcher::next() {
  if (todo_.empty()) return -1;
  int64_t c = todo_.front();
  todo_.pop_front();
  return c;
}

void ChunkDispatcher::serve_pending() {
  for (;;) {
    int flag = 0;
    MPI_Status st;
    check_mpi(MPI_Iprobe(MPI_ANY_SOURCE, request_tag_, world_.handle(), &flag, &st), "MPI_Iprobe");
    if (!flag) return;
    answer(st.MPI_SOURCE);
  }
}

void ChunkDispatcher::drain() {
  while (stopped_ < others_) answer(MPI_ANY_SOURCE);
}

void ChunkDispatcher::stop() {
  if (!todo_.empty()) AERIE_LOG(warning) << what_ << ": stopping, " << todo_.size() << " chunk(s) left for a rerun";
  todo_.clear();
  stopped_any_ = true;
}

void ChunkDispatcher::completed(const std::vector<int64_t>& counts) {
  AERIE_CHECK(counts.size() == counters_.size(), what_ << ": " << counts.size() << " counts for "
                                                       << counters_.size() << " progress counters");
  bool any = false;
  for (size_t k = 0; k < counts.size(); ++k) {
    done_[k] += static_cast<double>(counts[k]);
    any = any || counts[k] != 0;
  }
  if (any && std::chrono::duration<double>(std::chrono::steady_clock::now() - last_).count() >= interval_s_) log(false);
}

void ChunkDispatcher::finish() { log(true); }

void ChunkDispatcher::log(bool final) {
  last_ = std::chrono::steady_clock::now();
  const double s = std::chrono::duration<double>(last_ - start_).count();
  std::ostringstream line;
  line << std::fixed << what_ << ": " << (final ? "done, " : "");
  double eta = -1;
  for (size_t k = 0; k < counters_.size(); ++k) {
    const Counter& c = counters_[k];
    const double rate = s > 0 ? done_[k] / s : 0.0;
    line << (k ? "; " : "") << std::setprecision(0) << done_[k];
    if (c.total > 0 && !final) line << "/" << c.total << " " << c.unit << " (" << std::setprecision(1) << 100.0 * done_[k] / c.total << "%)";
    else line << " " << c.unit;
    line << ", " << std::setprecision(1) << rate << " " << c.unit << "/s";
    if (eta < 0 && c.total > 0 && rate > 0) eta = std::max(0.0, (c.total - done_[k]) / rate);
  }
  if (final) line << " in " << std::setprecision(1) << s << " s";
  else if (eta >= 0) line << "; ETA " << std::setprecision(0) << eta << " s";
  AERIE_LOG(info) << line.str();
}

void ChunkDispatcher::answer(int src) {
  int from = -1;
  std::vector<int64_t> req = world_.recv(src, request_tag_, &from);
  const size_t K = counters_.size();
  AERIE_CHECK(req.size() == K + 3, what_ << ": malformed request from rank " << from << " (" << req.size()
                                         << " values, expected " << K + 3 << ")");
  if (req[K + 2] != 0) stop();  // that group was asked to stop: stop everyone
  completed(std::vector<int64_t>(req.begin() + 2, req.begin() + 2 + static_cast<std::ptrdiff_t>(K)));
  if (req[1] >= 0) AERIE_LOG(debug) << what_ << ": group " << req[0] << " finished chunk " << req[1];
  int64_t c = next();
  if (c < 0) ++stopped_;
  world_.send({c}, from, reply_tag_);
}

}  // namespace aerie
