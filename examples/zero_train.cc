// zero_train: data-parallel training with ZeRO sharding (DeepSpeed's "Zero
// Redundancy Optimizer") of the tiny MLP (examples/common/model.h).
//
// As in dp_train, every rank takes its own rows of every global batch. Unlike
// it, each rank keeps only its shard of what the optimizer needs:
//   --stage 1  Adam's moments (m, v) are sharded. Gradients are averaged with
//              ncclAllReduce; each rank updates its shard of the parameters,
//              then ncclAllGather puts the full parameters back on every rank.
//   --stage 2  gradients are sharded too: right after the backward pass of a
//              layer, ncclReduceScatter(ncclAvg) leaves each rank the average
//              of its shard only, and the full layer gradient is freed.
//   --stage 3  parameters are sharded too: ncclAllGather assembles a layer's
//              parameters just before its forward and again before its
//              backward, and they are freed right after.
//
// Vocabulary: every layer's parameters (W then b) are padded to a multiple of
// the rank count and cut into `ranks` equal shards; rank r owns shard r of
// every layer. Adam is element-wise, so updating a shard alone gives exactly
// the numbers the unsharded update gives.
//
// A ledger counts the bytes of parameters, gradients and optimizer state each
// rank holds (not activations), and the run ends by printing the peak next to
// what one unsharded rank holds.
//
// Run: ./zero_train --stage 3 -t 4
//      mpirun -np 4 ./zero_train --stage 2
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <vector>

#include "common/check.h"
#include "common/launcher.h"
#include "common/model.h"
#include "common/options.h"
#include "common/rank_tools.h"

namespace shoal::examples {
namespace {

// ---- Memory ledger --------------------------------------------------------------

enum Kind { kParameters = 0, kGradients = 1, kOptimizer = 2, kKinds = 3 };

// Bytes held now and at the peak, per kind and in total, for one rank.
class Ledger {
 public:
  void add(Kind kind, size_t bytes) {
    now_[kind] += bytes;
    peak_[kind] = std::max(peak_[kind], now_[kind]);
    const size_t total = now_[0] + now_[1] + now_[2];
    peakTotal_ = std::max(peakTotal_, total);
  }
  void remove(Kind kind, size_t bytes) { now_[kind] -= bytes; }
  size_t peak(Kind kind) const { return peak_[kind]; }
  size_t peakTotal() const { return peakTotal_; }

 private:
  size_t now_[kKinds] = {};
  size_t peak_[kKinds] = {};
  size_t peakTotal_ = 0;
};

// A float buffer whose bytes the ledger counts from construction to
// destruction, so "freed after use" is simply the end of a scope.
class CountedBuffer {
 public:
  CountedBuffer(Ledger& ledger, Kind kind, size_t count)
      : ledger_(ledger), kind_(kind), data_(count) {
    ledger_.add(kind_, count * sizeof(float));
  }
  ~CountedBuffer() { ledger_.remove(kind_, data_.size() * sizeof(float)); }
  CountedBuffer(const CountedBuffer&) = delete;
  CountedBuffer& operator=(const CountedBuffer&) = delete;

  float* data() { return data_.data(); }
  size_t size() const { return data_.size(); }
  void zero() { std::fill(data_.begin(), data_.end(), 0.0f); }

