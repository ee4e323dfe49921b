// Collective and point-to-point entry points: validate, convert, dispatch.
//
// Dispatch of a validated operation:
//   inside a group        -> recorded; runs at the outermost ncclGroupEnd
//   a Shoal host stream   -> queued on the stream; returns at once
//   nonblocking comm      -> queued; returns ncclInProgress (poll GetAsyncError)
//   otherwise             -> runs to completion before returning (host memory,
//                            NULL stream: complete when the call returns)
#include "api/api_coll.h"

#include "api/api_guard.h"

#include <climits>
#include <cstring>
#include "comm/call_check.h"
#include "comm/group.h"
#include "reduce/reduce.h"

using namespace shoal;
using shoal::api::guard;
using shoal::api::groupGuard;

namespace shoal::api {
namespace {

// The checks below run on every call: each keeps its message building in a
// cold function of its own, so that the passing check inlines to a compare.
[[gnu::cold, gnu::noinline]] Status badDataType(ncclDataType_t datatype) {
  return invalidArgument("invalid data type ", static_cast<int>(datatype));
}

inline Status checkDataType(ncclDataType_t datatype) {
  if (static_cast<int>(datatype) < 0 || static_cast<int>(datatype) >= ncclNumTypes) [[unlikely]]
    return badDataType(datatype);
  return Status::ok();
}

Status checkRoot(int root, const Communicator& comm) {
  if (root < 0 || root >= comm.nranks())
    return invalidArgument("invalid root ", root, " (nranks ", comm.nranks(), ")");
  return Status::ok();
}

[[gnu::cold, gnu::noinline]] Status nullBuffer(size_t count, const char* name) {
  return invalidArgument(name, " is NULL with count ", count);
}

inline Status checkBuffer(const void* buf, size_t count, const char* name) {
  if (buf == nullptr && count > 0) [[unlikely]]
    return nullBuffer(count, name);
  return Status::ok();
}

[[gnu::cold, gnu::noinline]] Status sizeOverflows(size_t count, size_t elementSize, size_t blocks) {
  return invalidArgument("count ", count, blocks > 1 ? str(" x ", blocks, " ranks") : std::string(),
                         " x ", elementSize, "-byte elements overflows the address space");
}

// The largest buffer a call describes (count x blocks elements) must fit in
// ssize_t bytes: a wrapped size would move the wrong bytes.
inline Status checkSize(size_t count, ncclDataType_t datatype, size_t blocks) {
  const size_t elementSize = dataTypeSize(static_cast<DataType>(datatype));
  size_t elements = 0, bytes = 0;
  if (__builtin_mul_overflow(count, blocks, &elements) ||
      __builtin_mul_overflow(elements, elementSize, &bytes) ||
      bytes > static_cast<size_t>(SSIZE_MAX)) [[unlikely]]
    return sizeOverflows(count, elementSize, blocks);
  return Status::ok();
}

// Converts NCCL's operator into the reducer's, with NCCL's ncclAvg numerics:
// floating types pre-multiply by 1/n, integers sum then divide.
Status convertOp(ncclRedOp_t op, DataType dtype, const Communicator& comm, OpRequest& req) {
  int value = static_cast<int>(op);
  switch (value) {
    case ncclSum: req.shape.op = ReduceOp::kSum; return Status::ok();
    case ncclProd: req.shape.op = ReduceOp::kProd; return Status::ok();
    case ncclMax: req.shape.op = ReduceOp::kMax; return Status::ok();
    case ncclMin: req.shape.op = ReduceOp::kMin; return Status::ok();
    case ncclAvg:
      if (isFloating(dtype)) {
        req.shape.op = ReduceOp::kPreMulSum;
        // NCCL forms the scalar in float (double for double) before converting.
        double scale = 1.0 / comm.nranks();
        if (dtype != DataType::kFloat64) scale = static_cast<double>(static_cast<float>(scale));
        reduce::fromDouble(dtype, scale, req.scalar.bytes.data());
      } else {
        req.shape.op = ReduceOp::kSum;
        req.shape.divisor = comm.nranks() > 1 ? static_cast<uint64_t>(comm.nranks()) : 0;
      }
      return Status::ok();
    default:
      break;
  }
  static_assert(RedOpTable::kFirstId == ncclNumOps, "user-created operators follow NCCL's built-in ones");
  if (value < ncclNumOps) return invalidArgument("invalid reduction operator ", value);
  SHOAL_ASSIGN_OR_RETURN(CustomRedOp custom, comm.findRedOp(value));
  if (custom.dtype != dtype)
    return invalidArgument("reduction operator ", value, " was created for ",
                           dataTypeName(custom.dtype), " and cannot be used with ",
                           dataTypeName(dtype));
  req.shape.op = ReduceOp::kPreMulSum;
  req.scalar = custom.scalar;
  return Status::ok();
}

}  // namespace

Status checkDataTypePublic(ncclDataType_t datatype) { return checkDataType(datatype); }

Status dispatch(ncclComm_t handle, const std::shared_ptr<Communicator>& comm, OpRequest&& req,
                cudaStream_t stream) {
  if (comm->usesCuda()) [[unlikely]] {
    req.noBuffers = comm->movesNoBytes(req);
    req.stream = stream;
    if (!(req.noBuffers && findHostStream(stream))) {
      SHOAL_ASSIGN_OR_RETURN(req.streamOrdered, comm->streamOrdered(req));
    }
    if (req.streamOrdered) {
      if (findHostStream(stream))
        return invalidArgument("a Shoal host stream was passed with memory CUDA knows; pass a CUDA stream");
      SHOAL_TRY(comm->admitStream(req));
    }
  }
  if (group::active()) {
    return group::addOp(comm, std::move(req));
  }
  if (callCheckEnabled()) [[unlikely]] {
    SHOAL_TRY(checkCallsAgree(*comm, std::span<const OpRequest>(&req, 1)));
  }
  if (req.streamOrdered) return comm->submitStreamOrdered(std::span<const OpRequest>(&req, 1));
  if (HostStream* hs = findHostStream(stream)) return hs->enqueue(comm, std::move(req));
  bool blocking = comm->options().blocking;
  SHOAL_TRY(comm->submit(std::span<const OpRequest>(&req, 1), /*wait=*/blocking));
  return blocking ? Status::ok() : Status(Code::kInProgress, "");
}

Status collective(ncclComm_t handle, CollKind kind, const void* sendbuff, void* recvbuff,
                  size_t count, ncclDataType_t datatype, ncclRedOp_t op, int root,
                  cudaStream_t stream) {
  CommCall call(handle);
  SHOAL_TRY(call.status());
  const std::shared_ptr<Communicator>& comm = call.comm();
  SHOAL_TRY(checkDataType(datatype));
  OpRequest req;
  req.shape.kind = kind;
  req.shape.dtype = static_cast<DataType>(datatype);
  req.shape.count = count;
  req.sendbuff = sendbuff;
  req.recvbuff = recvbuff;
  bool rooted = kind == CollKind::kBroadcast || kind == CollKind::kReduce ||
                kind == CollKind::kGather || kind == CollKind::kScatter;
  if (rooted) {
    SHOAL_TRY(checkRoot(root, *comm));
    req.shape.root = root;
  }
  bool reduces = kind == CollKind::kAllReduce || kind == CollKind::kReduce ||
                 kind == CollKind::kReduceScatter;
  if (reduces) {
    SHOAL_TRY(convertOp(op, req.shape.dtype, *comm, req));
  }
  // Which buffers this rank uses (NCCL lets non-roots pass NULL for the others).
  bool isRoot = rooted && root == comm->rank();
  size_t n = static_cast<size_t>(comm->nranks());
  const bool perRankBlocks = kind == CollKind::kAllGather || kind == CollKind::kReduceScatter ||
                             kind == CollKind::kGather || kind == CollKind::kScatter ||
                             kind == CollKind::kAllToAll;
  SHOAL_TRY(checkSize(count, datatype, perRankBlocks ? n : 1));
  switch (kind) {
    case CollKind::kBroadcast:
      if (isRoot) {
        SHOAL_TRY(checkBuffer(sendbuff, count, "sendbuff"));
      }
      SHOAL_TRY(checkBuffer(recvbuff, count, "recvbuff"));
      break;
    case CollKind::kReduce:
      SHOAL_TRY(checkBuffer(sendbuff, count, "sendbuff"));
      if (isRoot) {
        SHOAL_TRY(checkBuffer(recvbuff, count, "recvbuff"));
      }
      break;
    case CollKind::kGather:
      SHOAL_TRY(checkBuffer(sendbuff, count, "sendbuff"));
      if (isRoot) {
        SHOAL_TRY(checkBuffer(recvbuff, count * n, "recvbuff"));
      }
      break;
    case CollKind::kScatter:
      if (isRoot) {
        SHOAL_TRY(checkBuffer(sendbuff, count * n, "sendbuff"));
      }
      SHOAL_TRY(checkBuffer(recvbuff, count, "recvbuff"));
      break;
    case CollKind::kAllToAll:
      SHOAL_TRY(checkBuffer(sendbuff, count, "sendbuff"));
      SHOAL_TRY(checkBuffer(recvbuff, count, "recvbuff"));
      // In place is not supported by NCCL either; like NCCL we run it (the
      // result is undefined) because nccl-tests times it.
      break;
    default:
      SHOAL_TRY(checkBuffer(sendbuff, count, "sendbuff"));
      SHOAL_TRY(checkBuffer(recvbuff, count, "recvbuff"));
      break;
  }
  return dispatch(handle, comm, std::move(req), stream);
}

Status pointToPoint(ncclComm_t handle, CollKind kind, const void* sendbuff, void* recvbuff,
                    size_t count, ncclDataType_t datatype, int peer, cudaStream_t stream) {
  CommCall call(handle);
  SHOAL_TRY(call.status());
  const std::shared_ptr<Communicator>& comm = call.comm();
  SHOAL_TRY(checkDataType(datatype));
  if (peer < 0 || peer >= comm->nranks())
    return invalidArgument("invalid peer ", peer, " (nranks ", comm->nranks(), ")");
  OpRequest req;
  req.shape.kind = kind;
  req.shape.dtype = static_cast<DataType>(datatype);
  req.shape.count = count;
  req.shape.peer = peer;
  req.sendbuff = sendbuff;
  req.recvbuff = recvbuff;
  SHOAL_TRY(checkBuffer(kind == CollKind::kSend ? sendbuff : recvbuff, count,
                        kind == CollKind::kSend ? "sendbuff" : "recvbuff"));
  SHOAL_TRY(checkSize(count, datatype, 1));
  // Both ends of a message to self must be in one group (NCCL refuses it
  // otherwise; alone it could only wait for the no-progress deadline).
  if (peer == comm->rank() && !group::active())
    return invalidUsage(comm->describe(), ": ", kind == CollKind::kSend ? "ncclSend to" : "ncclRecv from",
                        " self (rank ", peer, ") outside a group has no matching ",
                        kind == CollKind::kSend ? "ncclRecv from" : "ncclSend to",
                        " self: call both between ncclGroupStart and ncclGroupEnd");
  return dispatch(handle, comm, std::move(req), stream);
}

}  // namespace shoal::api

