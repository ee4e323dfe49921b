// fuzz_tcp_segments: the receive path of a tcp transport connection
// (transports/tcp/tcp_connection.cc): the 24-byte segment headers {u64 tag,
// u64 message bytes, u32 message number, u16 slice, u16 slices} and payloads
// a peer sends on each of a connection's sockets ("lanes").
//
// The header check (TcpConnection::checkHeader) is private and reads straight
// from the lane's staging buffer, so the harness drives the public
// TcpConnection: its lanes are socketpairs whose other ends carry the input
// as the peer's bytes; the harness posts the receives the input names and
// polls until nothing moves.
//
// Properties: a receive completes only if every one of its segments arrived
// on the lane planSlice() puts it on, in order, with a header naming its tag,
// size, message number and slice (the check README.md promises). And how
// the bytes are cut by the kernel does not matter: each input runs twice,
// once with every lane's bytes written at once and once in small pieces
// between polls; when neither run fails, both complete the same receives
// with the same bytes.
//
// Input: u8 cfg (lanes = 1 + cfg % 4, chunk bytes = {4, 16, 64, 128} KiB by
//        (cfg >> 2) % 4), u8 piece (bytes per lane per step in the second run:
//        1 + 7 * piece, but at most 256 steps), u8 receives (1 + n % 8), then
//        per receive u32 bytes (% 64 KiB + 1) and u64 tag, then per lane u16 n
//        and n bytes.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "transports/tcp/tcp_connection.h"