 private:
  Ledger& ledger_;
  Kind kind_;
  std::vector<float> data_;
};

// ---- Sharding -----------------------------------------------------------------

// Where each layer's padded block and each rank's shard of it sit.
struct Sharding {
  std::vector<size_t> padded;        // layer l's parameter count, rounded up to a multiple of ranks
  std::vector<size_t> paddedOffset;  // layer l in the padded full layout
  std::vector<size_t> shard;         // padded[l] / ranks
  std::vector<size_t> shardOffset;   // layer l's shard in this rank's shard vector
  size_t paddedTotal = 0;
  size_t shardTotal = 0;
  size_t largestPadded = 0;
};

Sharding makeSharding(const ParamLayout& layout, int ranks) {
  Sharding s;
  for (const LayerShape& shape : layout.layers) {
    const size_t padded = (shape.paramCount() + ranks - 1) / ranks * ranks;
    s.padded.push_back(padded);
    s.paddedOffset.push_back(s.paddedTotal);
    s.shard.push_back(padded / ranks);
    s.shardOffset.push_back(s.shardTotal);
    s.paddedTotal += padded;
    s.shardTotal += padded / ranks;
    s.largestPadded = std::max(s.largestPadded, padded);
  }
  return s;
}

// Copies the flat (unpadded) parameters into the padded layout, or this
// rank's shards of them.
void toPadded(const ParamLayout& layout, const Sharding& s, const std::vector<float>& flat,
              float* padded) {
  for (size_t l = 0; l < layout.layers.size(); ++l) {
    std::fill(padded + s.paddedOffset[l], padded + s.paddedOffset[l] + s.padded[l], 0.0f);
    std::copy_n(flat.data() + layout.offsets[l], layout.layers[l].paramCount(),
                padded + s.paddedOffset[l]);
  }
}

std::vector<float> fromPadded(const ParamLayout& layout, const Sharding& s, const float* padded) {
  std::vector<float> flat(layout.total);
  for (size_t l = 0; l < layout.layers.size(); ++l)
    std::copy_n(padded + s.paddedOffset[l], layout.layers[l].paramCount(),
                flat.data() + layout.offsets[l]);
  return flat;
}

// ---- Training -----------------------------------------------------------------

struct ZeroOptions {
  CommonOptions common;
  int stage = 1;
};

int train(const RankContext& rank, const ZeroOptions& options, const TrainingRun* reference) {
  const ModelConfig& model = options.common.model;
  const TrainConfig& trainConfig = options.common.train;
  const ParamLayout layout = paramLayout(model);
  const Sharding sharding = makeSharding(layout, rank.size);
  const int L = model.layers;
  const int stage = options.stage;
  const int rows = trainConfig.globalBatch / rank.size;
  Ledger ledger;

  // What every stage keeps for the whole run. Stages 1 and 2 hold the full
  // (padded) parameters; stage 3 only this rank's shards.
  const size_t parameterCount = stage < 3 ? sharding.paddedTotal : sharding.shardTotal;
  const size_t gradientCount = stage < 2 ? sharding.paddedTotal : sharding.shardTotal;
  CountedBuffer params(ledger, kParameters, parameterCount);
  CountedBuffer grads(ledger, kGradients, gradientCount);
  CountedBuffer adamM(ledger, kOptimizer, sharding.shardTotal);
  CountedBuffer adamV(ledger, kOptimizer, sharding.shardTotal);
  {
    std::vector<float> padded(sharding.paddedTotal);
    toPadded(layout, sharding, initialParameters(model), padded.data());
    if (stage < 3) {
      std::copy(padded.begin(), padded.end(), params.data());
    } else {
      for (int l = 0; l < L; ++l)
        std::copy_n(padded.data() + sharding.paddedOffset[l] + rank.rank * sharding.shard[l],
                    sharding.shard[l], params.data() + sharding.shardOffset[l]);
    }
  }

  // Where this rank's shard of layer l is: inside the full buffers (stages
  // with full parameters or gradients) or at shardOffset in a shard buffer.
  auto paramShard = [&](int l) {
    return params.data() + (stage < 3 ? sharding.paddedOffset[l] + rank.rank * sharding.shard[l]
                                      : sharding.shardOffset[l]);
  };
  auto gradShard = [&](int l) {
    return grads.data() + (stage < 2 ? sharding.paddedOffset[l] + rank.rank * sharding.shard[l]
                                     : sharding.shardOffset[l]);
  };

  // Stage 3's only way to see a whole layer: gather it into a buffer that
  // lives until the caller drops it.
  auto gatherLayer = [&](int l) {
    auto full = std::make_unique<CountedBuffer>(ledger, kParameters, sharding.padded[l]);
    CHECK_NCCL(ncclAllGather(paramShard(l), full->data(), sharding.shard[l], ncclFloat, rank.comm,
                             nullptr));
    return full;
  };

  TrainingRun run;
  bool identicalEveryStep = true;
  for (int step = 0; step < trainConfig.steps; ++step) {
    const Batch batch = batchSlice(model, trainConfig, step, rank.rank * rows, rows);

    // Forward. activations[l] is the input of layer l, activations[L] the logits.
    std::vector<std::vector<float>> activations(L + 1);
    activations[0] = batch.features;
    for (int l = 0; l < L; ++l) {
      activations[l + 1].resize(static_cast<size_t>(rows) * layout.layers[l].out);
      std::unique_ptr<CountedBuffer> gathered = stage == 3 ? gatherLayer(l) : nullptr;
      const float* layerParams = stage == 3 ? gathered->data() : params.data() + sharding.paddedOffset[l];
      layerForward(model, l, layerParams, activations[l].data(), rows, activations[l + 1].data());
    }  // stage 3: the gathered layer is freed here
    std::vector<float> dOutput(activations[L].size());
    const double localLoss = softmaxCrossEntropy(activations[L].data(), batch.labels.data(), rows,
                                                 model.classes, 1.0f / rows, dOutput.data()) / rows;

    // Backward.
    if (stage < 2) grads.zero();
    for (int l = L - 1; l >= 0; --l) {
      std::unique_ptr<CountedBuffer> gathered = stage == 3 ? gatherLayer(l) : nullptr;
      const float* layerParams = stage == 3 ? gathered->data() : params.data() + sharding.paddedOffset[l];
      std::vector<float> dInput(l > 0 ? activations[l].size() : 0);
      if (stage == 1) {
        layerBackward(model, l, layerParams, activations[l].data(), activations[l + 1].data(),
                      dOutput.data(), rows, grads.data() + sharding.paddedOffset[l],
                      l > 0 ? dInput.data() : nullptr);
      } else {
        // Stages 2 and 3: the layer's full gradient exists only until the
        // ReduceScatter has left this rank the average of its shard.
        CountedBuffer layerGrads(ledger, kGradients, sharding.padded[l]);
        layerGrads.zero();
        layerBackward(model, l, layerParams, activations[l].data(), activations[l + 1].data(),
                      dOutput.data(), rows, layerGrads.data(), l > 0 ? dInput.data() : nullptr);
        CHECK_NCCL(ncclReduceScatter(layerGrads.data(), gradShard(l), sharding.shard[l], ncclFloat,
                                     ncclAvg, rank.comm, nullptr));
      }
      dOutput = std::move(dInput);
    }
    if (stage == 1)
      CHECK_NCCL(ncclAllReduce(grads.data(), grads.data(), grads.size(), ncclFloat, ncclAvg,
                               rank.comm, nullptr));

    // Each rank updates only its shards, with only its shards of m and v.
    for (int l = 0; l < L; ++l)
      adamUpdate(trainConfig, step + 1, paramShard(l), gradShard(l),
                 adamM.data() + sharding.shardOffset[l], adamV.data() + sharding.shardOffset[l],
                 sharding.shard[l]);

    // Stages 1 and 2 keep full parameters: gather every layer's updated
    // shards (in place: each rank's shard already sits at its slot).
    if (stage < 3) {
      CHECK_NCCL(ncclGroupStart());
      for (int l = 0; l < L; ++l)
        CHECK_NCCL(ncclAllGather(paramShard(l), params.data() + sharding.paddedOffset[l],
                                 sharding.shard[l], ncclFloat, rank.comm, nullptr));
      CHECK_NCCL(ncclGroupEnd());
    }

    const double loss = sumOverRanks(rank.comm, localLoss) / rank.size;
    run.losses.push_back(loss);
    if (rank.prints()) std::printf("step %d loss %.6f\n", step, loss);
    if (options.common.check && stage < 3 &&
        !identicalOnAllRanks(rank.comm, params.data(), params.size()))
      identicalEveryStep = false;
  }

  // The whole model once more, outside the ledger, for the checksum.
  {
    std::vector<float> padded(sharding.paddedTotal);
    if (stage < 3) {
      std::copy_n(params.data(), padded.size(), padded.data());
    } else {
      CHECK_NCCL(ncclGroupStart());
      for (int l = 0; l < L; ++l)
        CHECK_NCCL(ncclAllGather(paramShard(l), padded.data() + sharding.paddedOffset[l],
                                 sharding.shard[l], ncclFloat, rank.comm, nullptr));
      CHECK_NCCL(ncclGroupEnd());
    }
    run.parameters = fromPadded(layout, sharding, padded.data());
  }

  const double peakParameterBytes = maxOverRanks(rank.comm, static_cast<double>(ledger.peak(kParameters)));
  const double peakGradientBytes = maxOverRanks(rank.comm, static_cast<double>(ledger.peak(kGradients)));
  const double peakOptimizerBytes = maxOverRanks(rank.comm, static_cast<double>(ledger.peak(kOptimizer)));
  const double peakTotalBytes = maxOverRanks(rank.comm, static_cast<double>(ledger.peakTotal()));
  if (!rank.prints()) return 0;

  const double fullBytes = static_cast<double>(layout.total * sizeof(float));
  std::printf("final parameters: %s\n", parameterChecksum(run.parameters).c_str());
  std::printf("peak bytes per rank     parameters   gradients   optimizer       total\n");
  std::printf("ZeRO-%d on %d rank%s %12.0f %11.0f %11.0f %11.0f\n", stage, rank.size,
              rank.size == 1 ? " " : "s", peakParameterBytes, peakGradientBytes, peakOptimizerBytes,
              peakTotalBytes);
  std::printf("unsharded          %12.0f %11.0f %11.0f %11.0f\n", fullBytes, fullBytes,
              2 * fullBytes, 4 * fullBytes);
  if (!options.common.check) return 0;

  bool ok = matchesReference(run, *reference, trainConfig);
  if (stage < 3) {
    std::printf("check: parameters bit-identical on all ranks after every step: %s\n",
                identicalEveryStep ? "ok" : "MISMATCH");
    ok = ok && identicalEveryStep;
  } else {
    // Shards of every layer (1/N of the model, plus padding to a multiple of
    // N per layer) and one gathered layer at a time.
    const double bound = (fullBytes + L * rank.size * sizeof(float)) / rank.size +
                         sharding.largestPadded * sizeof(float);
    const bool withinBound = peakParameterBytes <= bound;
    std::printf("check: peak parameter bytes %.0f <= model/%d + one layer = %.0f: %s\n",
                peakParameterBytes, rank.size, bound, withinBound ? "ok" : "MISMATCH");
    ok = ok && withinBound;
  }
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace shoal::examples

int main(int argc, char** argv) {
  using namespace shoal::examples;
  Job job = Job::start(&argc, &argv);
  Flags flags(argc, argv);
  ZeroOptions options;
  // Eight layers by default, so that no single layer is most of the model
  // and stage 3's "1/N of the model plus one layer" is visibly less than all.
  options.common = commonOptions(flags, ModelConfig{.layers = 8});
  options.stage = flags.integer("--stage", 1, "1: shard Adam's state; 2: and gradients; 3: and parameters");
  flags.finish("zero_train", "Data-parallel training with ZeRO stage 1, 2 or 3 sharding.");

  const int ranks = job.processCount() * options.common.threads;
  if (options.stage < 1 || options.stage > 3) {
    std::fprintf(stderr, "--stage must be 1, 2 or 3\n");
    return job.finish(2);
  }
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