using shoal::api::collective;

SHOAL_API(ncclResult_t, ncclAllReduce,
          (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)) {
  return groupGuard("ncclAllReduce", [&] {
    return collective(comm, CollKind::kAllReduce, sendbuff, recvbuff, count, datatype, op, -1,
                      stream);
  });
}

SHOAL_API(ncclResult_t, ncclReduce,
          (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
           ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream)) {
  return groupGuard("ncclReduce", [&] {
    return collective(comm, CollKind::kReduce, sendbuff, recvbuff, count, datatype, op, root,
                      stream);
  });
}

SHOAL_API(ncclResult_t, ncclBroadcast,
          (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
           ncclComm_t comm, cudaStream_t stream)) {
  return groupGuard("ncclBroadcast", [&] {
    return collective(comm, CollKind::kBroadcast, sendbuff, recvbuff, count, datatype, ncclSum,
                      root, stream);
  });
}

SHOAL_API(ncclResult_t, ncclBcast,
          (void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
           cudaStream_t stream)) {
  return groupGuard("ncclBcast", [&] {
    return collective(comm, CollKind::kBroadcast, buff, buff, count, datatype, ncclSum, root,
                      stream);
  });
}

SHOAL_API(ncclResult_t, ncclReduceScatter,
          (const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)) {
  return groupGuard("ncclReduceScatter", [&] {
    return collective(comm, CollKind::kReduceScatter, sendbuff, recvbuff, recvcount, datatype, op,
                      -1, stream);
  });
}

