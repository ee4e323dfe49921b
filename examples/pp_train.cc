// pp_train: pipeline-parallel training of the tiny MLP
// (examples/common/model.h) with the 1F1B schedule.
//
// Vocabulary: the layers are cut into p consecutive *stages*, one per rank
// (stage s = rank s). Every global batch is cut into m *micro-batches*; a
// stage runs the forward pass of a micro-batch, sends its output activation
// to the next stage, and later receives the gradient of that activation back
// and runs the backward pass. The last stage computes the loss. Gradients of
// all micro-batches add up (each micro-batch's loss is scaled by 1/global
// batch), so one optimizer step per batch gives the same update as the
// single-process run.
//
// Schedule (1F1B, as in PipeDream-Flush and Megatron-LM): stage s first runs
// p - s - 1 warm-up forwards, then alternates one forward and one backward,
// then drains the remaining backwards. At most p - s micro-batches are in
// flight on a stage, instead of all m with GPipe's all-forwards-first order.
// Every transfer is ncclSend/ncclRecv between neighbours; where a stage both
// sends and receives at one point of the schedule, the two go in one
// ncclGroupStart/ncclGroupEnd, so neither side waits for the other's send to
// finish first (the group is what keeps the schedule from deadlocking).
//
// The pipeline *bubble* is the share of a step a stage sits idle; with equal
// stages and free communication it is (p - 1) / (m + p - 1). The run prints
// the measured share next to that formula.
//
// Run: ./pp_train -t 3 --microbatches 6
//      mpirun -np 4 ./pp_train --layers 4
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <vector>

#include "common/check.h"
#include "common/launcher.h"
#include "common/model.h"
#include "common/options.h"
#include "common/rank_tools.h"

namespace shoal::examples {
namespace {

struct PpOptions {
  CommonOptions common;
  int microbatches = 4;
};

// The stage's neighbours and the transfers between them. Each call is
// complete when it returns (host memory, NULL stream).
class Neighbours {
 public:
  Neighbours(const RankContext& rank) : rank_(rank) {}
  bool isFirst() const { return rank_.rank == 0; }
  bool isLast() const { return rank_.rank == rank_.size - 1; }

  void recvForward(std::vector<float>& activation) {
    if (isFirst()) return;
    transfer(nullptr, -1, &activation, rank_.rank - 1);
  }
  void sendForward(std::vector<float>& activation) {
    if (isLast()) return;
    transfer(&activation, rank_.rank + 1, nullptr, -1);
  }
  void recvBackward(std::vector<float>& gradient) {
    if (isLast()) return;
    transfer(nullptr, -1, &gradient, rank_.rank + 1);
  }
  void sendBackward(std::vector<float>& gradient) {
    if (isFirst()) return;
    transfer(&gradient, rank_.rank - 1, nullptr, -1);
  }
  // Steady state: both directions to one neighbour, as one group.
  void sendForwardRecvBackward(std::vector<float>& activation, std::vector<float>& gradient) {
    if (isLast()) return;
    transfer(&activation, rank_.rank + 1, &gradient, rank_.rank + 1);
  }
  void sendBackwardRecvForward(std::vector<float>& gradient, std::vector<float>& activation) {
    if (isFirst()) return;
    transfer(&gradient, rank_.rank - 1, &activation, rank_.rank - 1);
  }

