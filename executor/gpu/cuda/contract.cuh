// Generated from executor/gpu/tables.py by executor/gpu/contract.py: do not edit; run
// `python -m executor.gpu.contract` after changing the tables (tests/test_contract.py checks it is current).
// The host/device contract: what the host writes and the interpreter reads.
#pragma once

typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

namespace weft {

// Error kinds written into the host-visible error record (tables.ERROR_KINDS says each to the user).
enum ErrorKind : int {
  kOk = 0,
  kWaitTimeout = 1,
  kPacketTimeout = 2,
  kBarrierTimeout = 3,
  kAborted = 4,
  kNormTimeout = 5
};

constexpr int kMaxRefs = 16;      // entries of an op's src and of its dst
constexpr int kMaxChannels = 16;  // entries of an op's channel
constexpr int kMaxSlots = 64;     // buffer slots a launch binds
enum RefFlags : int { kPacket = 1, kScratch = 2, kLamport = 4 };

// The buffer slots: the local buffers, then remote_buffers[k] at kPeerSlots + k, then the residual, weight, normed
// rows.
enum Slot : int { kInputSlot = 0, kOutputSlot = 1, kScratchSlot = 2, kPeerSlots = 3 };

// The device op kinds: the op table's (schedules.ops.DEVICE_KINDS), then kPairs, a transfer of plain src[j] -> dst[j]
// for every j, side by side, and kLamportReset, the sentinel over a block's share of the Lamport scratch copy that is
// free.
enum OpType : int {
  kNop = 0,
  kBarrier = 1,
  kSignal = 2,
  kWait = 3,
  kFlush = 4,
  kTransfer = 5,
  kSemAcquire = 6,
  kSemRelease = 7,
  kPairs = 8,
  kLamportReset = 9
};

// The fused RMSNorm epilogue's kinds, outside the op table's, which other ops extend: the rows a reduction completed;
// the weight prefetched first in a block that runs the epilogue; one slice of a row several blocks sum.
constexpr int kNormRows = 64;
constexpr int kNormPrefetch = 65;
constexpr int kNormSlice = 66;

struct Ref {
  i64 offset;  // bytes from the buffer's base (packet bytes for packet references)
  int buffer;  // the slot in the context's buffer table (Slot)
  int flags;   // RefFlags
};

struct Op {
  int type;                   // OpType, or a norm kind
  int nsrc;                   // entries of src in use
  int ndst;                   // entries of dst in use
  int nchannel;               // entries of channel in use
  int barrier_id;             // a barrier's id; a norm's row or weight bytes, or slice index; a reset's reset_ahead
  int barrier_count;          // a barrier's thread blocks; a norm row's slice count; Lamport scratch copies
  int plan_op;                // the op's index in its plan threadblock, for error reports
  int line_chunk;             // > 0: the op's packets are LL128 lines and this is the data bytes of one chunk
  i64 bytes;                  // data bytes moved by a transfer
  int channel[kMaxChannels];  // channel ids (signal, wait), semaphore ids (sem_*); [0] a norm's eps bits
  Ref src[kMaxRefs];          // sources, read (and summed) in order
  Ref dst[kMaxRefs];          // destinations, each written the same bytes
};

static_assert(sizeof(Ref) == 16, "Ref: 16 bytes, as numpy lays it out");
#ifdef offsetof
static_assert(offsetof(Ref, offset) == 0, "Ref.offset at byte 0");
static_assert(offsetof(Ref, buffer) == 8, "Ref.buffer at byte 8");
static_assert(offsetof(Ref, flags) == 12, "Ref.flags at byte 12");
#endif

static_assert(sizeof(Op) == 616, "Op: 616 bytes, as numpy lays it out");
#ifdef offsetof
static_assert(offsetof(Op, type) == 0, "Op.type at byte 0");
static_assert(offsetof(Op, nsrc) == 4, "Op.nsrc at byte 4");
static_assert(offsetof(Op, ndst) == 8, "Op.ndst at byte 8");
static_assert(offsetof(Op, nchannel) == 12, "Op.nchannel at byte 12");
static_assert(offsetof(Op, barrier_id) == 16, "Op.barrier_id at byte 16");
static_assert(offsetof(Op, barrier_count) == 20, "Op.barrier_count at byte 20");
static_assert(offsetof(Op, plan_op) == 24, "Op.plan_op at byte 24");
static_assert(offsetof(Op, line_chunk) == 28, "Op.line_chunk at byte 28");
static_assert(offsetof(Op, bytes) == 32, "Op.bytes at byte 32");
static_assert(offsetof(Op, channel) == 40, "Op.channel at byte 40");
static_assert(offsetof(Op, src) == 104, "Op.src at byte 104");
static_assert(offsetof(Op, dst) == 360, "Op.dst at byte 360");
#endif

}  // namespace weft

// The interpreter's parameters in order (tables.KERNEL_PARAMS), and the same names as arguments; a
// -DWEFT_TRACE build takes the trace buffer last.
// clang-format off
#define WEFT_KERNEL_PARAMS const weft::Op* ops, const int* tb_start, char* const* buffers, u64* const* outbound, u64* inbound, u64* expected, u64* barriers, u64* semaphores, u64* epochs, int* error, u64 timeout_ns, int rank, i64 scratch_half, int nslots, int uniform_ops
#define WEFT_KERNEL_ARGS ops, tb_start, buffers, outbound, inbound, expected, barriers, semaphores, epochs, error, timeout_ns, rank, scratch_half, nslots, uniform_ops
#ifdef WEFT_TRACE
#define WEFT_TRACE_PARAM , u64* trace
#define WEFT_TRACE_ARG , trace
#else
#define WEFT_TRACE_PARAM
#define WEFT_TRACE_ARG
#endif
// clang-format on
