// The tiny model, data set and optimizer that every example trains.
//
// Model: a multi-layer perceptron of `layers` linear layers (3 by default),
// float32: inputs -> hidden -> ... -> hidden -> classes, ReLU after every
// layer but the last, softmax cross-entropy on the last. Layer l computes
// y = x W^T + b with W stored row-major as [out x in] and b right after W,
// so a layer's parameters are one contiguous block and the whole model is
// one flat vector (`ParamLayout` says where each layer starts).
//
// Data: a seeded synthetic classification task, generated in code: one
// Gaussian cluster per class in `inputs` dimensions. Sample i is a pure
// function of (seed, i), so any rank can make any slice of any batch.
//
// Optimizer: Adam, element-wise, so a rank that owns a slice of the
// parameters can update exactly that slice (what ZeRO relies on).
//
// Reference: trainSingleProcess() is the plain one-process training on the
// same global batches; every example's --check compares against it.
//
// Threads: everything here is pure or works on caller-owned memory, so rank
// threads use it concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace shoal::examples {

struct ModelConfig {
  int inputs = 24;    // features per sample
  int hidden = 96;    // width of every hidden layer
  int classes = 12;   // output width
  int layers = 3;     // linear layers, >= 2
  uint64_t seed = 2024;
};

struct TrainConfig {
  int steps = 8;              // optimizer steps
  int globalBatch = 48;       // samples per step, over all ranks
  int datasetSize = 3072;     // samples before the batches wrap around
  float learningRate = 3e-3f;
  float beta1 = 0.9f;         // Adam
  float beta2 = 0.999f;
  float epsilon = 1e-8f;
};

// One linear layer y = x W^T + b: W is [out x in], then b is [out].
struct LayerShape {
  int in = 0;
  int out = 0;
  size_t weightCount() const { return static_cast<size_t>(in) * out; }
  size_t paramCount() const { return weightCount() + out; }
};

// Where each layer's parameters sit in the flat parameter vector.
struct ParamLayout {
  std::vector<LayerShape> layers;
  std::vector<size_t> offsets;  // offsets[l] = first parameter of layer l
  size_t total = 0;
};
ParamLayout paramLayout(const ModelConfig& model);

// The seeded initial parameters of the whole model (PyTorch's default range
// for nn.Linear: uniform in +-1/sqrt(in)).
std::vector<float> initialParameters(const ModelConfig& model);

// ---- Data -------------------------------------------------------------------

struct Batch {
  int rows = 0;
  std::vector<float> features;  // [rows x inputs]
  std::vector<int> labels;      // [rows]
};

// Rows [firstRow, firstRow + rowCount) of the global batch of `step`.
Batch batchSlice(const ModelConfig& model, const TrainConfig& train, int step, int firstRow,
                 int rowCount);

// ---- Layer math (row-major, rows = samples) --------------------------------

// y = x W^T (+ b when b is not null). x [rows x in], W [out x in], y [rows x out].
void linearForward(const float* x, int rows, int in, const float* W, const float* b, int out,
                   float* y);

// Given dy [rows x out]: dW += dy^T x, db += column sums of dy (when db is
// not null), dx = dy W (when dx is not null; overwritten).
void linearBackward(const float* x, const float* dy, int rows, int in, int out, const float* W,
                    float* dW, float* db, float* dx);

void reluForward(float* y, size_t count);
// dy *= (y > 0), where y is the ReLU's output.
void reluBackward(const float* y, float* dy, size_t count);

// Softmax cross-entropy of logits [rows x classes]. Returns the summed loss of
// the rows; writes dlogits = (softmax - onehot) * gradScale.
double softmaxCrossEntropy(const float* logits, const int* labels, int rows, int classes,
                           float gradScale, float* dlogits);

// One whole layer as the examples use it: linear, then ReLU unless it is the
// last layer. `params` is the layer's block (W then b).
void layerForward(const ModelConfig& model, int layer, const float* params, const float* input,
                  int rows, float* output);
// Backward of layerForward. `output` is what layerForward wrote; dOutput is
// the gradient at the output (the ReLU mask is applied to it in place).
// Gradients are added to `grads` (the layer's block, W then b); dInput, when
// not null, receives the gradient at the input.
void layerBackward(const ModelConfig& model, int layer, const float* params, const float* input,
                   const float* output, float* dOutput, int rows, float* grads, float* dInput);

// ---- Optimizer ----------------------------------------------------------------

// Adam on `count` elements: params -= lr * mhat / (sqrt(vhat) + eps), where m
// and v are this slice's moments. `step` counts from 1.
void adamUpdate(const TrainConfig& train, int step, float* params, const float* grads, float* m,
                float* v, size_t count);

// ---- Reference and checks ---------------------------------------------------

struct TrainingRun {
  std::vector<double> losses;      // mean loss over the global batch, per step
  std::vector<float> parameters;   // final parameters (flat layout)
};

// The single-process run of the same global batches.
TrainingRun trainSingleProcess(const ModelConfig& model, const TrainConfig& train);

// "sum=... norm=... bits=0x...": sums in double, and a hash of the exact bits.
std::string parameterChecksum(const std::vector<float>& parameters);

// Agreement with the reference. A distributed run sums the same numbers in
// another order (per-rank partial sums, then the collective's order), so it
// matches the single-process run to rounding, not to the bit:
//   losses:      |a - b| <= kLossTolerance * |b|
//   parameters:  |a - b| <= kParameterTolerance * |b| + kAdamStepTolerance * learningRate
// The second term is Adam's: it divides each gradient by its own running
// magnitude, so an element whose gradient is almost zero (a nearly dead ReLU
// unit) turns a rounding difference into a visible fraction of one step of
// size learningRate.
inline constexpr double kLossTolerance = 1e-6;
inline constexpr double kParameterTolerance = 1e-4;
inline constexpr double kAdamStepTolerance = 1e-2;

// Prints the largest differences; returns true when within tolerance.
bool matchesReference(const TrainingRun& run, const TrainingRun& reference, const TrainConfig& train);

}  // namespace shoal::examples
