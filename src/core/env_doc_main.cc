// shoal_env_doc: prints docs/env.md from the parameter registry.
//   build/src/api/shoal_env_doc > docs/env.md
#include <cstdio>

#include "core/params.h"

int main() {
  std::fputs(shoal::paramsMarkdown().c_str(), stdout);
  return 0;
}
