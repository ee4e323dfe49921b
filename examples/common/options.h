// Command-line flags shared by the examples.
//
// Flags are "--name value" (or "--name=value"); "-t N" is short for
// "--threads N". An example asks for each flag it knows, with a default and a
// line of help, then calls finish(): --help prints the collected help, and a
// flag nobody asked for is an error (a typo must not silently train the
// default model).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "model.h"

namespace shoal::examples {

class Flags {
 public:
  Flags(int argc, char** argv);

  int integer(const std::string& name, int fallback, const std::string& help);
  double real(const std::string& name, double fallback, const std::string& help);
  std::string text(const std::string& name, const std::string& fallback, const std::string& help);
  // A flag without a value: true when present.
  bool present(const std::string& name, const std::string& help);

  // Exits 0 after printing help for --help, or 2 for an unknown flag.
  void finish(const std::string& program, const std::string& summary);

 private:
  const std::string* find(const std::string& name, const std::string& fallback,
                          const std::string& help);

  std::map<std::string, std::string> values_;  // "--steps" -> "20"
  std::vector<std::string> bare_;              // flags without a value
  std::map<std::string, bool> asked_;
  std::string help_;
  std::string error_;
};

// The flags every example takes.
struct CommonOptions {
  ModelConfig model;
  TrainConfig train;
  int threads = 1;     // rank threads per process (-t)
  bool check = false;  // compare with the single-process run; exit 1 on mismatch
};
// `modelDefaults` lets an example pick another default model shape.
CommonOptions commonOptions(Flags& flags, const ModelConfig& modelDefaults = {});

}  // namespace shoal::examples
