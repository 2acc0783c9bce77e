// Index top-k by one thread-block cluster per row (IndexTopkArgs::path 3): the whole
// selection in ONE launch, the row's keys read once into registers, the cross-block histograms
// exchanged through distributed shared memory (sm_90 clusters) instead of global memory and
// separate kernels.
//
// Per row, a cluster of C blocks (16, or 8 where the device cannot hold 16) of 1024 threads; block
// r owns the contiguous keys [r·per, (r+1)·per), per = ceil(clen / C), KPT = per / 1024 rounded up
// to 8, 16 or 32 keys per thread (key u of thread j is index lo + u·1024 + j, so (u, warp, lane)
// is index order). Keys are the float bits mapped to an order-preserving uint32 (-0 folded onto
// +0; non-finite scores and mode-2 masked entries are not candidates, key 0).
//   level 0..2: radix select on 11 + 11 + 10 bits. Each block counts its keys that match the
//     prefix found so far into a shared histogram, pushes the non-zero bins into the owner block's
//     slice of the cluster histogram (block b/slice owns bin b) with remote atomics, one cluster
//     barrier, then every block reads the whole cluster histogram (two bins per thread, one remote
//     8-byte load) and finds the same split bin. The levels stop as soon as the split bin is taken
//     whole (typical for distinct scores: after level 1), or after level 2 (exact key: ties).
//   compaction: with the final prefix P (and `take` = how many keys equal to P are selected, the
//     lowest indices first), a key is selected iff its prefix > P, or == P and fewer than `take`
//     keys equal to P precede it in index order. Counts per (u, warp) are scanned in the block,
//     block totals exchanged through the cluster, and every selected key is written straight to
//     its final position: ascending index order without any sort.
// Same result as ops::topk_indices (+ candidate_mask for mode 1, done by the multi-block launches
// before this kernel) for every input: ties broken by the lower index, NaN / ±inf excluded,
// k >= candidates gives every candidate, rows of different lengths.
#include <cooperative_groups.h>

#include <atomic>
#include <cfloat>
#include <cstdint>

#include "ops/cuda/indexer/topk.h"
#include "ops/cuda/runtime/launch.cuh"
#include "ops/cuda/runtime/pdl.cuh"

