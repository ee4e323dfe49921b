// dp_train: data-parallel training of the tiny MLP (examples/common/model.h),
// the way PyTorch DistributedDataParallel does it.
//
// Every rank holds the whole model and takes its own rows of every global
// batch. After the backward pass the ranks average their gradients with
// ncclAllReduce(..., ncclAvg), so every rank applies the same Adam update and
// the parameters stay bit-identical across ranks.
//
// Gradients are packed into fusion buckets (--bucket-mb, default 25 MiB like
// DDP's bucket_cap_mb): a bucket is a run of whole parameter tensors in
// reverse layer order, i.e. in the order the backward pass produces them, and
// one AllReduce averages a whole bucket. --overlap says how buckets are
// averaged:
//   thread  a bucket's AllReduce starts the moment the backward pass has
//           produced all of it, on a communication thread of this rank (one
//           blocking ncclAllReduce per bucket, in order), while the rank's own
//           thread computes the backward of the layers before it. Plain NCCL
//           API.
//   stream  the same, but the AllReduce is enqueued on a Shoal host stream
//           (shoalHostStream_t, include/shoal/shoal.h) and runs on Shoal's
//           progress thread; no thread of our own.
//   off     all buckets are averaged after the backward pass, one blocking
//           call each.
//
// Run: ./dp_train -t 2            two ranks as threads of one process
//      mpirun -np 2 ./dp_train    two processes
#include <nccl.h>
#include <shoal/shoal.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/check.h"
#include "common/launcher.h"
#include "common/model.h"
#include "common/options.h"
#include "common/rank_tools.h"

namespace shoal::examples {
namespace {

enum class Overlap { kOff, kThread, kHostStream };

struct DpOptions {
  CommonOptions common;
  double bucketMiB = 25;
  Overlap overlap = Overlap::kThread;
};

// A rank's communication thread: runs the AllReduces handed to it, one at a
// time, in the order they were handed over.
// Threads: enqueue() and waitAll() are called by the rank's thread; the
// communicator is used by this thread between an enqueue() and the waitAll()
// that follows, and by the rank's thread only outside such a window (NCCL
// allows one thread at a time per communicator).
class CommunicationThread {
 public:
  explicit CommunicationThread(ncclComm_t comm) : comm_(comm), thread_([this] { run(); }) {}
  ~CommunicationThread() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
    thread_.join();
  }

  // Starts averaging data[0, count) over the ranks (in place).
  void enqueue(float* data, size_t count) {
    {
      std::lock_guard lock(mutex_);
      queue_.push_back({data, count});
      ++unfinished_;
    }
    changed_.notify_all();
  }

  // Returns when every enqueued AllReduce has completed.
  void waitAll() {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return unfinished_ == 0; });
  }

 private:
  struct Work {
    float* data;
    size_t count;
  };

  void run() {
    std::unique_lock lock(mutex_);
    for (;;) {
      changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      const Work work = queue_.front();
      queue_.pop_front();
      lock.unlock();
      CHECK_NCCL(ncclAllReduce(work.data, work.data, work.count, ncclFloat, ncclAvg, comm_, nullptr));
      lock.lock();
      --unfinished_;
      changed_.notify_all();
    }
  }

  ncclComm_t comm_;
  std::mutex mutex_;  // guards everything below
  std::condition_variable changed_;
  std::deque<Work> queue_;
  int unfinished_ = 0;
  bool stopping_ = false;
  std::thread thread_;  // last: starts once the members above exist
};

// A fusion bucket: gradients [begin, end) of the flat gradient vector. It is
// complete once the backward pass has gone down to `lowestLayer`.
struct Bucket {
  size_t begin = 0;
  size_t end = 0;
  int lowestLayer = 0;
};

// Fills buckets with whole tensors (each layer's b, then its W) from the last
// layer down, closing a bucket once it holds at least `capBytes`, as DDP does.
// Since the flat layout stores layer l's W then b, going down the tensors
// goes down the addresses, so every bucket is one contiguous range.
std::vector<Bucket> makeBuckets(const ParamLayout& layout, size_t capBytes) {
  std::vector<Bucket> buckets;
  Bucket open{.begin = layout.total, .end = layout.total};
  for (int l = static_cast<int>(layout.layers.size()) - 1; l >= 0; --l) {
    const size_t biasBegin = layout.offsets[l] + layout.layers[l].weightCount();
    for (size_t tensorBegin : {biasBegin, layout.offsets[l]}) {
      open.begin = tensorBegin;
      open.lowestLayer = l;
      if ((open.end - open.begin) * sizeof(float) >= capBytes) {
        buckets.push_back(open);
        open = Bucket{.begin = tensorBegin, .end = tensorBegin};
      }
    }
  }
  if (open.end > open.begin) buckets.push_back(open);
  return buckets;
}