SHOAL_API(ncclResult_t, ncclAllGather,
          (const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
           ncclComm_t comm, cudaStream_t stream)) {
  return groupGuard("ncclAllGather", [&] {
    return collective(comm, CollKind::kAllGather, sendbuff, recvbuff, sendcount, datatype, ncclSum,
                      -1, stream);
  });
}

SHOAL_API(ncclResult_t, ncclAlltoAll,
          (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
           ncclComm_t comm, cudaStream_t stream)) {
  return groupGuard("ncclAlltoAll", [&] {
    return collective(comm, CollKind::kAllToAll, sendbuff, recvbuff, count, datatype, ncclSum, -1,
                      stream);
  });
}

SHOAL_API(ncclResult_t, ncclGather,
          (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
           ncclComm_t comm, cudaStream_t stream)) {
  return groupGuard("ncclGather", [&] {
    return collective(comm, CollKind::kGather, sendbuff, recvbuff, count, datatype, ncclSum, root,
                      stream);
  });
}

SHOAL_API(ncclResult_t, ncclScatter,
          (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
           ncclComm_t comm, cudaStream_t stream)) {
  return groupGuard("ncclScatter", [&] {
    return collective(comm, CollKind::kScatter, sendbuff, recvbuff, count, datatype, ncclSum, root,
                      stream);
  });
}

