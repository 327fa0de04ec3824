// The CUDA kernels behind vradix._C: KV page epochs and the weight-fingerprint digest (semantics:
// python/vradix/kernels/reference.py; the operations are listed in csrc/bindings.cpp).
//
// This file holds only the kernels and their launchers (raw pointers and a stream, no torch headers), so nvcc never
// parses torch's headers; csrc/bindings.cpp checks the tensors and calls the launchers (csrc/vradix_kernels.h).
#include <algorithm>
#include <cstdint>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "fingerprint_digest.h"
#include "vradix_kernels.h"

namespace {


constexpr int kThreads = 256;
constexpr int kItems = 4;  // elements per thread: 1024 per block keeps loads coalesced and blocks few
constexpr int kTile = kThreads * kItems;
constexpr int64_t kNoKey = int64_t(1) << 62;

struct MinOp {
  __device__ __forceinline__ int64_t operator()(int64_t a, int64_t b) const { return a < b ? a : b; }
};

template <typename T>
__global__ void stamp_kernel(int* __restrict__ page_epoch, const T* __restrict__ loc, int64_t n, int epoch,
                             int64_t page_size) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    page_epoch[static_cast<int64_t>(loc[i]) / page_size] = epoch;
}

template <typename T>
__global__ void verify_kernel(const int* __restrict__ page_epoch, const T* __restrict__ r2t, int64_t stride,
                              const int64_t* __restrict__ rows, const int64_t* __restrict__ prefix_lens,
                              const int* __restrict__ expected, int64_t* __restrict__ out, int64_t width,
                              int64_t page_size) {
  using Reduce = cub::BlockReduce<int64_t, kThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  const int64_t i = blockIdx.x;
  const int64_t plen = prefix_lens[i];
  const int64_t base = (int64_t)blockIdx.y * kTile;
  if (base >= plen) return;
  const T* row = r2t + rows[i] * stride;
  const int want = expected[i];
  int64_t count = 0, key = kNoKey;
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int64_t p = base + k * kThreads + threadIdx.x;
    if (p < plen && page_epoch[static_cast<int64_t>(row[p]) / page_size] != want) {
      ++count;
      key = min(key, i * width + p);
    }
  }
  count = Reduce(tmp).Sum(count);
  __syncthreads();
  key = Reduce(tmp).Reduce(key, MinOp());
  if (threadIdx.x == 0 && count > 0) {
    atomicAdd(reinterpret_cast<unsigned long long*>(out), static_cast<unsigned long long>(count));
    atomicMin(reinterpret_cast<long long*>(out + 1), static_cast<long long>(key));
  }
}

template <typename T>
__global__ void row_epochs_kernel(const int* __restrict__ page_epoch, const T* __restrict__ row, int64_t length,
                                  int64_t page_size, int* __restrict__ out) {
  for (int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; p < length;
       p += (int64_t)gridDim.x * blockDim.x)
    out[p] = page_epoch[static_cast<int64_t>(row[p]) / page_size];
}

__device__ __forceinline__ bool is_stale(const int* page_epoch, const uint8_t* pinned, int64_t p, int64_t n,
                                         int epoch) {
  if (p >= n) return false;
  const int e = page_epoch[p];
  return e >= 0 && e < epoch && (pinned == nullptr || pinned[p] == 0);
}

// Thread t owns the kItems consecutive pages [tile + t*kItems, ...), so a block scan over per-thread counts gives
// each stale page its rank in ascending order.
__global__ void count_stale_kernel(const int* __restrict__ page_epoch, const uint8_t* __restrict__ pinned,
                                   int64_t n, int epoch, int64_t* __restrict__ counts) {
  using Reduce = cub::BlockReduce<int64_t, kThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  const int64_t first = (int64_t)blockIdx.x * kTile + (int64_t)threadIdx.x * kItems;
  int64_t c = 0;
#pragma unroll
  for (int k = 0; k < kItems; ++k) c += is_stale(page_epoch, pinned, first + k, n, epoch);
  c = Reduce(tmp).Sum(c);
  if (threadIdx.x == 0) counts[blockIdx.x] = c;
}

__global__ void scatter_stale_kernel(const int* __restrict__ page_epoch, const uint8_t* __restrict__ pinned,
                                     int64_t n, int epoch, const int64_t* __restrict__ block_ends,
                                     const int64_t* __restrict__ counts, int64_t* __restrict__ out) {
  using Scan = cub::BlockScan<int64_t, kThreads>;
  __shared__ typename Scan::TempStorage tmp;
  const int64_t first = (int64_t)blockIdx.x * kTile + (int64_t)threadIdx.x * kItems;
  bool stale[kItems];
  int64_t c = 0;
#pragma unroll
  for (int k = 0; k < kItems; ++k) c += (stale[k] = is_stale(page_epoch, pinned, first + k, n, epoch));
  int64_t offset;
  Scan(tmp).ExclusiveSum(c, offset);
  offset += block_ends[blockIdx.x] - counts[blockIdx.x];
#pragma unroll
  for (int k = 0; k < kItems; ++k)
    if (stale[k]) out[offset++] = first + k;
}

// ---- weight fingerprint (per-word digest: fingerprint_digest.h) ------------------------------------------------------
using vradix_fp::digest_word;