struct StepTimes {
  double compute = 0;                // forward, backward (with the enqueues), optimizer
  double exposedCommunication = 0;   // waiting for the gradient AllReduces
};

int train(const RankContext& rank, const DpOptions& options, const TrainingRun* reference) {
  const ModelConfig& model = options.common.model;
  const TrainConfig& trainConfig = options.common.train;
  const ParamLayout layout = paramLayout(model);
  const int L = model.layers;
  const int rows = trainConfig.globalBatch / rank.size;  // this rank's share of every batch
  const std::vector<Bucket> buckets =
      makeBuckets(layout, static_cast<size_t>(options.bucketMiB * 1024 * 1024));

  std::vector<float> params = initialParameters(model);
  std::vector<float> grads(layout.total), adamM(layout.total), adamV(layout.total);
  TrainingRun run;
  bool identicalEveryStep = true;

  // Where bucket AllReduces go while the backward pass runs.
  shoalHostStream_t stream = nullptr;
  if (options.overlap == Overlap::kHostStream) CHECK_NCCL(shoalHostStreamCreate(&stream));
  std::unique_ptr<CommunicationThread> communication;
  if (options.overlap == Overlap::kThread) communication = std::make_unique<CommunicationThread>(rank.comm);
  auto startAveraging = [&](const Bucket& bucket) {
    float* first = grads.data() + bucket.begin;
    const size_t count = bucket.end - bucket.begin;
    if (communication) {
      communication->enqueue(first, count);
    } else {
      CHECK_NCCL(ncclAllReduce(first, first, count, ncclFloat, ncclAvg, rank.comm,
                               reinterpret_cast<cudaStream_t>(stream)));
    }
  };

  std::vector<StepTimes> times;
  for (int step = 0; step < trainConfig.steps; ++step) {
    const double start = secondsNow();
    const Batch batch = batchSlice(model, trainConfig, step, rank.rank * rows, rows);

    // Forward: activations[l] is the input of layer l, activations[L] the logits.
    std::vector<std::vector<float>> activations(L + 1);
    activations[0] = batch.features;
    for (int l = 0; l < L; ++l) {
      activations[l + 1].resize(static_cast<size_t>(rows) * layout.layers[l].out);
      layerForward(model, l, params.data() + layout.offsets[l], activations[l].data(), rows,
                   activations[l + 1].data());
    }
    // The loss is this rank's mean; ncclAvg over ranks then gives the mean
    // over the global batch, for the loss and for the gradients alike.
    std::vector<float> dOutput(activations[L].size());
    const double localLoss = softmaxCrossEntropy(activations[L].data(), batch.labels.data(), rows,
                                                 model.classes, 1.0f / rows, dOutput.data()) / rows;

    // Backward, starting each bucket's AllReduce as soon as it is complete.
    std::fill(grads.begin(), grads.end(), 0.0f);
    size_t nextBucket = 0;
    for (int l = L - 1; l >= 0; --l) {
      std::vector<float> dInput(l > 0 ? activations[l].size() : 0);
      layerBackward(model, l, params.data() + layout.offsets[l], activations[l].data(),
                    activations[l + 1].data(), dOutput.data(), rows,
                    grads.data() + layout.offsets[l], l > 0 ? dInput.data() : nullptr);
      dOutput = std::move(dInput);
      for (; options.overlap != Overlap::kOff && nextBucket < buckets.size() &&
             buckets[nextBucket].lowestLayer >= l;
           ++nextBucket)
        startAveraging(buckets[nextBucket]);
    }
    const double backwardDone = secondsNow();

    // The communication still outstanding now is what the step waits for.
    switch (options.overlap) {
      case Overlap::kThread: communication->waitAll(); break;
      case Overlap::kHostStream: {
        CHECK_NCCL(shoalHostStreamSynchronize(stream));
        // The NCCL idiom after asynchronous work: ask the communicator for
        // its asynchronous error. (This is also where Shoal releases the
        // scratch memory of finished stream work.)
        ncclResult_t asyncError = ncclSuccess;
        CHECK_NCCL(ncclCommGetAsyncError(rank.comm, &asyncError));
        CHECK_NCCL(asyncError);
        break;
      }
      case Overlap::kOff:
        for (const Bucket& bucket : buckets) startAveraging(bucket);  // blocking: NULL stream
        break;
    }
    const double gradientsAveraged = secondsNow();

    adamUpdate(trainConfig, step + 1, params.data(), grads.data(), adamM.data(), adamV.data(),
               layout.total);
    const double end = secondsNow();
    times.push_back({.compute = (backwardDone - start) + (end - gradientsAveraged),
                     .exposedCommunication = gradientsAveraged - backwardDone});

    // Bookkeeping outside the timed step: the global loss, and (with --check)
    // that every rank now holds exactly the same parameters.
    const double loss = sumOverRanks(rank.comm, localLoss) / rank.size;
    run.losses.push_back(loss);
    if (rank.prints()) std::printf("step %d loss %.6f\n", step, loss);
    if (options.common.check && !identicalOnAllRanks(rank.comm, params.data(), params.size()))
      identicalEveryStep = false;
  }
  communication.reset();
  CHECK_NCCL(shoalHostStreamDestroy(stream));
  run.parameters = params;

  // Time per step, slowest rank, leaving out the first (warm-up) step.
  StepTimes mean;
  const int timed = std::max(1, trainConfig.steps - 1);
  for (size_t s = times.size() > 1 ? 1 : 0; s < times.size(); ++s) {
    mean.compute += times[s].compute / timed;
    mean.exposedCommunication += times[s].exposedCommunication / timed;
  }
  mean.compute = maxOverRanks(rank.comm, mean.compute);
  mean.exposedCommunication = maxOverRanks(rank.comm, mean.exposedCommunication);

  if (!rank.prints()) return 0;
  std::printf("final parameters: %s\n", parameterChecksum(run.parameters).c_str());
  std::printf("%d ranks, %d samples per rank per step, %zu bucket%s of <= %g MiB, overlap %s\n",
              rank.size, rows, buckets.size(), buckets.size() == 1 ? "" : "s", options.bucketMiB,
              options.overlap == Overlap::kThread       ? "on (communication thread)"
              : options.overlap == Overlap::kHostStream ? "on (Shoal host stream)"
                                                        : "off");
  std::printf("time per step: %.3f ms = compute %.3f ms + exposed communication %.3f ms\n",
              1e3 * (mean.compute + mean.exposedCommunication), 1e3 * mean.compute,
              1e3 * mean.exposedCommunication);
  if (!options.common.check) return 0;
  std::printf("check: parameters bit-identical on all ranks after every step: %s\n",
              identicalEveryStep ? "ok" : "MISMATCH");
  return matchesReference(run, *reference, trainConfig) && identicalEveryStep ? 0 : 1;
}

}  // namespace
}  // namespace shoal::examples

