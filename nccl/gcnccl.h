/*
 * gcnccl.h: the NCCL C ABI as package nccl calls it, without nccl.h.
 *
 * The binding declares its own stand-ins for the few nccl.h 2.x types it
 * passes (gc_enum for ncclResult_t, ncclDataType_t and ncclRedOp_t;
 * gc_handle for ncclComm_t and cudaStream_t; gc_unique_id for ncclUniqueId;
 * gc_config, never defined, for ncclConfig_t, which it only passes as NULL)
 * and one function pointer type per NCCL function it calls, named
 * gc_<symbol>_fn, which gc_call (dl_cgo.go) casts each dlsym'ed address to.
 *
 * The GC_* macros name the types the prototypes use. They default to the
 * stand-ins; TestHeaderABI (nccl_h_test.go) defines them as nccl.h's own
 * types and compiles every gc_<symbol>_fn against nccl.h's prototype, and
 * checks that each stand-in has the size and alignment of the type it
 * stands for.
 */
#ifndef GRADCOMP_GCNCCL_H
#define GRADCOMP_GCNCCL_H

#include <stddef.h>

/* The size of an ncclUniqueId (NCCL_UNIQUE_ID_BYTES). */
#define GC_UNIQUE_ID_BYTES 128

typedef int gc_enum;      /* ncclResult_t, ncclDataType_t, ncclRedOp_t */
typedef void* gc_handle;  /* ncclComm_t, cudaStream_t */
typedef struct { char internal[GC_UNIQUE_ID_BYTES]; } gc_unique_id; /* ncclUniqueId */
typedef struct gc_config gc_config; /* ncclConfig_t (NCCL >= 2.14): incomplete, only NULL is passed */

#ifndef GC_RESULT
#define GC_RESULT gc_enum
#endif
#ifndef GC_DATATYPE
#define GC_DATATYPE gc_enum
#endif
#ifndef GC_REDOP
#define GC_REDOP gc_enum
#endif
#ifndef GC_COMM
#define GC_COMM gc_handle
#endif
#ifndef GC_STREAM
#define GC_STREAM gc_handle
#endif
#ifndef GC_UNIQUE_ID
#define GC_UNIQUE_ID gc_unique_id
#endif
#ifndef GC_CONFIG
#define GC_CONFIG gc_config
#endif

typedef GC_RESULT (*gc_ncclGetVersion_fn)(int* version);
typedef GC_RESULT (*gc_ncclGetUniqueId_fn)(GC_UNIQUE_ID* uniqueId);
typedef GC_RESULT (*gc_ncclCommInitRank_fn)(GC_COMM* comm, int nranks, GC_UNIQUE_ID commId, int rank);
typedef GC_RESULT (*gc_ncclCommDestroy_fn)(GC_COMM comm);
typedef GC_RESULT (*gc_ncclCommAbort_fn)(GC_COMM comm);
typedef GC_RESULT (*gc_ncclCommGetAsyncError_fn)(GC_COMM comm, GC_RESULT* asyncError);
typedef GC_RESULT (*gc_ncclAllReduce_fn)(const void* sendbuff, void* recvbuff, size_t count, GC_DATATYPE datatype,
					 GC_REDOP op, GC_COMM comm, GC_STREAM stream);
typedef GC_RESULT (*gc_ncclAllGather_fn)(const void* sendbuff, void* recvbuff, size_t sendcount, GC_DATATYPE datatype,
					 GC_COMM comm, GC_STREAM stream);
typedef GC_RESULT (*gc_ncclReduceScatter_fn)(const void* sendbuff, void* recvbuff, size_t recvcount,
					     GC_DATATYPE datatype, GC_REDOP op, GC_COMM comm, GC_STREAM stream);
typedef GC_RESULT (*gc_ncclBroadcast_fn)(const void* sendbuff, void* recvbuff, size_t count, GC_DATATYPE datatype,
					 int root, GC_COMM comm, GC_STREAM stream);
typedef GC_RESULT (*gc_ncclSend_fn)(const void* sendbuff, size_t count, GC_DATATYPE datatype, int peer, GC_COMM comm,
				    GC_STREAM stream);
typedef GC_RESULT (*gc_ncclRecv_fn)(void* recvbuff, size_t count, GC_DATATYPE datatype, int peer, GC_COMM comm,
				    GC_STREAM stream);
typedef GC_RESULT (*gc_ncclGroupStart_fn)(void);
typedef GC_RESULT (*gc_ncclGroupEnd_fn)(void);
typedef const char* (*gc_ncclGetErrorString_fn)(GC_RESULT result);
typedef const char* (*gc_ncclGetLastError_fn)(GC_COMM comm);
typedef GC_RESULT (*gc_ncclCommUserRank_fn)(GC_COMM comm, int* rank);
typedef GC_RESULT (*gc_ncclCommCount_fn)(GC_COMM comm, int* count);
typedef GC_RESULT (*gc_ncclCommSplit_fn)(GC_COMM comm, int color, int key, GC_COMM* newcomm, GC_CONFIG* config);

#endif
