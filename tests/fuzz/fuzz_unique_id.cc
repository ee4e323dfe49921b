// fuzz_unique_id: decodeUniqueId (src/bootstrap/unique_id.cc), the 128-byte
// ncclUniqueId that every rank receives from the application (which passes it
// between processes by MPI, files or its own sockets) and decodes before it
// connects to the root.
//
// Input: the id's bytes (zero-padded or cut to 128). Properties: a decoded id
// re-encodes to exactly the same 128 bytes, and decodes again to the same
// magic, secret and address.
#include <cstring>

#include "bootstrap/bootstrap.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  char in[shoal::UniqueIdContents::kBytes] = {};
  std::memcpy(in, data, size < sizeof(in) ? size : sizeof(in));
  shoal::Result<shoal::UniqueIdContents> id = shoal::decodeUniqueId(in);
  if (!id.isOk()) return 0;
  char out[shoal::UniqueIdContents::kBytes];
  shoal::encodeUniqueId(id.value(), out);
  FUZZ_CHECK(std::memcmp(in, out, sizeof(in)) == 0, "re-encoding changed the id (address %s)",
             id.value().address.c_str());
  shoal::Result<shoal::UniqueIdContents> again = shoal::decodeUniqueId(out);
  FUZZ_CHECK(again.isOk(), "a re-encoded id does not decode: %s", again.status().message().c_str());
  FUZZ_CHECK(again.value().magic == id.value().magic && again.value().address == id.value().address &&
                 std::memcmp(again.value().secret, id.value().secret, 32) == 0,
             "decode(encode(id)) differs from id");
  return 0;
}