namespace flashseek::ops::cuda::detail {
namespace {
namespace cg = cooperative_groups;

constexpr int kCtThreads = 1024;
constexpr int kCtWarps = kCtThreads / 32;
constexpr int kCtBins = 2048;                 // 11-bit digits (level 2: 10 bits)
constexpr int kCtMinCluster = 8;
constexpr int kCtMaxSlice = kCtBins / kCtMinCluster;  // bins one block owns
constexpr unsigned kFull = 0xffffffffu;

struct CtSplit {
  unsigned bin, above, cnt, total;  // split bin, count in the bins above it, count in it, all bins
};

struct CtShared {
  unsigned local[3][kCtBins];  // this block's counts per level (level 0 uses all three as copies)
  __align__(16) unsigned owned[3][kCtMaxSlice];  // this block's slice of the cluster histograms
  unsigned wsum[kCtWarps];
  CtSplit split[3];
  unsigned counts[2];  // this block's (prefix >, prefix ==) key counts, read by higher ranks
  unsigned before[2];  // the same summed over the lower ranks
};

// barrier.cluster: every thread of every block of the cluster; arrive has release and wait
// acquire semantics (shared::cluster writes before the arrive are visible after the wait).
__device__ __forceinline__ void cl_arrive() { asm volatile("barrier.cluster.arrive.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void cl_wait() { asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void cl_sync() { cl_arrive(); cl_wait(); }

// 0: not a candidate (finite keys are >= 0x00800000).
__device__ __forceinline__ uint32_t ct_key(float x) {
  if (!isfinite(x)) return 0u;
  if (x == 0.0f) x = 0.0f;
  const uint32_t u = __float_as_uint(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Thread j holds the cluster counts of bins 2j, 2j+1. Finds the bin where the count from the top
// reaches `need` (>= 1) and stores it in sh.split[L] (total always; bin / above / cnt only when
// total >= need). Two block barriers; the last one publishes the result.
__device__ void ct_find_split(unsigned h0, unsigned h1, unsigned need, CtShared& sh, int L) {
  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const unsigned c = h0 + h1;
  unsigned suf = c;  // inclusive suffix sum over the warp's lanes >= lane
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned v = __shfl_down_sync(kFull, suf, o);
    if (lane + o < 32) suf += v;
  }
  if (lane == 0) sh.wsum[warp] = suf;
  __syncthreads();
  unsigned ws = sh.wsum[lane];  // kCtWarps == 32
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned v = __shfl_down_sync(kFull, ws, o);
    if (lane + o < 32) ws += v;
  }
  const unsigned total = __shfl_sync(kFull, ws, 0);
  const unsigned next = __shfl_sync(kFull, ws, (warp + 1) & 31);
  const unsigned above = (warp == kCtWarps - 1 ? 0u : next) + suf - c;
  if (tid == 0) sh.split[L].total = total;
  if (total >= need && above < need && above + c >= need) {  // exactly one thread
    if (above + h1 >= need) sh.split[L].bin = unsigned(2 * tid + 1), sh.split[L].above = above, sh.split[L].cnt = h1;
    else sh.split[L].bin = unsigned(2 * tid), sh.split[L].above = above + h1, sh.split[L].cnt = h0;
  }
  __syncthreads();
}

template <int KPT>
__global__ void __launch_bounds__(kCtThreads, 1) topk_cluster_kernel(IndexTopkArgs a, int csize) {
  pdl_prologue();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  static_assert(KPT * kCtWarps <= kCtThreads && KPT * kCtThreads < 65536, "scan table / 16-bit counts");
  __shared__ CtShared sh;
  __shared__ unsigned tab[KPT * kCtWarps];  // per (u, warp): gt count | eq count << 16, then scanned
  cg::cluster_group cl = cg::this_cluster();
  const int rank = int(cl.block_rank());
  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int64_t t = int64_t(blockIdx.x) / csize;
  const int64_t n = (a.start + t + 1) / a.ratio;
  const int64_t per = (n + csize - 1) / csize, lo = rank * per;
  const int64_t hi = lo + per < n ? lo + per : n;  // may be <= lo: no keys
  const int slice = kCtBins / csize;
  const unsigned k = unsigned(a.k);

  for (int i = tid; i < 3 * kCtBins; i += kCtThreads) (&sh.local[0][0])[i] = 0u;
  for (int i = tid; i < 3 * kCtMaxSlice; i += kCtThreads) (&sh.owned[0][0])[i] = 0u;
  __syncthreads();
  cl_arrive();  // this block's slices are zero (waited for before the first push)

  float* s = a.scores + t * a.stride;
  const uint8_t* cand = a.mode == 2 ? a.cand + t * a.stride : nullptr;
  uint32_t key[KPT];
  {
    float x[KPT];
    uint8_t keep[KPT];
#pragma unroll
    for (int u = 0; u < KPT; ++u) {  // every load in flight before any is used (no store between)
      const int64_t i = lo + int64_t(u) * kCtThreads + tid;
      x[u] = i < hi ? s[i] : 0.0f;
      keep[u] = i < hi && cand ? cand[i] : uint8_t(1);
    }
#pragma unroll
    for (int u = 0; u < KPT; ++u) {
      const int64_t i = lo + int64_t(u) * kCtThreads + tid;
      key[u] = i < hi && keep[u] ? ct_key(x[u]) : 0u;
      if (i < hi && !keep[u]) s[i] = -INFINITY;  // mode 2: as the other paths, masked-out scores become -inf
    }
  }

  // Level 0: top 11 bits of every candidate; three copies of the counts (by warp) spread the
  // same-bin atomics of rows whose scores share a few exponents.
  {
    unsigned* h = sh.local[warp % 3];
#pragma unroll
    for (int u = 0; u < KPT; ++u) {
      const int bin = key[u] ? int(key[u] >> 21) : -1;
      const unsigned peers = __match_any_sync(kFull, bin);  // one atomic per distinct bin
      if (bin >= 0 && lane == __ffs(peers) - 1) atomicAdd(&h[bin], unsigned(__popc(peers)));
    }
  }
  __syncthreads();
  cl_wait();  // every block's slices are zero
  for (int b = tid; b < kCtBins; b += kCtThreads) {
    const unsigned v = sh.local[0][b] + sh.local[1][b] + sh.local[2][b];
    if (v) atomicAdd(cl.map_shared_rank(&sh.owned[0][b % slice], b / slice), v);
  }
  cl_sync();  // the cluster histogram of level 0 is complete
  for (int i = tid; i < 2 * kCtBins; i += kCtThreads) (&sh.local[1][0])[i] = 0u;  // levels 1, 2 (ordered by the split's barriers)
  {
    const uint2 hv = *reinterpret_cast<const uint2*>(cl.map_shared_rank(&sh.owned[0][(2 * tid) % slice], (2 * tid) / slice));
    ct_find_split(hv.x, hv.y, k, sh, 0);
  }
  const unsigned total = sh.split[0].total;
  const bool all = total <= k;  // every candidate is selected
  // Selection so far: keys whose (key >> shift) > P, plus `need` of those whose (key >> shift) == P.
  uint32_t P = 0;
  int shift = 0;
  unsigned need = 0;
  bool done = all;
  if (!all) {
    const CtSplit sp = sh.split[0];
    P = sp.bin, shift = 21, need = k - sp.above;
    done = sp.cnt == need;
  }
  for (int L = 1; L < 3 && !done; ++L) {  // `done` is the same in every block of the cluster
    const int nshift = L == 1 ? 10 : 0;
    const uint32_t dmask = L == 1 ? 0x7ffu : 0x3ffu;
    unsigned* h = sh.local[L];
#pragma unroll
    for (int u = 0; u < KPT; ++u) {
      const bool in = key[u] != 0u && (key[u] >> shift) == P;
      if (__any_sync(kFull, in)) {
        const int bin = in ? int((key[u] >> nshift) & dmask) : -1;
        const unsigned peers = __match_any_sync(kFull, bin);
        if (in && lane == __ffs(peers) - 1) atomicAdd(&h[bin], unsigned(__popc(peers)));
      }
    }
    __syncthreads();
    for (int b = tid; b < kCtBins; b += kCtThreads) {
      const unsigned v = h[b];
      if (v) atomicAdd(cl.map_shared_rank(&sh.owned[L][b % slice], b / slice), v);
    }
    cl_sync();
    const uint2 hv = *reinterpret_cast<const uint2*>(cl.map_shared_rank(&sh.owned[L][(2 * tid) % slice], (2 * tid) / slice));
    ct_find_split(hv.x, hv.y, need, sh, L);
    const CtSplit sp = sh.split[L];
    P = (P << (shift - nshift)) | sp.bin, shift = nshift, need -= sp.above;
    done = sp.cnt == need || L == 2;  // level 2: P is the exact key, `need` of its ties are taken
  }
  const unsigned take = all ? 0u : need;

  // Compaction in index order: counts per (u, warp), exclusive scan over the block, cluster prefix.
  const unsigned lt = (1u << lane) - 1u;
  auto classify = [&](uint32_t kk, bool& gt, bool& eq) {
    const uint32_t hk = kk >> shift;
    gt = kk != 0u && hk > P;
    eq = kk != 0u && !all && hk == P;
  };
#pragma unroll
  for (int u = 0; u < KPT; ++u) {
    bool gt, eq;
    classify(key[u], gt, eq);
    const unsigned bg = __ballot_sync(kFull, gt), be = __ballot_sync(kFull, eq);
    if (lane == 0) tab[u * kCtWarps + warp] = unsigned(__popc(bg)) | (unsigned(__popc(be)) << 16);
  }
  __syncthreads();
  {
    constexpr int E = KPT * kCtWarps;
    const unsigned v = tid < E ? tab[tid] : 0u;
    unsigned inc = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const unsigned x = __shfl_up_sync(kFull, inc, o);
      if (lane >= o) inc += x;
    }
    if (lane == 31) sh.wsum[warp] = inc;
    __syncthreads();
    unsigned w = sh.wsum[lane];
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const unsigned x = __shfl_up_sync(kFull, w, o);
      if (lane >= o) w += x;
    }
    const unsigned prev = __shfl_sync(kFull, w, (warp + 31) & 31);
    const unsigned block_total = __shfl_sync(kFull, w, 31);
    if (tid < E) tab[tid] = (warp == 0 ? 0u : prev) + inc - v;
    if (tid == 0) sh.counts[0] = block_total & 0xffffu, sh.counts[1] = block_total >> 16;
  }
  cl_sync();  // every block's counts are published; tab is scanned
  if (warp == 0) {
    unsigned g = 0, e = 0;
    if (lane < rank) {
      const unsigned* rc = cl.map_shared_rank(sh.counts, lane);
      g = rc[0], e = rc[1];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) g += __shfl_xor_sync(kFull, g, o), e += __shfl_xor_sync(kFull, e, o);
    if (lane == 0) sh.before[0] = g, sh.before[1] = e;
  }
  __syncthreads();
  cl_arrive();  // no remote reads after this point; the wait below keeps this block's shared
                // memory alive until every block has passed its last remote read
  const unsigned gb = sh.before[0], eb = sh.before[1];
  int32_t* out = a.out + t * a.k;
#pragma unroll
  for (int u = 0; u < KPT; ++u) {
    bool gt, eq;
    classify(key[u], gt, eq);
    const unsigned bg = __ballot_sync(kFull, gt), be = __ballot_sync(kFull, eq);
    const unsigned ex = tab[u * kCtWarps + warp];
    const unsigned eq_before = eb + (ex >> 16) + unsigned(__popc(be & lt));  // equal keys at lower indices
    if (gt || (eq && eq_before < take)) {
      const unsigned pos = gb + (ex & 0xffffu) + unsigned(__popc(bg & lt)) + (eq_before < take ? eq_before : take);
      if (pos < k) out[pos] = int32_t(lo + int64_t(u) * kCtThreads + tid);  // always (a guard, not a case)
    }
  }
  if (rank == 0 && tid == 0) a.out_n[t] = int32_t(all ? total : k);
  cl_wait();
#else
  __trap();  // clusters need sm_90; topk_cluster_plan never picks this kernel there
#endif
}

// How many clusters of `csize` blocks of kernel KPT the current device holds at once (0: none, or
// no clusters at all). Cached per device: the answer does not change, and the launcher may run
// inside a graph capture.
template <int KPT>
int ct_active(int csize) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cache[kMaxDevices][2];  // 0 unknown, else clusters + 1
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) {
    (void)cudaGetLastError();
    return 0;
  }
  std::atomic<int>& c = cache[dev][csize > kCtMinCluster ? 1 : 0];
  const int known = c.load(std::memory_order_acquire);
  if (known) return known - 1;
  int major = 0, clusters = 0;
  bool ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major >= 9;
  if (ok && csize > kCtMinCluster)  // 16 blocks per cluster is a non-portable size
    ok = cudaFuncSetAttribute(topk_cluster_kernel<KPT>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess;
  if (ok) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(unsigned(csize)), cfg.blockDim = dim3(kCtThreads);
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = unsigned(csize), attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr, cfg.numAttrs = 1;
    ok = cudaOccupancyMaxActiveClusters(&clusters, topk_cluster_kernel<KPT>, &cfg) == cudaSuccess;
  }
  (void)cudaGetLastError();  // a refused query leaves no sticky error behind
  if (!ok || clusters < 0) clusters = 0;
  c.store(clusters + 1, std::memory_order_release);
  return clusters;
}

