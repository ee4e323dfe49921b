// NCCL 2.30's parameter API over Shoal's one parameter registry
// (src/core/params.def): keys are the environment variable names.
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <type_traits>
#include <vector>

#include "api/api_guard.h"
#include "core/params.h"

using namespace shoal;
using shoal::api::guard;

struct ncclParamHandle {
  std::string key;
  std::string value;  // effective: as set, else the default
};

namespace {

struct ParamTable {
  std::vector<ncclParamHandle> entries;
  std::vector<const char*> keys;
};

ParamTable& table() {
  static ParamTable* t = [] {
    auto* table = new ParamTable();
    for (const auto& p : describeParams()) {
      std::string def = p.defaultValue;
      if (def.size() >= 2 && def.front() == '"') def = def.substr(1, def.size() - 2);
      table->entries.push_back({p.env, p.isSet ? p.value : def});
    }
    for (auto& e : table->entries) table->keys.push_back(e.key.c_str());
    return table;
  }();
  return *t;
}

Result<ncclParamHandle*> lookup(const char* key) {
  if (key == nullptr) return invalidArgument("key is NULL");
  for (auto& e : table().entries)
    if (e.key == key) return &e;
  return invalidArgument("unknown parameter '", key, "'");
}

template <typename T>
Status getInteger(ncclParamHandle_t handle, T* out) {
  if (handle == nullptr || out == nullptr) return invalidArgument("NULL handle or output");
  errno = 0;
  char* end = nullptr;
  if constexpr (std::is_signed_v<T>) {
    long long v = std::strtoll(handle->value.c_str(), &end, 0);
    if (errno || end == handle->value.c_str() || *end || v < std::numeric_limits<T>::min() ||
        v > std::numeric_limits<T>::max())
      return invalidArgument("parameter ", handle->key, "='", handle->value,
                             "' does not fit the requested integer type");
    *out = static_cast<T>(v);
  } else {
    unsigned long long v = std::strtoull(handle->value.c_str(), &end, 0);
    if (errno || end == handle->value.c_str() || *end || handle->value[0] == '-' ||
        v > std::numeric_limits<T>::max())
      return invalidArgument("parameter ", handle->key, "='", handle->value,
                             "' does not fit the requested integer type");
    *out = static_cast<T>(v);
  }
  return Status::ok();
}

}  // namespace

SHOAL_API(ncclResult_t, ncclParamBind, (ncclParamHandle_t * out, const char* key)) {
  return guard("ncclParamBind", [&]() -> Status {
    if (out == nullptr) return invalidArgument("out is NULL");
    SHOAL_ASSIGN_OR_RETURN(*out, lookup(key));
    return Status::ok();
  });
}

#define SHOAL_PARAM_GETTER(Suffix, T)                                           \
  SHOAL_API(ncclResult_t, ncclParamGet##Suffix, (ncclParamHandle_t handle, T * out)) { \
    return guard("ncclParamGet" #Suffix, [&] { return getInteger(handle, out); });     \
  }
SHOAL_PARAM_GETTER(I8, int8_t)
SHOAL_PARAM_GETTER(I16, int16_t)
SHOAL_PARAM_GETTER(I32, int32_t)
SHOAL_PARAM_GETTER(I64, int64_t)
SHOAL_PARAM_GETTER(U8, uint8_t)
SHOAL_PARAM_GETTER(U16, uint16_t)
SHOAL_PARAM_GETTER(U32, uint32_t)
SHOAL_PARAM_GETTER(U64, uint64_t)
#undef SHOAL_PARAM_GETTER

SHOAL_API(ncclResult_t, ncclParamGetStr, (ncclParamHandle_t handle, const char** out)) {
  return guard("ncclParamGetStr", [&]() -> Status {
    if (handle == nullptr || out == nullptr) return invalidArgument("NULL handle or output");
    *out = handle->value.c_str();
    return Status::ok();
  });
}

SHOAL_API(ncclResult_t, ncclParamGet,
          (ncclParamHandle_t handle, void* out, int maxLen, int* len)) {
  return guard("ncclParamGet", [&]() -> Status {
    if (handle == nullptr || len == nullptr) return invalidArgument("NULL handle or len");
    int need = static_cast<int>(handle->value.size()) + 1;
    *len = need;
    if (out == nullptr || maxLen < need)
      return invalidArgument("ncclParamGet: ", handle->key, " needs ", need, " bytes, got ", maxLen);
    std::memcpy(out, handle->value.c_str(), need);
    return Status::ok();
  });
}

SHOAL_API(ncclResult_t, ncclParamGetParameter,
          (const char* key, const char** value, int* valueLen)) {
  return guard("ncclParamGetParameter", [&]() -> Status {
    if (value == nullptr || valueLen == nullptr) return invalidArgument("NULL output");
    // As NCCL: an unknown key clears the outputs before the error.
    *value = nullptr;
    *valueLen = 0;
    SHOAL_ASSIGN_OR_RETURN(ncclParamHandle * h, lookup(key));
    *value = h->value.c_str();
    *valueLen = static_cast<int>(h->value.size());
    return Status::ok();
  });
}

SHOAL_API(ncclResult_t, ncclParamGetAllParameterKeys, (const char*** tableOut, int* tableLen)) {
  return guard("ncclParamGetAllParameterKeys", [&]() -> Status {
    if (tableOut == nullptr || tableLen == nullptr) return invalidArgument("NULL output");
    *tableOut = table().keys.data();
    *tableLen = static_cast<int>(table().keys.size());
    return Status::ok();
  });
}

SHOAL_API(void, ncclParamDumpAll, ()) {
  for (const auto& e : table().entries) std::printf("%s=%s\n", e.key.c_str(), e.value.c_str());
}