namespace {

using namespace shoal;
using shoal_fuzz::Input;

constexpr uint64_t kMaxRecvBytes = 64 << 10;
constexpr uint64_t kChunks[4] = {4096, 16384, 65536, 131072};

struct Recv {
  uint64_t bytes;
  uint64_t tag;
};

struct Outcome {
  bool failed = false;
  std::vector<bool> completed;
  std::vector<std::vector<uint8_t>> buffers;
};

Outcome run(int lanes, uint64_t chunk, const std::vector<Recv>& recvs, const std::vector<std::string_view>& streams,
            size_t piece) {
  Outcome out;
  std::vector<net::Fd> fds;
  std::vector<int> peer(static_cast<size_t>(lanes));
  for (int i = 0; i < lanes; ++i) {
    shoal_fuzz::SocketPair pair = shoal_fuzz::SocketPair::make();
    fds.emplace_back(pair.a);
    peer[static_cast<size_t>(i)] = pair.b;
  }
  tcp::TcpConnection conn(std::move(fds), chunk, "fuzz peer");
  out.buffers.resize(recvs.size());
  out.completed.assign(recvs.size(), false);
  for (size_t i = 0; i < recvs.size(); ++i) {
    out.buffers[i].assign(recvs[i].bytes, 0);
    Status s = conn.postRecv(out.buffers[i].data(), recvs[i].bytes, recvs[i].tag, i);
    FUZZ_CHECK(s.isOk(), "postRecv failed: %s", s.message().c_str());
  }
  std::vector<size_t> sent(static_cast<size_t>(lanes), 0);
  std::vector<Completion> done;
  auto pollUntilIdle = [&] {
    for (int guard = 0; guard < 1'000'000; ++guard) {
      bool progressed = false;
      done.clear();
      Status s = conn.poll(done, progressed);
      for (const Completion& c : done) {
        FUZZ_CHECK(c.token < recvs.size(), "completion of unknown token %llu", (unsigned long long)c.token);
        FUZZ_CHECK(!out.completed[c.token], "receive %llu completed twice", (unsigned long long)c.token);
        FUZZ_CHECK(c.bytes == recvs[c.token].bytes, "receive completed with %llu bytes, posted %llu",
                   (unsigned long long)c.bytes, (unsigned long long)recvs[c.token].bytes);
        out.completed[c.token] = true;
      }
      if (!s.isOk()) {
        out.failed = true;
        return;
      }
      if (!progressed) return;
    }
    FUZZ_CHECK(false, "poll kept reporting progress");
  };
  for (bool more = true; more && !out.failed;) {
    more = false;
    for (int i = 0; i < lanes; ++i) {
      std::string_view s = streams[static_cast<size_t>(i)];
      size_t& at = sent[static_cast<size_t>(i)];
      size_t n = std::min(piece, s.size() - at);
      at += shoal_fuzz::writeSome(peer[static_cast<size_t>(i)], s.data() + at, n);
      if (at < s.size()) more = true;
    }
    pollUntilIdle();
  }
  for (int fd : peer) ::close(fd);
  return out;
}

// Which receives the bytes allow to complete: each slice's segment must be
// next on its lane (slices are planned as planSlice says, in posting order)
// and its header must name the receive's tag, size, message number (low 32
// bits), slice and slice count; the payload must be there. A lane whose
// segment mismatches fails the connection, so nothing after it on that lane
// completes either.
std::vector<bool> mayComplete(int lanes, uint64_t chunk, const std::vector<Recv>& recvs,
                              const std::vector<std::string_view>& streams) {
  struct Expect {
    size_t recv;
    uint64_t length;
    uint8_t header[tcp::kSegmentHeaderBytes];
  };
  std::vector<std::vector<Expect>> perLane(static_cast<size_t>(lanes));
  for (size_t i = 0; i < recvs.size(); ++i) {
    int slices = tcp::sliceCount(recvs[i].bytes, lanes, chunk);
    for (int j = 0; j < slices; ++j) {
      tcp::SlicePlan plan = tcp::planSlice(i, recvs[i].bytes, lanes, chunk, j);
      Expect e{i, plan.length, {}};
      for (int b = 0; b < 8; ++b) e.header[b] = static_cast<uint8_t>(recvs[i].tag >> (8 * b));
      for (int b = 0; b < 8; ++b) e.header[8 + b] = static_cast<uint8_t>(recvs[i].bytes >> (8 * b));
      for (int b = 0; b < 4; ++b) e.header[16 + b] = static_cast<uint8_t>(i >> (8 * b));
      e.header[20] = static_cast<uint8_t>(j);
      e.header[21] = static_cast<uint8_t>(j >> 8);
      e.header[22] = static_cast<uint8_t>(slices);
      e.header[23] = static_cast<uint8_t>(slices >> 8);
      perLane[static_cast<size_t>(plan.lane)].push_back(e);
    }
  }
  std::vector<int> goodSlices(recvs.size(), 0);
  for (int l = 0; l < lanes; ++l) {
    std::string_view s = streams[static_cast<size_t>(l)];
    size_t at = 0;
    for (const Expect& e : perLane[static_cast<size_t>(l)]) {
      if (s.size() - at < tcp::kSegmentHeaderBytes + e.length) break;
      if (std::memcmp(s.data() + at, e.header, tcp::kSegmentHeaderBytes) != 0) break;
      at += tcp::kSegmentHeaderBytes + e.length;
      ++goodSlices[e.recv];
    }
  }
  std::vector<bool> may(recvs.size());
  for (size_t i = 0; i < recvs.size(); ++i)
    may[i] = goodSlices[i] == tcp::sliceCount(recvs[i].bytes, lanes, chunk);
  return may;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  uint8_t cfg = in.u8();
  int lanes = 1 + cfg % 4;
  uint64_t chunk = kChunks[(cfg >> 2) % 4];
  size_t piece = 1 + 7 * size_t{in.u8()};
  std::vector<Recv> recvs(1 + in.u8() % 8);
  for (Recv& r : recvs) {
    r.bytes = in.u32() % (kMaxRecvBytes + 1);
    r.tag = in.u64();
  }
  std::vector<std::string_view> streams(static_cast<size_t>(lanes));
  size_t longest = 0;
  for (auto& s : streams) {
    s = in.bytes(in.u16());
    longest = std::max(longest, s.size());
  }
  piece = std::max(piece, (longest + 255) / 256);

  Outcome whole = run(lanes, chunk, recvs, streams, SIZE_MAX);
  Outcome pieces = run(lanes, chunk, recvs, streams, piece);
  std::vector<bool> may = mayComplete(lanes, chunk, recvs, streams);
  for (size_t i = 0; i < recvs.size(); ++i)
    FUZZ_CHECK((!whole.completed[i] && !pieces.completed[i]) || may[i],
               "receive %zu completed although its segments do not match it", i);
  if (!whole.failed && !pieces.failed) {
    FUZZ_CHECK(whole.completed == pieces.completed, "completions depend on how the stream was cut");
    for (size_t i = 0; i < recvs.size(); ++i)
      if (whole.completed[i])
        FUZZ_CHECK(whole.buffers[i] == pieces.buffers[i], "receive %zu got different bytes when cut", i);
  }
  return 0;
}
