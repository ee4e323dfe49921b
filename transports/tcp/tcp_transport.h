// TcpTransport: connections to peers over TCP sockets (the fallback every
// machine has). See README.md for the wire format and the knobs.
//
// Role: one per process (makeTcpTransport(), owned by the transport registry).
// localAddress() opens the process's one listener, lazily, on the interface
// NCCL_SOCKET_IFNAME selects, and returns "ip:port" (or "[v6]:port").
// connect(): the lower rank of a pair connects `sockets` = NCCL_SOCKET_NTHREADS
// x NCCL_NSOCKS_PERTHREAD (1..64) sockets to the higher rank's listener and
// sends a Hello on each; there is no reply, so set-up can never deadlock on
// the order in which ranks or communicators connect. The higher rank takes its
// sockets from the listener; sockets that arrive for other connections (other
// communicators, channels or peers, being set up by other threads) wait in a
// table until their owner asks. A hello proves the communicator's secret
// (HMAC, never the secret itself); a socket whose hello is garbage, late
// (SHOAL_HANDSHAKE_TIMEOUT_MS) or unproven is closed and logged (rate-limited)
// without disturbing anyone else.
// Thread: connect() and localAddress() may be called from any number of
// threads at once. Lock order: the transport mutex only; at most one thread at
// a time (the "pump") polls the listener and the unfinished hellos, without the
// lock, and takes the lock to publish what arrived.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include "transports/transport.h"

namespace shoal {

std::unique_ptr<Transport> makeTcpTransport();

namespace tcp {

// The first 80 bytes on every data socket, connector -> acceptor
// (little-endian): u32 "SHTC", u16 version, u16 sockets, u64 commId,
// i32 fromRank, i32 toRank, u16 channel, u16 socketIndex, u32 chunkBytes,
// u8 nonce[16], u8 proof[32] = HMAC-SHA256(secret, "shoal tcp hello v1" ||
// the 48 bytes before the proof).
inline constexpr size_t kHelloBytes = 80;

struct Hello {
  uint64_t commId = 0;
  int32_t fromRank = -1;  // the connector
  int32_t toRank = -1;    // the acceptor
  uint16_t channel = 0;
  uint16_t socketIndex = 0;
  uint16_t sockets = 1;
  uint32_t chunkBytes = 0;
  uint8_t nonce[16] = {};
  uint8_t proof[32] = {};
};

void encodeHello(const Hello& hello, uint8_t out[kHelloBytes]);
// Structural checks only (magic, version, ranges); the proof needs the secret.
Result<Hello> decodeHello(const uint8_t in[kHelloBytes]);
// Fills nonce and proof.
Status signHello(Hello& hello, std::string_view secret);
bool verifyHello(const Hello& hello, std::string_view secret);

// Sockets per connection and chunk size from the parameters, clamped.
int socketsPerConnection();
uint32_t chunkBytesParam();

}  // namespace tcp
}  // namespace shoal
