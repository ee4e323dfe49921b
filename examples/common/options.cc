// Command-line flags; see options.h.
#include "options.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace shoal::examples {

Flags::Flags(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-t") arg = "--threads";
    if (arg.rfind("--", 0) != 0) {
      error_ += "unexpected argument '" + arg + "'\n";
      continue;
    }
    const size_t equals = arg.find('=');
    if (equals != std::string::npos) {
      values_[arg.substr(0, equals)] = arg.substr(equals + 1);
    } else if (i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0 &&
               std::string(argv[i + 1]) != "-t") {
      values_[arg] = argv[++i];
    } else {
      bare_.push_back(arg);
    }
  }
}

const std::string* Flags::find(const std::string& name, const std::string& fallback,
                               const std::string& help) {
  asked_[name] = true;
  help_ += "  " + name + " (default " + fallback + "): " + help + "\n";
  auto it = values_.find(name);
  return it == values_.end() ? nullptr : &it->second;
}

int Flags::integer(const std::string& name, int fallback, const std::string& help) {
  const std::string* value = find(name, std::to_string(fallback), help);
  if (!value) return fallback;
  char* end = nullptr;
  long parsed = std::strtol(value->c_str(), &end, 10);
  if (end == value->c_str() || *end != '\0') error_ += name + " needs an integer, not '" + *value + "'\n";
  return static_cast<int>(parsed);
}

double Flags::real(const std::string& name, double fallback, const std::string& help) {
  char shown[32];
  std::snprintf(shown, sizeof shown, "%g", fallback);
  const std::string* value = find(name, shown, help);
  if (!value) return fallback;
  char* end = nullptr;
  double parsed = std::strtod(value->c_str(), &end);
  if (end == value->c_str() || *end != '\0') error_ += name + " needs a number, not '" + *value + "'\n";
  return parsed;
}

std::string Flags::text(const std::string& name, const std::string& fallback,
                        const std::string& help) {
  const std::string* value = find(name, fallback, help);
  return value ? *value : fallback;
}

bool Flags::present(const std::string& name, const std::string& help) {
  asked_[name] = true;
  help_ += "  " + name + ": " + help + "\n";
  for (const std::string& flag : bare_)
    if (flag == name) return true;
  if (values_.count(name)) error_ += name + " takes no value\n";
  return false;
}

void Flags::finish(const std::string& program, const std::string& summary) {
  bool wantsHelp = false;
  for (const std::string& flag : bare_) {
    if (flag == "--help") wantsHelp = true;
    else if (!asked_.count(flag)) error_ += "unknown flag " + flag + "\n";
  }
  for (const auto& [flag, value] : values_)
    if (!asked_.count(flag)) error_ += "unknown flag " + flag + "\n";
  if (wantsHelp || !error_.empty()) {
    std::FILE* out = wantsHelp ? stdout : stderr;
    if (!wantsHelp) std::fprintf(out, "%s", error_.c_str());
    std::fprintf(out, "usage: %s [flags]\n%s\n%s", program.c_str(), summary.c_str(), help_.c_str());
    std::exit(wantsHelp ? 0 : 2);
  }
}

CommonOptions commonOptions(Flags& flags, const ModelConfig& modelDefaults) {
  CommonOptions options;
  const ModelConfig& model = modelDefaults;
  const TrainConfig train;
  options.threads = flags.integer("--threads", 1, "rank threads per process (-t N)");
  options.check = flags.present("--check",
                                "also run the single-process reference and exit 1 unless the "
                                "losses and final parameters match it");
  options.model.layers = flags.integer("--layers", model.layers, "linear layers in the MLP");
  options.model.inputs = flags.integer("--inputs", model.inputs, "features per sample");
  options.model.hidden = flags.integer("--hidden", model.hidden, "width of the hidden layers");
  options.model.classes = flags.integer("--classes", model.classes, "classes of the data set");
  options.model.seed = static_cast<uint64_t>(
      flags.integer("--seed", static_cast<int>(model.seed), "seed of the data and the weights"));
  options.train.steps = flags.integer("--steps", train.steps, "optimizer steps");
  options.train.globalBatch = flags.integer("--batch", train.globalBatch, "global batch (samples per step)");
  options.train.learningRate = static_cast<float>(
      flags.real("--lr", train.learningRate, "Adam learning rate"));
  const int smallest = std::min({options.threads, options.model.layers, options.model.inputs,
                                 options.model.hidden, options.model.classes, options.train.steps,
                                 options.train.globalBatch});
  if (smallest < 1) {
    std::fprintf(stderr, "--threads, --layers, --inputs, --hidden, --classes, --steps and --batch "
                 "must all be at least 1\n");
    std::exit(2);
  }
  return options;
}

}  // namespace shoal::examples