int main(int argc, char** argv) {
  using namespace shoal::examples;
  Job job = Job::start(&argc, &argv);
  Flags flags(argc, argv);
  DpOptions options;
  options.common = commonOptions(flags);
  options.bucketMiB = flags.real("--bucket-mb", options.bucketMiB, "gradient fusion bucket size, MiB");
  const std::string overlap = flags.text(
      "--overlap", "thread", "thread | stream: AllReduce each bucket during the backward pass, on a "
      "communication thread or a Shoal host stream; off: after it");
  flags.finish("dp_train", "Data-parallel training: gradients averaged in buckets with ncclAllReduce(ncclAvg).");

  if (overlap == "thread") options.overlap = Overlap::kThread;
  else if (overlap == "stream") options.overlap = Overlap::kHostStream;
  else if (overlap == "off") options.overlap = Overlap::kOff;
  else {
    std::fprintf(stderr, "--overlap must be thread, stream or off\n");
    return job.finish(2);
  }
  const int ranks = job.processCount() * options.common.threads;
  if (options.common.train.globalBatch % ranks != 0) {
    std::fprintf(stderr, "--batch %d must be a multiple of the %d ranks\n",
                 options.common.train.globalBatch, ranks);
    return job.finish(2);
  }
  TrainingRun reference;
  if (options.common.check) reference = trainSingleProcess(options.common.model, options.common.train);
  const int status = job.run(options.common.threads, [&](const RankContext& rank) {
    return train(rank, options, &reference);
  });
  return job.finish(status);
}
