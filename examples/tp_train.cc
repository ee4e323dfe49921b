// tp_train: Megatron-style tensor-parallel training of the tiny MLP
// (examples/common/model.h).
//
// Every rank sees the whole global batch but holds only a slice of each layer:
//   column-parallel layer (layers 0, 2, ...): rank r holds rows r of W and b
//     split by output feature, W_r [out/N x in]. Its input is replicated on
//     every rank, so the forward pass needs no communication and leaves each
//     rank a slice of the output features.
//   row-parallel layer (layers 1, 3, ...): rank r holds the columns of W for
//     the input features it already has, W_r [out x in/N]. Each rank's
//     product is a partial sum of the whole output: ncclAllReduce(sum) adds
//     them up, then every rank adds the (replicated) bias.
//   the last layer (the classifier head) is column-parallel with its output
//     gathered: ncclAllGather assembles the logits, so every rank computes
//     the same loss.
// Megatron names the two communication points f and g: g is the AllReduce
// after a row-parallel layer in the forward pass; f is its mirror in the
// backward pass, the AllReduce of the input gradient of a column-parallel
// layer (its input was replicated, so each rank holds only a partial sum of
// the gradient). Layer 0's input is the data, which needs no gradient, so its
// f is skipped.
//
// This needs an odd number of layers (column/row pairs, then the head) and
// hidden width and class count divisible by the rank count.
//
// Run: ./tp_train -t 4
//      mpirun -np 3 ./tp_train
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "common/check.h"
#include "common/launcher.h"
#include "common/model.h"
#include "common/options.h"
#include "common/rank_tools.h"

