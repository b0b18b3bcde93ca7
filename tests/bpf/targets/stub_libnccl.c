/* A stand-in libnccl.so.2 (the real one is a 350 MB wheel and needs a GPU to create a
 * communicator) exporting the NCCL entry points otel-gpu probes, with the signatures of
 * nccl.h 2.32. Named as a stub: communicators are opaque heap addresses, calls do
 * nothing and return ncclSuccess (0). No entry point calls another, as in NCCL. */
#include <stddef.h>
#include <stdlib.h>

typedef struct { char internal[128]; } ncclUniqueId; /* passed by value: in memory, not registers */
typedef void *ncclComm_t;
typedef void *cudaStream_t;
typedef struct { size_t size; unsigned magic, version; int blocking; } ncclConfig_t;
typedef int ncclResult_t, ncclDataType_t, ncclRedOp_t;

static ncclComm_t new_comm(void) { return malloc(64); }

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank) {
    (void)nranks; (void)commId; (void)rank;
    *comm = new_comm();
    return 0;
}
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t *config) {
    (void)nranks; (void)commId; (void)rank; (void)config;
    *comm = new_comm();
    return 0;
}
ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist) {
    (void)devlist;
    for (int i = 0; i < ndev; i++)
        comms[i] = new_comm();
    return 0;
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) { free(comm); return 0; }
ncclResult_t ncclCommAbort(ncclComm_t comm) { free(comm); return 0; }

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) { return 0; }
ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) { return 0; }
ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) { return 0; }
ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) { return 0; }
ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) { return 0; }
ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) { return 0; }
ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) { return 0; }
ncclResult_t ncclGroupStart(void) { return 0; }
ncclResult_t ncclGroupEnd(void) { return 0; }