int ct_active_kpt(int kpt, int csize) {
  return kpt == 8 ? ct_active<8>(csize) : kpt == 16 ? ct_active<16>(csize) : kpt == 32 ? ct_active<32>(csize) : 0;
}

}  // namespace

bool topk_cluster_plan(const IndexTopkArgs& a, int* csize, int* kpt) {
  if (a.cluster != 0 && a.cluster != 8 && a.cluster != 16) return false;
  if (a.T <= 0 || a.T > INT32_MAX / 16 || a.ratio <= 0 || a.k <= 0 || a.k > INT32_MAX) return false;
  const int64_t clen_max = (a.start + a.T) / a.ratio;  // clen grows with the row
  int p[2] = {0, 0}, active[2] = {0, 0};  // [0]: 16 blocks, [1]: 8
  for (int j = 0; j < 2; ++j) {
    const int c = j == 0 ? 16 : 8;
    if (a.cluster != 0 && a.cluster != c) continue;
    const int64_t per = clen_max > 0 ? (clen_max + c - 1) / c : 0;
    const int64_t need = (per + kCtThreads - 1) / kCtThreads;
    p[j] = need <= 8 ? 8 : need <= 16 ? 16 : need <= 32 ? 32 : 0;
    if (p[j]) active[j] = ct_active_kpt(p[j], c);
  }
  // 16 blocks per row while every row's cluster is resident at once (or 8 holds no more rows).
  const bool use16 = active[0] > 0 && (a.T <= active[0] || active[1] <= active[0]);
  if (!use16 && active[1] <= 0) return false;
  *csize = use16 ? 16 : 8, *kpt = use16 ? p[0] : p[1];
  return true;
}

cudaError_t launch_topk_cluster(const IndexTopkArgs& a, int csize, int kpt, cudaStream_t s) {
  const dim3 grid(unsigned(a.T * csize));
  switch (kpt) {
    case 8: return launch_kernel_cluster(topk_cluster_kernel<8>, grid, kCtThreads, 0, s, unsigned(csize), a, csize);
    case 16: return launch_kernel_cluster(topk_cluster_kernel<16>, grid, kCtThreads, 0, s, unsigned(csize), a, csize);
    case 32: return launch_kernel_cluster(topk_cluster_kernel<32>, grid, kCtThreads, 0, s, unsigned(csize), a, csize);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace flashseek::ops::cuda::detail