SHOAL_API(ncclResult_t, ncclSend,
          (const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
           cudaStream_t stream)) {
  return groupGuard("ncclSend", [&] {
    return shoal::api::pointToPoint(comm, CollKind::kSend, sendbuff, nullptr, count, datatype,
                                    peer, stream);
  });
}

SHOAL_API(ncclResult_t, ncclRecv,
          (void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
           cudaStream_t stream)) {
  return groupGuard("ncclRecv", [&] {
    return shoal::api::pointToPoint(comm, CollKind::kRecv, nullptr, recvbuff, count, datatype,
                                    peer, stream);
  });
}

SHOAL_API(ncclResult_t, ncclRedOpCreatePreMulSum,
          (ncclRedOp_t * op, void* scalar, ncclDataType_t datatype,
           ncclScalarResidence_t residence, ncclComm_t comm)) {
  return guard("ncclRedOpCreatePreMulSum", [&]() -> Status {
    if (op == nullptr) return invalidArgument("op is NULL");
    if (scalar == nullptr) return invalidArgument("scalar is NULL");
    SHOAL_TRY(shoal::api::checkDataTypePublic(datatype));
    SHOAL_ASSIGN_OR_RETURN(auto impl, shoal::api::readyComm(comm));
    CustomRedOp custom;
    custom.dtype = static_cast<DataType>(datatype);
    size_t size = dataTypeSize(custom.dtype);
    if (residence == ncclScalarHostImmediate) {
      std::memcpy(custom.scalar.bytes.data(), scalar, size);
    } else if (residence == ncclScalarDevice) {
      // Host memory build: the pointer is read when each collective starts.
      custom.scalar.deviceScalar = scalar;
    } else {
      return invalidArgument("invalid scalar residence ", static_cast<int>(residence));
    }
    SHOAL_ASSIGN_OR_RETURN(int id, impl->createRedOp(custom));
    *op = static_cast<ncclRedOp_t>(id);
    return Status::ok();
  });
}

SHOAL_API(ncclResult_t, ncclRedOpDestroy, (ncclRedOp_t op, ncclComm_t comm)) {
  return guard("ncclRedOpDestroy", [&]() -> Status {
    SHOAL_ASSIGN_OR_RETURN(auto impl, shoal::api::readyComm(comm));
    if (static_cast<int>(op) < ncclNumOps && static_cast<int>(op) >= 0)
      return invalidArgument("ncclRedOpDestroy: ", static_cast<int>(op),
                             " is a built-in operator and cannot be destroyed");
    return impl->destroyRedOp(static_cast<int>(op));
  });
}