 private:
  void transfer(std::vector<float>* send, int sendPeer, std::vector<float>* recv, int recvPeer) {
    CHECK_NCCL(ncclGroupStart());
    if (send)
      CHECK_NCCL(ncclSend(send->data(), send->size(), ncclFloat, sendPeer, rank_.comm, nullptr));
    if (recv)
      CHECK_NCCL(ncclRecv(recv->data(), recv->size(), ncclFloat, recvPeer, rank_.comm, nullptr));
    CHECK_NCCL(ncclGroupEnd());
  }
  const RankContext& rank_;
};

int train(const RankContext& rank, const PpOptions& options, const TrainingRun* reference) {
  const ModelConfig& model = options.common.model;
  const TrainConfig& trainConfig = options.common.train;
  const ParamLayout layout = paramLayout(model);
  const int stages = rank.size;
  const int stage = rank.rank;
  const int microbatches = options.microbatches;
  const int rows = trainConfig.globalBatch / microbatches;  // per micro-batch
  // This stage's layers [firstLayer, endLayer), as even a split as allowed.
  const int firstLayer = stage * model.layers / stages;
  const int endLayer = (stage + 1) * model.layers / stages;
  const size_t inWidth = layout.layers[firstLayer].in;
  const size_t outWidth = layout.layers[endLayer - 1].out;
  Neighbours neighbours(rank);

  // This stage's block of the flat parameter vector, with its gradients and
  // Adam's moments.
  const size_t blockBegin = layout.offsets[firstLayer];
  const size_t blockEnd = endLayer < model.layers ? layout.offsets[endLayer] : layout.total;
  const std::vector<float> initial = initialParameters(model);
  std::vector<float> params(initial.begin() + blockBegin, initial.begin() + blockEnd);
  std::vector<float> grads(params.size()), adamM(params.size()), adamV(params.size());
  auto layerParams = [&](int l) { return params.data() + layout.offsets[l] - blockBegin; };
  auto layerGrads = [&](int l) { return grads.data() + layout.offsets[l] - blockBegin; };

  TrainingRun run;
  double bubbleSum = 0;  // over timed steps
  int timedSteps = 0;
  for (int step = 0; step < trainConfig.steps; ++step) {
    // Micro-batch i's activations on this stage, from its forward until its
    // backward: acts[i][k] is the input of layer firstLayer + k, the last
    // entry the stage's output. The last stage keeps its dlogits instead of
    // receiving a gradient.
    std::map<int, std::vector<std::vector<float>>> acts;
    std::map<int, std::vector<float>> dLogits;
    double lossSum = 0;
    double busySeconds = 0;

    auto forward = [&](int micro, std::vector<float> input) {
      const double start = secondsNow();
      if (neighbours.isFirst())
        input = batchSlice(model, trainConfig, step, micro * rows, rows).features;
      std::vector<std::vector<float>>& a = acts[micro];
      a.push_back(std::move(input));
      for (int l = firstLayer; l < endLayer; ++l) {
        std::vector<float> output(static_cast<size_t>(rows) * layout.layers[l].out);
        layerForward(model, l, layerParams(l), a.back().data(), rows, output.data());
        a.push_back(std::move(output));
      }
      if (neighbours.isLast()) {
        const Batch batch = batchSlice(model, trainConfig, step, micro * rows, rows);
        std::vector<float>& d = dLogits[micro];
        d.resize(a.back().size());
        lossSum += softmaxCrossEntropy(a.back().data(), batch.labels.data(), rows, model.classes,
                                       1.0f / trainConfig.globalBatch, d.data());
      }
      busySeconds += secondsNow() - start;
      return a.back();
    };
    // Returns the gradient at this stage's input (empty on the first stage).
    auto backward = [&](int micro, std::vector<float> gradient) {
      const double start = secondsNow();
      if (neighbours.isLast()) gradient = std::move(dLogits[micro]);
      std::vector<std::vector<float>>& a = acts[micro];
      for (int l = endLayer - 1; l >= firstLayer; --l) {
        const int k = l - firstLayer;
        const bool needInputGradient = l > 0;
        std::vector<float> dInput(needInputGradient ? a[k].size() : 0);
        layerBackward(model, l, layerParams(l), a[k].data(), a[k + 1].data(), gradient.data(), rows,
                      layerGrads(l), needInputGradient ? dInput.data() : nullptr);
        gradient = std::move(dInput);
      }
      acts.erase(micro);
      dLogits.erase(micro);
      busySeconds += secondsNow() - start;
      return gradient;
    };

    std::fill(grads.begin(), grads.end(), 0.0f);
    std::vector<float> input(static_cast<size_t>(rows) * inWidth);
    std::vector<float> output, dOutput(static_cast<size_t>(rows) * outWidth), dInput;
    const double scheduleStart = secondsNow();

    // The 1F1B schedule.
    const int warmup = std::min(stages - stage - 1, microbatches);
    const int steady = microbatches - warmup;
    for (int i = 0; i < warmup; ++i) {
      neighbours.recvForward(input);
      output = forward(i, input);
      neighbours.sendForward(output);
    }
    if (steady > 0) neighbours.recvForward(input);
    for (int i = 0; i < steady; ++i) {
      output = forward(warmup + i, input);
      neighbours.sendForwardRecvBackward(output, dOutput);
      dInput = backward(i, dOutput);
      if (i == steady - 1) {
        neighbours.sendBackward(dInput);
      } else {
        neighbours.sendBackwardRecvForward(dInput, input);
      }
    }
    for (int i = 0; i < warmup; ++i) {
      neighbours.recvBackward(dOutput);
      dInput = backward(steady + i, dOutput);
      neighbours.sendBackward(dInput);
    }
    const double scheduleSeconds = secondsNow() - scheduleStart;

    adamUpdate(trainConfig, step + 1, params.data(), grads.data(), adamM.data(), adamV.data(),
               params.size());

    // The loss lives on the last stage; every rank learns it.
    double loss = lossSum / trainConfig.globalBatch;
    CHECK_NCCL(ncclBroadcast(&loss, &loss, 1, ncclDouble, stages - 1, rank.comm, nullptr));
    run.losses.push_back(loss);
    if (rank.prints()) std::printf("step %d loss %.6f\n", step, loss);
    if (step > 0 || trainConfig.steps == 1) {  // the first step warms up
      bubbleSum += 1.0 - busySeconds / scheduleSeconds;
      ++timedSteps;
    }
  }

  // The whole model on every rank: each layer from the stage that owns it.
  run.parameters.resize(layout.total);
  std::copy(params.begin(), params.end(), run.parameters.begin() + blockBegin);
  CHECK_NCCL(ncclGroupStart());
  for (int s = 0; s < stages; ++s) {
    const size_t begin = layout.offsets[s * model.layers / stages];
    const int end = (s + 1) * model.layers / stages;
    const size_t count = (end < model.layers ? layout.offsets[end] : layout.total) - begin;
    CHECK_NCCL(ncclBroadcast(run.parameters.data() + begin, run.parameters.data() + begin, count,
                             ncclFloat, s, rank.comm, nullptr));
  }
  CHECK_NCCL(ncclGroupEnd());

  const double bubble = sumOverRanks(rank.comm, bubbleSum / timedSteps) / stages;
  if (!rank.prints()) return 0;
  std::printf("final parameters: %s\n", parameterChecksum(run.parameters).c_str());
  std::printf("bubble fraction: measured %.3f (idle share of the schedule, mean over stages), "
              "(p-1)/(m+p-1) = %.3f for p=%d stages, m=%d micro-batches\n",
              bubble, static_cast<double>(stages - 1) / (microbatches + stages - 1), stages,
              microbatches);
  if (!options.common.check) return 0;
  return matchesReference(run, *reference, trainConfig) ? 0 : 1;
}

}  // namespace
}  // namespace shoal::examples

int main(int argc, char** argv) {
  using namespace shoal::examples;
  Job job = Job::start(&argc, &argv);
  Flags flags(argc, argv);
  PpOptions options;
  options.common = commonOptions(flags);
  options.microbatches = flags.integer("--microbatches", options.microbatches,
                                       "micro-batches per global batch (m)");
  flags.finish("pp_train", "Pipeline-parallel training: one stage per rank, 1F1B over ncclSend/ncclRecv.");

  const int ranks = job.processCount() * options.common.threads;
  if (ranks > options.common.model.layers) {
    std::fprintf(stderr, "pp_train needs at least one layer per stage: %d ranks, --layers %d\n",
                 ranks, options.common.model.layers);
    return job.finish(2);
  }
  if (options.microbatches < 1 || options.common.train.globalBatch % options.microbatches != 0) {
    std::fprintf(stderr, "--batch %d must be a multiple of --microbatches %d\n",
                 options.common.train.globalBatch, options.microbatches);
    return job.finish(2);
  }
  TrainingRun reference;
  if (options.common.check) reference = trainSingleProcess(options.common.model, options.common.train);
  const int status = job.run(options.common.threads, [&](const RankContext& rank) {
    return train(rank, options, &reference);
  });
  return job.finish(status);
}