// Grid-stride: thread t digests kVec consecutive words per step (one 16-byte load when kVec == 4, which the host picks
// only for a 16-byte aligned base), then each lane is block-reduced and added to out once per block. Addition mod 2^64
// is order-free, so the result does not depend on the grid or the atomics' order.
template <int kVec>
__global__ void fingerprint_kernel(const uint32_t* __restrict__ words, int64_t n, int64_t first_pos,
                                   unsigned long long* __restrict__ out) {
  unsigned long long acc[vradix_fp::kLanes] = {0, 0, 0, 0};
  const int64_t step = (int64_t)gridDim.x * blockDim.x * kVec;
  for (int64_t base = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * kVec; base < n; base += step) {
    if (kVec == 4 && base + 4 <= n) {
      const uint4 v = *reinterpret_cast<const uint4*>(words + base);
      digest_word(v.x, first_pos + base, acc);
      digest_word(v.y, first_pos + base + 1, acc);
      digest_word(v.z, first_pos + base + 2, acc);
      digest_word(v.w, first_pos + base + 3, acc);
    } else {
      for (int k = 0; k < kVec && base + k < n; ++k) digest_word(words[base + k], first_pos + base + k, acc);
    }
  }
  using Reduce = cub::BlockReduce<unsigned long long, kThreads>;
  __shared__ typename Reduce::TempStorage tmp;
#pragma unroll
  for (int l = 0; l < vradix_fp::kLanes; ++l) {
    const unsigned long long total = Reduce(tmp).Sum(acc[l]);
    __syncthreads();
    if (threadIdx.x == 0 && total != 0) atomicAdd(out + l, total);
  }
}

int blocks_for(int64_t n) { return static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, 65535)); }

}  // namespace

namespace vradix_cuda {

int tile() { return kTile; }

int64_t no_key() { return kNoKey; }

template <typename T>
cudaError_t stamp(int* page_epoch, const T* loc, int64_t n, int epoch, int64_t page_size, cudaStream_t stream) {
  stamp_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(page_epoch, loc, n, epoch, page_size);
  return cudaGetLastError();
}

template <typename T>
cudaError_t verify(const int* page_epoch, const T* req_to_token, int64_t stride, const int64_t* rows,
                   const int64_t* prefix_lens, const int* expected, int64_t* out, int64_t n, int64_t width,
                   int64_t page_size, cudaStream_t stream) {
  dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>((width + kTile - 1) / kTile));
  verify_kernel<T><<<grid, kThreads, 0, stream>>>(page_epoch, req_to_token, stride, rows, prefix_lens, expected, out,
                                                  width, page_size);
  return cudaGetLastError();
}

template <typename T>
cudaError_t row_epochs(const int* page_epoch, const T* row, int64_t length, int64_t page_size, int* out,
                       cudaStream_t stream) {
  row_epochs_kernel<T><<<blocks_for(length), kThreads, 0, stream>>>(page_epoch, row, length, page_size, out);
  return cudaGetLastError();
}

cudaError_t count_stale(const int* page_epoch, const uint8_t* pinned, int64_t n, int epoch, int64_t* counts,
                        int64_t blocks, cudaStream_t stream) {
  count_stale_kernel<<<blocks, kThreads, 0, stream>>>(page_epoch, pinned, n, epoch, counts);
  return cudaGetLastError();
}

cudaError_t scatter_stale(const int* page_epoch, const uint8_t* pinned, int64_t n, int epoch,
                          const int64_t* block_ends, const int64_t* counts, int64_t* out, int64_t blocks,
                          cudaStream_t stream) {
  scatter_stale_kernel<<<blocks, kThreads, 0, stream>>>(page_epoch, pinned, n, epoch, block_ends, counts, out);
  return cudaGetLastError();
}

cudaError_t fingerprint_words(const uint32_t* words, int64_t n, int64_t first_pos, unsigned long long* out,
                              int max_blocks, cudaStream_t stream) {
  const bool vec = reinterpret_cast<uintptr_t>(words) % 16 == 0;
  const int64_t per_block = (int64_t)kThreads * (vec ? 4 : 1);
  const int blocks = static_cast<int>(std::min<int64_t>((n + per_block - 1) / per_block, max_blocks));
  if (vec)
    fingerprint_kernel<4><<<blocks, kThreads, 0, stream>>>(words, n, first_pos, out);
  else
    fingerprint_kernel<1><<<blocks, kThreads, 0, stream>>>(words, n, first_pos, out);
  return cudaGetLastError();
}

#define VRADIX_INDEX_LAUNCHERS(T)                                                                                   \
  template cudaError_t stamp<T>(int*, const T*, int64_t, int, int64_t, cudaStream_t);                             \
  template cudaError_t verify<T>(const int*, const T*, int64_t, const int64_t*, const int64_t*, const int*,       \
                                 int64_t*, int64_t, int64_t, int64_t, cudaStream_t);                             \
  template cudaError_t row_epochs<T>(const int*, const T*, int64_t, int64_t, int*, cudaStream_t);
VRADIX_INDEX_LAUNCHERS(int32_t)
VRADIX_INDEX_LAUNCHERS(int64_t)
#undef VRADIX_INDEX_LAUNCHERS

}  // namespace vradix_cuda
