#include "cuda/nvml.h"

#include <dlfcn.h>

#include <initializer_list>
#include <utility>

#include "core/params.h"

namespace shoal::cuda::nvml {
namespace {

// NVML's C ABI, the part used here (nvml.h is not part of the CUDA toolkit
// found at build time; these values are NVML's stable ones).
using Return = int;           // nvmlReturn_t
constexpr Return kSuccess = 0;  // NVML_SUCCESS
using Device = void*;         // nvmlDevice_t
constexpr int kCapsRead = 0;    // NVML_P2P_CAPS_INDEX_READ
constexpr int kCapsWrite = 1;   // NVML_P2P_CAPS_INDEX_WRITE
constexpr int kStatusOk = 0;    // NVML_P2P_STATUS_OK

struct Api {
  Return (*init)() = nullptr;                                      // nvmlInit_v2
  Return (*byUuid)(const char*, Device*) = nullptr;                // nvmlDeviceGetHandleByUUID
  Return (*p2pStatus)(Device, Device, int, int*) = nullptr;        // nvmlDeviceGetP2PStatus
  const char* (*errorString)(Return) = nullptr;                    // nvmlErrorString
};

std::string describe(const Api& api, const char* what, Return rc) {
  const char* text = api.errorString ? api.errorString(rc) : nullptr;
  return str(what, " failed: ", text ? text : "NVML error ", text ? "" : std::to_string(rc));
}

// The library, loaded and initialized once; an error said again at each
// question.
const Result<Api>& loaded() {
  static const Result<Api> api = []() -> Result<Api> {
    const std::string& path = params().nvmlLibrary;
    void* lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* why = ::dlerror();
      return error(Code::kUnsupported, "NVML (", path, ") did not load: ", why ? why : "unknown");
    }
    Api a;
    a.init = reinterpret_cast<Return (*)()>(::dlsym(lib, "nvmlInit_v2"));
    a.byUuid = reinterpret_cast<Return (*)(const char*, Device*)>(::dlsym(lib, "nvmlDeviceGetHandleByUUID"));
    a.p2pStatus = reinterpret_cast<Return (*)(Device, Device, int, int*)>(::dlsym(lib, "nvmlDeviceGetP2PStatus"));
    a.errorString = reinterpret_cast<const char* (*)(Return)>(::dlsym(lib, "nvmlErrorString"));
    if (a.init == nullptr || a.byUuid == nullptr || a.p2pStatus == nullptr)
      return error(Code::kUnsupported, "NVML (", path, ") lacks nvmlInit_v2, nvmlDeviceGetHandleByUUID or "
                   "nvmlDeviceGetP2PStatus");
    if (Return rc = a.init(); rc != kSuccess) return error(Code::kUnsupported, describe(a, "nvmlInit_v2", rc));
    return a;
  }();
  return api;
}

Result<Device> deviceOf(const Api& api, const std::string& gpu) {
  Device device = nullptr;
  if (Return rc = api.byUuid(gpu.c_str(), &device); rc != kSuccess)
    return error(Code::kUnsupported, describe(api, str("nvmlDeviceGetHandleByUUID(", gpu, ")").c_str(), rc));
  return device;
}

}  // namespace

Result<bool> peerAccess(const std::string& a, const std::string& b) {
  const Result<Api>& api = loaded();
  if (!api.isOk()) return api.status();
  SHOAL_ASSIGN_OR_RETURN(Device first, deviceOf(api.value(), a));
  SHOAL_ASSIGN_OR_RETURN(Device second, deviceOf(api.value(), b));
  for (auto [from, to] : {std::pair{first, second}, std::pair{second, first}}) {
    for (int caps : {kCapsRead, kCapsWrite}) {
      int status = -1;
      if (Return rc = api.value().p2pStatus(from, to, caps, &status); rc != kSuccess)
        return error(Code::kUnsupported, describe(api.value(), "nvmlDeviceGetP2PStatus", rc));
      if (status != kStatusOk) return false;
    }
  }
  return true;
}

}  // namespace shoal::cuda::nvml
