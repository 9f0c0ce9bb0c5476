// Dynamic hand-out of numbered chunks of work (shards of extract, conversation chunks of generate) to the
// tp groups of a job, by world rank 0, which also works in group 0 (MPI is initialised without
// MPI_THREAD_MULTIPLE, so there is no server thread: rank 0 serves requests between its own work items).
//
// Protocol (point to point on the world communicator, int64 vectors):
//   - the leader (tp rank 0) of group g > 0 sends rank 0 a request
//       [g, finished chunk or -1, count_1 .. count_K, stop]          (tag request_tag, K = counters.size())
//     where count_k is the work of counter k it finished since its previous request (e.g. samples, tokens)
//     and stop = 1 when it was asked to stop (preemption); then it waits for the reply [next chunk or -1]
//     (tag reply_tag). ChunkDispatcher::request() is this side.
//   - rank 0 answers every pending request (serve_pending, MPI_Iprobe) whenever it can, at least once per
//     unit of its own work, so a request waits at most one unit of group 0; a stop in any request (or
//     stop() on rank 0) empties the queue: no chunk is handed out any more, groups finish what they hold;
//   - when the queue is empty rank 0 answers -1; after its own last chunk rank 0 calls drain(), which keeps
//     answering until every other leader got its -1 (a leader sends no request after receiving -1);
//   - each leader broadcasts the chunk index (or -1) to its tp group (the caller's part, not this class).
// Rank 0 adds the reported counts (and its own, completed()) to its counters and logs, at most every
// `interval_s` seconds, one progress line with every counter's total, rate per second and the ETA from the
// first counter that has a total (as core/progress.h does for one counter), e.g.
//   generate: 37/500 conversations (7.4%), 1.2 conversations/s; 52 responses, 1.7 responses/s; 9812 new
//   tokens, 327.1 new tokens/s; ETA 386 s
//
// Errors: aerie::Error on a request of the wrong length (another job's message on the same tag) or an MPI
// failure; the caller aborts the job (peers may be waiting in a receive).
#pragma once
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include <chrono>

#include "comm/communicator.h"

namespace aerie {

class ChunkDispatcher {
 public:
  /// One counted quantity of the work ("samples", "tokens"); total <= 0: unknown (no ETA).
  struct Counter {
    std::string unit;
    double total = 0;
  };
  /// World rank 0's side: `todo` (chunk indices, handed out in order) shared by `num_groups` groups
  /// (group 0 takes its chunks with next()). `what` names the job in the logs ("extract").
  ChunkDispatcher(MpiCommunicator& world, int num_groups, std::deque<int64_t> todo, std::string what,
                  std::vector<Counter> counters, int request_tag, int reply_tag, double interval_s = 5.0);

  /// A group leader's side (world rank != 0): reports `counts` (one per counter, done since the previous
  /// request) and `finished_chunk` (-1: none), and returns the next chunk for its group or -1 (no more).
  static int64_t request(MpiCommunicator& world, int group, int64_t finished_chunk,
                         const std::vector<int64_t>& counts, bool stop, int request_tag, int reply_tag);

  /// The next chunk for group 0, or -1.
  int64_t next();
  /// Answers every request that has arrived, without blocking.
  void serve_pending();
  /// After group 0's last chunk: answers until every other leader got its -1 (blocking).
  void drain();
  /// Preemption: hands out no more chunks (groups finish the chunks in hand).
  void stop();
  bool stopped_any() const { return stopped_any_; }
  size_t remaining() const { return todo_.size(); }
  /// Group 0's finished work (one count per counter).
  void completed(const std::vector<int64_t>& counts);
  /// Logs the final line: totals and mean rates (call after drain(); the counts are complete only when
  /// every leader reported all of its work in its requests).
  void finish();

 private:
  void answer(int src);
  void log(bool final);

  MpiCommunicator& world_;
  int others_, stopped_ = 0;
  bool stopped_any_ = false;
  std::deque<int64_t> todo_;
  std::string what_;
  int request_tag_, reply_tag_;
  std::vector<Counter> counters_;
  std::vector<double> done_;
  double interval_s_;
  std::chrono::steady_clock::time_point start_, last_;
};

}  // namespace aerie
