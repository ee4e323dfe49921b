// The tiny model, data set and optimizer; see model.h.
#include "model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numbers>

namespace shoal::examples {
namespace {

// SplitMix64: a counter-based generator, so sample i needs no sample i - 1.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

class Random {
 public:
  explicit Random(uint64_t seed) : state_(mix(seed)) {}
  uint64_t next() { return state_ = mix(state_); }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  // Standard normal (Box-Muller); written out so every platform draws the
  // same numbers, unlike std::normal_distribution.
  double normal() {
    double u = 1.0 - uniform();  // (0, 1], keeps log finite
    double v = uniform();
    return std::sqrt(-2.0 * std::log(u)) * std::cos(2.0 * std::numbers::pi * v);
  }

 private:
  uint64_t state_;
};

// Distinct streams for the parts that draw random numbers.
constexpr uint64_t kWeightsStream = 1;
constexpr uint64_t kCentersStream = 2;
constexpr uint64_t kSamplesStream = 3;

uint64_t streamSeed(uint64_t seed, uint64_t stream, uint64_t index) {
  return mix(mix(seed ^ (stream << 56)) ^ index);
}

}  // namespace

ParamLayout paramLayout(const ModelConfig& model) {
  ParamLayout layout;
  for (int l = 0; l < model.layers; ++l) {
    LayerShape shape{.in = l == 0 ? model.inputs : model.hidden,
                     .out = l == model.layers - 1 ? model.classes : model.hidden};
    layout.layers.push_back(shape);
    layout.offsets.push_back(layout.total);
    layout.total += shape.paramCount();
  }
  return layout;
}

std::vector<float> initialParameters(const ModelConfig& model) {
  ParamLayout layout = paramLayout(model);
  std::vector<float> params(layout.total);
  for (size_t l = 0; l < layout.layers.size(); ++l) {
    Random random(streamSeed(model.seed, kWeightsStream, l));
    const double bound = 1.0 / std::sqrt(static_cast<double>(layout.layers[l].in));
    float* block = params.data() + layout.offsets[l];
    for (size_t i = 0; i < layout.layers[l].paramCount(); ++i)
      block[i] = static_cast<float>((2.0 * random.uniform() - 1.0) * bound);
  }
  return params;
}

// ---- Data ---------------------------------------------------------------------

Batch batchSlice(const ModelConfig& model, const TrainConfig& train, int step, int firstRow,
                 int rowCount) {
  // Class c's samples scatter around centers[c] with unit noise; the centers
  // are close enough that the classes overlap and the loss falls slowly.
  constexpr double kCenterSpread = 0.6;
  std::vector<double> centers(static_cast<size_t>(model.classes) * model.inputs);
  Random centerRandom(streamSeed(model.seed, kCentersStream, 0));
  for (double& c : centers) c = kCenterSpread * centerRandom.normal();

  Batch batch;
  batch.rows = rowCount;
  batch.features.resize(static_cast<size_t>(rowCount) * model.inputs);
  batch.labels.resize(rowCount);
  for (int row = 0; row < rowCount; ++row) {
    const int64_t sample =
        (static_cast<int64_t>(step) * train.globalBatch + firstRow + row) % train.datasetSize;
    Random random(streamSeed(model.seed, kSamplesStream, static_cast<uint64_t>(sample)));
    const int label = static_cast<int>(random.next() % static_cast<uint64_t>(model.classes));
    batch.labels[row] = label;
    for (int d = 0; d < model.inputs; ++d)
      batch.features[static_cast<size_t>(row) * model.inputs + d] = static_cast<float>(
          centers[static_cast<size_t>(label) * model.inputs + d] + random.normal());
  }
  return batch;
}

// ---- Layer math -----------------------------------------------------------------

void linearForward(const float* x, int rows, int in, const float* W, const float* b, int out,
                   float* y) {
  for (int r = 0; r < rows; ++r) {
    const float* xRow = x + static_cast<size_t>(r) * in;
    for (int o = 0; o < out; ++o) {
      const float* wRow = W + static_cast<size_t>(o) * in;
      float sum = 0;
      for (int i = 0; i < in; ++i) sum += xRow[i] * wRow[i];
      y[static_cast<size_t>(r) * out + o] = b ? sum + b[o] : sum;
    }
  }
}

void linearBackward(const float* x, const float* dy, int rows, int in, int out, const float* W,
                    float* dW, float* db, float* dx) {
  for (int r = 0; r < rows; ++r) {
    const float* xRow = x + static_cast<size_t>(r) * in;
    const float* dyRow = dy + static_cast<size_t>(r) * out;
    for (int o = 0; o < out; ++o) {
      float* dwRow = dW + static_cast<size_t>(o) * in;
      const float g = dyRow[o];
      for (int i = 0; i < in; ++i) dwRow[i] += g * xRow[i];
      if (db) db[o] += g;
    }
  }
  if (!dx) return;
  for (int r = 0; r < rows; ++r) {
    const float* dyRow = dy + static_cast<size_t>(r) * out;
    float* dxRow = dx + static_cast<size_t>(r) * in;
    std::fill(dxRow, dxRow + in, 0.0f);
    for (int o = 0; o < out; ++o) {
      const float* wRow = W + static_cast<size_t>(o) * in;
      const float g = dyRow[o];
      for (int i = 0; i < in; ++i) dxRow[i] += g * wRow[i];
    }
  }
}

void reluForward(float* y, size_t count) {
  for (size_t i = 0; i < count; ++i) y[i] = std::max(y[i], 0.0f);
}

void reluBackward(const float* y, float* dy, size_t count) {
  for (size_t i = 0; i < count; ++i)
    if (!(y[i] > 0)) dy[i] = 0;
}

double softmaxCrossEntropy(const float* logits, const int* labels, int rows, int classes,
                           float gradScale, float* dlogits) {
  double lossSum = 0;
  std::vector<float> probabilities(classes);
  for (int r = 0; r < rows; ++r) {
    const float* z = logits + static_cast<size_t>(r) * classes;
    const float largest = *std::max_element(z, z + classes);
    float total = 0;
    for (int c = 0; c < classes; ++c) total += probabilities[c] = std::exp(z[c] - largest);
    for (int c = 0; c < classes; ++c) probabilities[c] /= total;
    lossSum -= std::log(static_cast<double>(probabilities[labels[r]]));
    float* g = dlogits + static_cast<size_t>(r) * classes;
    for (int c = 0; c < classes; ++c)
      g[c] = (probabilities[c] - (c == labels[r] ? 1.0f : 0.0f)) * gradScale;
  }
  return lossSum;
}

void layerForward(const ModelConfig& model, int layer, const float* params, const float* input,
                  int rows, float* output) {
  const LayerShape shape = paramLayout(model).layers[layer];
  linearForward(input, rows, shape.in, params, params + shape.weightCount(), shape.out, output);
  if (layer != model.layers - 1) reluForward(output, static_cast<size_t>(rows) * shape.out);
}

void layerBackward(const ModelConfig& model, int layer, const float* params, const float* input,
                   const float* output, float* dOutput, int rows, float* grads, float* dInput) {
  const LayerShape shape = paramLayout(model).layers[layer];
  if (layer != model.layers - 1) reluBackward(output, dOutput, static_cast<size_t>(rows) * shape.out);
  linearBackward(input, dOutput, rows, shape.in, shape.out, params, grads,
                 grads + shape.weightCount(), dInput);
}

// ---- Optimizer ----------------------------------------------------------------

void adamUpdate(const TrainConfig& train, int step, float* params, const float* grads, float* m,
                float* v, size_t count) {
  const float mScale = 1.0f / (1.0f - std::pow(train.beta1, static_cast<float>(step)));
  const float vScale = 1.0f / (1.0f - std::pow(train.beta2, static_cast<float>(step)));
  for (size_t i = 0; i < count; ++i) {
    m[i] = train.beta1 * m[i] + (1 - train.beta1) * grads[i];
    v[i] = train.beta2 * v[i] + (1 - train.beta2) * grads[i] * grads[i];
    params[i] -= train.learningRate * (m[i] * mScale) / (std::sqrt(v[i] * vScale) + train.epsilon);
  }
}

// ---- Reference and checks ---------------------------------------------------

TrainingRun trainSingleProcess(const ModelConfig& model, const TrainConfig& train) {
  const ParamLayout layout = paramLayout(model);
  const int L = model.layers;
  TrainingRun run;
  run.parameters = initialParameters(model);
  std::vector<float> grads(layout.total), m(layout.total), v(layout.total);

  for (int step = 0; step < train.steps; ++step) {
    Batch batch = batchSlice(model, train, step, 0, train.globalBatch);
    const int rows = batch.rows;
    // activations[l] is the input of layer l; activations[L] the logits.
    std::vector<std::vector<float>> activations(L + 1);
    activations[0] = batch.features;
    for (int l = 0; l < L; ++l) {
      activations[l + 1].resize(static_cast<size_t>(rows) * layout.layers[l].out);
      layerForward(model, l, run.parameters.data() + layout.offsets[l], activations[l].data(),
                   rows, activations[l + 1].data());
    }
    std::vector<float> dOutput(activations[L].size());
    const double lossSum = softmaxCrossEntropy(activations[L].data(), batch.labels.data(), rows,
                                               model.classes, 1.0f / rows, dOutput.data());
    run.losses.push_back(lossSum / rows);

    std::fill(grads.begin(), grads.end(), 0.0f);
    for (int l = L - 1; l >= 0; --l) {
      std::vector<float> dInput(l > 0 ? activations[l].size() : 0);
      layerBackward(model, l, run.parameters.data() + layout.offsets[l], activations[l].data(),
                    activations[l + 1].data(), dOutput.data(), rows,
                    grads.data() + layout.offsets[l], l > 0 ? dInput.data() : nullptr);
      dOutput = std::move(dInput);
    }
    adamUpdate(train, step + 1, run.parameters.data(), grads.data(), m.data(), v.data(),
               layout.total);
  }
  return run;
}

std::string parameterChecksum(const std::vector<float>& parameters) {
  double sum = 0, squares = 0;
  uint64_t hash = 0xcbf29ce484222325ull;  // FNV-1a over the float bits
  for (float p : parameters) {
    sum += p;
    squares += static_cast<double>(p) * p;
    uint32_t bits;
    std::memcpy(&bits, &p, sizeof bits);
    for (int byte = 0; byte < 4; ++byte) {
      hash ^= (bits >> (8 * byte)) & 0xff;
      hash *= 0x100000001b3ull;
    }
  }
  char text[128];
  std::snprintf(text, sizeof text, "sum=%.9g norm=%.9g bits=%016llx", sum, std::sqrt(squares),
                static_cast<unsigned long long>(hash));
  return text;
}

namespace {

// Largest |a - b|, where, and whether |a - b| <= absolute + relative * |b|
// holds for every pair.
template <typename T>
bool withinTolerance(const std::vector<T>& a, const std::vector<T>& b, double absolute,
                     double relative, double* largest, size_t* where) {
  *largest = 0;
  *where = 0;
  if (a.size() != b.size()) return false;
  bool ok = true;
  for (size_t i = 0; i < a.size(); ++i) {
    const double difference = std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
    if (difference > *largest) {
      *largest = difference;
      *where = i;
    }
    if (!(difference <= absolute + relative * std::fabs(static_cast<double>(b[i])))) ok = false;
  }
  return ok;
}

}  // namespace

bool matchesReference(const TrainingRun& run, const TrainingRun& reference, const TrainConfig& train) {
  double lossDifference = 0, parameterDifference = 0;
  size_t worstStep = 0, worstParameter = 0;
  const bool lossesOk = withinTolerance(run.losses, reference.losses, 0, kLossTolerance,
                                        &lossDifference, &worstStep);
  const double adamAbsolute = kAdamStepTolerance * train.learningRate;
  const bool parametersOk = withinTolerance(run.parameters, reference.parameters, adamAbsolute,
                                            kParameterTolerance, &parameterDifference, &worstParameter);
  std::printf("check: losses vs single-process run: max |difference| %.3g at step %zu, tolerance "
              "%.0e * |loss|: %s\n",
              lossDifference, worstStep, kLossTolerance, lossesOk ? "ok" : "MISMATCH");
  std::printf("check: final parameters vs single-process run: max |difference| %.3g at parameter "
              "%zu, tolerance %.0e * |parameter| + %.0e * lr: %s\n",
              parameterDifference, worstParameter, kParameterTolerance, kAdamStepTolerance,
              parametersOk ? "ok" : "MISMATCH");
  return lossesOk && parametersOk;
}

}  // namespace shoal::examples