namespace shoal::examples {
namespace {

enum class Split { kColumn, kRow };

Split splitOf(int layer) { return layer % 2 == 0 ? Split::kColumn : Split::kRow; }

// One rank's slice of one layer: W_r then b (b_r for column-parallel, the
// whole b for row-parallel), contiguous, like the layer's block in the model.
struct LayerSlice {
  Split split = Split::kColumn;
  int in = 0;   // columns of W_r
  int out = 0;  // rows of W_r
  std::vector<float> params, grads, adamM, adamV;
  float* W() { return params.data(); }
  float* b() { return params.data() + static_cast<size_t>(in) * out; }
};

// Cuts this rank's slice out of the full layer block.
LayerSlice sliceLayer(const LayerShape& shape, const float* full, Split split, int rank, int ranks) {
  LayerSlice slice{.split = split};
  if (split == Split::kColumn) {
    slice.in = shape.in;
    slice.out = shape.out / ranks;
    const int firstRow = rank * slice.out;
    slice.params.assign(full + static_cast<size_t>(firstRow) * shape.in,
                        full + static_cast<size_t>(firstRow + slice.out) * shape.in);
    const float* b = full + shape.weightCount();
    slice.params.insert(slice.params.end(), b + firstRow, b + firstRow + slice.out);
  } else {
    slice.in = shape.in / ranks;
    slice.out = shape.out;
    const int firstColumn = rank * slice.in;
    for (int o = 0; o < shape.out; ++o) {
      const float* row = full + static_cast<size_t>(o) * shape.in + firstColumn;
      slice.params.insert(slice.params.end(), row, row + slice.in);
    }
    const float* b = full + shape.weightCount();
    slice.params.insert(slice.params.end(), b, b + shape.out);
  }
  slice.grads.assign(slice.params.size(), 0.0f);
  slice.adamM.assign(slice.params.size(), 0.0f);
  slice.adamV.assign(slice.params.size(), 0.0f);
  return slice;
}

// The inverse of sliceLayer over all ranks: the full layer block from every
// rank's slice (a collective).
void gatherLayer(const RankContext& rank, LayerSlice& slice, const LayerShape& shape, float* full) {
  const size_t weightSlice = static_cast<size_t>(slice.in) * slice.out;
  std::vector<float> weights(weightSlice * rank.size);
  CHECK_NCCL(ncclAllGather(slice.W(), weights.data(), weightSlice, ncclFloat, rank.comm, nullptr));
  float* b = full + shape.weightCount();
  if (slice.split == Split::kColumn) {
    // Row blocks in rank order are the rows of W in order.
    std::copy(weights.begin(), weights.end(), full);
    CHECK_NCCL(ncclAllGather(slice.b(), b, slice.out, ncclFloat, rank.comm, nullptr));
  } else {
    for (int r = 0; r < rank.size; ++r)
      for (int o = 0; o < shape.out; ++o)
        std::copy_n(weights.data() + r * weightSlice + static_cast<size_t>(o) * slice.in, slice.in,
                    full + static_cast<size_t>(o) * shape.in + r * slice.in);
    std::copy_n(slice.b(), shape.out, b);
  }
}

int train(const RankContext& rank, const CommonOptions& options, const TrainingRun* reference) {
  const ModelConfig& model = options.model;
  const TrainConfig& trainConfig = options.train;
  const ParamLayout layout = paramLayout(model);
  const int L = model.layers;
  const int rows = trainConfig.globalBatch;  // every rank sees the whole batch

  std::vector<LayerSlice> slices;
  {
    const std::vector<float> full = initialParameters(model);
    for (int l = 0; l < L; ++l)
      slices.push_back(sliceLayer(layout.layers[l], full.data() + layout.offsets[l], splitOf(l),
                                  rank.rank, rank.size));
  }

  TrainingRun run;
  bool replicatedIdentical = true;
  for (int step = 0; step < trainConfig.steps; ++step) {
    const Batch batch = batchSlice(model, trainConfig, step, 0, rows);

    // Forward. inputs[l] is what layer l reads: the whole activation before
    // a column-parallel layer, this rank's feature slice before a
    // row-parallel one. outputs[l] is what layer l produced after its ReLU.
    std::vector<std::vector<float>> inputs(L), outputs(L);
    inputs[0] = batch.features;
    for (int l = 0; l < L; ++l) {
      LayerSlice& slice = slices[l];
      std::vector<float>& y = outputs[l];
      y.resize(static_cast<size_t>(rows) * slice.out);
      if (slice.split == Split::kColumn) {
        linearForward(inputs[l].data(), rows, slice.in, slice.W(), slice.b(), slice.out, y.data());
      } else {
        // g: each rank's product is a partial sum over its input features.
        linearForward(inputs[l].data(), rows, slice.in, slice.W(), nullptr, slice.out, y.data());
        CHECK_NCCL(ncclAllReduce(y.data(), y.data(), y.size(), ncclFloat, ncclSum, rank.comm, nullptr));
        for (int r = 0; r < rows; ++r)
          for (int o = 0; o < slice.out; ++o) y[static_cast<size_t>(r) * slice.out + o] += slice.b()[o];
      }
      if (l < L - 1) {
        reluForward(y.data(), y.size());
        inputs[l + 1] = y;
      }
    }

    // The head's output: every rank's slice of the classes, gathered.
    const int classSlice = slices[L - 1].out;
    std::vector<float> gathered(static_cast<size_t>(rows) * model.classes);
    CHECK_NCCL(ncclAllGather(outputs[L - 1].data(), gathered.data(), outputs[L - 1].size(), ncclFloat,
                             rank.comm, nullptr));
    std::vector<float> logits(gathered.size());  // [rows x classes] from [rank][rows x classSlice]
    for (int r = 0; r < rank.size; ++r)
      for (int row = 0; row < rows; ++row)
        std::copy_n(gathered.data() + (static_cast<size_t>(r) * rows + row) * classSlice, classSlice,
                    logits.data() + static_cast<size_t>(row) * model.classes + r * classSlice);
    std::vector<float> dLogits(logits.size());
    const double loss = softmaxCrossEntropy(logits.data(), batch.labels.data(), rows, model.classes,
                                            1.0f / rows, dLogits.data()) / rows;
    run.losses.push_back(loss);
    if (rank.prints()) std::printf("step %d loss %.6f\n", step, loss);

    // Backward. dOutput starts as this rank's classes of dLogits.
    std::vector<float> dOutput(outputs[L - 1].size());
    for (int row = 0; row < rows; ++row)
      std::copy_n(dLogits.data() + static_cast<size_t>(row) * model.classes + rank.rank * classSlice,
                  classSlice, dOutput.data() + static_cast<size_t>(row) * classSlice);
    for (int l = L - 1; l >= 0; --l) {
      LayerSlice& slice = slices[l];
      std::fill(slice.grads.begin(), slice.grads.end(), 0.0f);
      if (l < L - 1) reluBackward(outputs[l].data(), dOutput.data(), dOutput.size());
      std::vector<float> dInput(l > 0 ? inputs[l].size() : 0);
      linearBackward(inputs[l].data(), dOutput.data(), rows, slice.in, slice.out, slice.W(),
                     slice.grads.data(), slice.grads.data() + static_cast<size_t>(slice.in) * slice.out,
                     l > 0 ? dInput.data() : nullptr);
      // f: a column-parallel layer's input gradient is a partial sum on each
      // rank. (A row-parallel layer's is already this rank's feature slice.)
      if (slice.split == Split::kColumn && l > 0)
        CHECK_NCCL(ncclAllReduce(dInput.data(), dInput.data(), dInput.size(), ncclFloat, ncclSum,
                                 rank.comm, nullptr));
      dOutput = std::move(dInput);
    }

    for (LayerSlice& slice : slices)
      adamUpdate(trainConfig, step + 1, slice.params.data(), slice.grads.data(), slice.adamM.data(),
                 slice.adamV.data(), slice.params.size());

    // Row-parallel biases live on every rank; they must stay identical.
    if (options.check)
      for (LayerSlice& slice : slices)
        if (slice.split == Split::kRow && !identicalOnAllRanks(rank.comm, slice.b(), slice.out))
          replicatedIdentical = false;
  }

  run.parameters.resize(layout.total);
  for (int l = 0; l < L; ++l)
    gatherLayer(rank, slices[l], layout.layers[l], run.parameters.data() + layout.offsets[l]);

  if (!rank.prints()) return 0;
  std::printf("final parameters: %s\n", parameterChecksum(run.parameters).c_str());
  if (!options.check) return 0;
  std::printf("check: replicated (row-parallel) biases bit-identical on all ranks: %s\n",
              replicatedIdentical ? "ok" : "MISMATCH");
  return matchesReference(run, *reference, trainConfig) && replicatedIdentical ? 0 : 1;
}

}  // namespace
}  // namespace shoal::examples

int main(int argc, char** argv) {
  using namespace shoal::examples;
  Job job = Job::start(&argc, &argv);
  Flags flags(argc, argv);
  CommonOptions options = commonOptions(flags);
  flags.finish("tp_train", "Megatron-style tensor-parallel training: column- and row-parallel layers.");

  const int ranks = job.processCount() * options.threads;
  if (options.model.layers % 2 == 0 || options.model.hidden % ranks != 0 ||
      options.model.classes % ranks != 0) {
    std::fprintf(stderr, "tp_train needs an odd --layers (now %d), and --hidden (%d) and "
                 "--classes (%d) divisible by the %d ranks\n",
                 options.model.layers, options.model.hidden, options.model.classes, ranks);
    return job.finish(2);
  }
  TrainingRun reference;
  if (options.check) reference = trainSingleProcess(options.model, options.train);
  const int status = job.run(options.threads, [&](const RankContext& rank) {
    return train(rank, options, &reference);
  });
  return job.finish(status);
}
