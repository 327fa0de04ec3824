// CUDA implementations of the vradix KV page-epoch kernels and the weight-fingerprint digest. Semantics:
// python/vradix/kernels/reference.py.
//
//   stamp(page_epoch, loc, epoch, page_size)                     page_epoch[loc // page_size] = epoch
//   verify(page_epoch, req_to_token, rows, prefix_lens,
//          expected_epochs, page_size, width) -> int64[3]         [count, first_index, first_pos] (-1 when none)
//   row_epochs(page_epoch, req_to_token, row, length, page_size) per-position epoch of one row (spans' gather)
//   invalidate(page_epoch, epoch, pinned_mask?) -> int64[k]       ascending ids of unpinned pages with 0 <= e < epoch
//   fingerprint_words(words, first_pos, out)                     out[l] += digest lane l of int32 words (in place)
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "fingerprint_digest.h"

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
using vradix_fp::kLanes;

// Grid-stride: thread t digests kVec consecutive words per step (one 16-byte load when kVec == 4, which the host picks
// only for a 16-byte aligned base), then each lane is block-reduced and added to out once per block. Addition mod 2^64
// is order-free, so the result does not depend on the grid or the atomics' order.
template <int kVec>
__global__ void fingerprint_kernel(const uint32_t* __restrict__ words, int64_t n, int64_t first_pos,
                                   unsigned long long* __restrict__ out) {
  unsigned long long acc[kLanes] = {0, 0, 0, 0};
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
  for (int l = 0; l < kLanes; ++l) {
    const unsigned long long total = Reduce(tmp).Sum(acc[l]);
    __syncthreads();
    if (threadIdx.x == 0 && total != 0) atomicAdd(out + l, total);
  }
}

void check_table(const torch::Tensor& page_epoch) {
  TORCH_CHECK(page_epoch.is_cuda() && page_epoch.scalar_type() == torch::kInt32 && page_epoch.is_contiguous(),
              "vradix: page_epoch must be a contiguous int32 CUDA tensor");
}

void check_index(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda() && (t.scalar_type() == torch::kInt32 || t.scalar_type() == torch::kInt64),
              "vradix: ", name, " must be an int32 or int64 CUDA tensor");
}

int blocks_for(int64_t n) { return static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, 65535)); }

void stamp(torch::Tensor page_epoch, torch::Tensor loc, int64_t epoch, int64_t page_size) {
  check_table(page_epoch);
  check_index(loc, "loc");
  const int64_t n = loc.numel();
  if (n == 0) return;
  const c10::cuda::CUDAGuard guard(page_epoch.device());
  auto stream = at::cuda::getCurrentCUDAStream();
  auto l = loc.contiguous();
  AT_DISPATCH_INDEX_TYPES(l.scalar_type(), "vradix_stamp", [&] {
    stamp_kernel<index_t><<<blocks_for(n), kThreads, 0, stream>>>(page_epoch.data_ptr<int>(), l.data_ptr<index_t>(),
                                                                 n, static_cast<int>(epoch), page_size);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

torch::Tensor verify(torch::Tensor page_epoch, torch::Tensor req_to_token, torch::Tensor rows,
                     torch::Tensor prefix_lens, torch::Tensor expected_epochs, int64_t page_size, int64_t width) {
  check_table(page_epoch);
  check_index(req_to_token, "req_to_token");
  TORCH_CHECK(req_to_token.dim() == 2 && req_to_token.stride(1) == 1, "vradix: req_to_token must be [rows, ctx]");
  const c10::cuda::CUDAGuard guard(page_epoch.device());
  auto opts = torch::TensorOptions().dtype(torch::kInt64).device(page_epoch.device());
  auto out = torch::tensor(std::vector<int64_t>{0, kNoKey}, opts);
  const int64_t n = rows.numel();
  if (n > 0 && width > 0) {
    auto r = rows.to(opts).contiguous();
    auto pl = prefix_lens.to(opts).contiguous();
    auto ex = expected_epochs.to(page_epoch.device(), torch::kInt32).contiguous();
    dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>((width + kTile - 1) / kTile));
    auto stream = at::cuda::getCurrentCUDAStream();
    AT_DISPATCH_INDEX_TYPES(req_to_token.scalar_type(), "vradix_verify", [&] {
      verify_kernel<index_t><<<grid, kThreads, 0, stream>>>(
          page_epoch.data_ptr<int>(), req_to_token.data_ptr<index_t>(), req_to_token.stride(0),
          r.data_ptr<int64_t>(), pl.data_ptr<int64_t>(), ex.data_ptr<int>(), out.data_ptr<int64_t>(),
          req_to_token.size(1), page_size);
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  auto key = out[1];
  auto found = key != kNoKey;
  auto none = torch::full({}, static_cast<int64_t>(-1), opts);
  return torch::stack({out[0], torch::where(found, key.div(static_cast<int64_t>(req_to_token.size(1)), "floor"), none),
                       torch::where(found, key.remainder(static_cast<int64_t>(req_to_token.size(1))), none)});
}

torch::Tensor row_epochs(torch::Tensor page_epoch, torch::Tensor req_to_token, int64_t row, int64_t length,
                         int64_t page_size) {
  check_table(page_epoch);
  check_index(req_to_token, "req_to_token");
  const c10::cuda::CUDAGuard guard(page_epoch.device());
  auto out = torch::empty({length}, page_epoch.options());
  if (length > 0) {
    auto r = req_to_token[row].contiguous();
    auto stream = at::cuda::getCurrentCUDAStream();
    AT_DISPATCH_INDEX_TYPES(r.scalar_type(), "vradix_row_epochs", [&] {
      row_epochs_kernel<index_t><<<blocks_for(length), kThreads, 0, stream>>>(
          page_epoch.data_ptr<int>(), r.data_ptr<index_t>(), length, page_size, out.data_ptr<int>());
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return out;
}

torch::Tensor invalidate(torch::Tensor page_epoch, int64_t epoch, c10::optional<torch::Tensor> pinned_mask) {
  check_table(page_epoch);
  const c10::cuda::CUDAGuard guard(page_epoch.device());
  auto opts = torch::TensorOptions().dtype(torch::kInt64).device(page_epoch.device());
  const int64_t n = page_epoch.numel();
  const int64_t blocks = (n + kTile - 1) / kTile;
  if (blocks == 0) return torch::empty({0}, opts);
  torch::Tensor pinned;
  const uint8_t* pinned_ptr = nullptr;
  if (pinned_mask.has_value()) {
    TORCH_CHECK(pinned_mask->numel() == n, "vradix: pinned_mask must have one entry per page");
    pinned = pinned_mask->to(page_epoch.device(), torch::kUInt8).contiguous();
    pinned_ptr = pinned.data_ptr<uint8_t>();
  }
  auto stream = at::cuda::getCurrentCUDAStream();
  auto counts = torch::empty({blocks}, opts);
  count_stale_kernel<<<blocks, kThreads, 0, stream>>>(page_epoch.data_ptr<int>(), pinned_ptr, n,
                                                       static_cast<int>(epoch), counts.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  auto ends = counts.cumsum(0);
  const int64_t total = ends[-1].item<int64_t>();
  auto out = torch::empty({total}, opts);
  if (total > 0) {
    scatter_stale_kernel<<<blocks, kThreads, 0, stream>>>(page_epoch.data_ptr<int>(), pinned_ptr, n,
                                                          static_cast<int>(epoch), ends.data_ptr<int64_t>(),
                                                          counts.data_ptr<int64_t>(), out.data_ptr<int64_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return out;
}

void fingerprint_words(torch::Tensor words, int64_t first_pos, torch::Tensor out) {
  TORCH_CHECK(words.is_cuda() && words.scalar_type() == torch::kInt32 && words.dim() == 1 && words.is_contiguous(),
              "vradix: words must be a contiguous 1-D int32 CUDA tensor");
  TORCH_CHECK(out.device() == words.device() && out.scalar_type() == torch::kInt64 && out.numel() == kLanes &&
                  out.is_contiguous(),
              "vradix: out must be a contiguous int64 tensor of ", kLanes, " lanes on the words' device");
  TORCH_CHECK(first_pos >= 0, "vradix: first_pos must be >= 0");
  const int64_t n = words.numel();
  if (n == 0) return;
  const c10::cuda::CUDAGuard guard(words.device());
  auto stream = at::cuda::getCurrentCUDAStream();
  const auto* w = reinterpret_cast<const uint32_t*>(words.data_ptr<int>());
  auto* o = reinterpret_cast<unsigned long long*>(out.data_ptr<int64_t>());
  const bool vec = reinterpret_cast<uintptr_t>(w) % 16 == 0;
  const int64_t per_block = (int64_t)kThreads * (vec ? 4 : 1);
  const int64_t max_blocks = (int64_t)at::cuda::getCurrentDeviceProperties()->multiProcessorCount * 8;
  const int blocks = static_cast<int>(std::min<int64_t>((n + per_block - 1) / per_block, max_blocks));
  if (vec)
    fingerprint_kernel<4><<<blocks, kThreads, 0, stream>>>(w, n, first_pos, o);
  else
    fingerprint_kernel<1><<<blocks, kThreads, 0, stream>>>(w, n, first_pos, o);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "vradix KV page-epoch kernels and weight-fingerprint digest (CUDA)";
  m.def("stamp", &stamp, "page_epoch[loc // page_size] = epoch");
  m.def("verify", &verify, "fused prefix-epoch check -> [count, first_index, first_pos]");
  m.def("row_epochs", &row_epochs, "per-position epoch of one req_to_token row");
  m.def("invalidate", &invalidate, "ascending ids of unpinned pages stamped with an older epoch",
        py::arg("page_epoch"), py::arg("epoch"), py::arg("pinned_mask") = py::none());
  m.def("fingerprint_words", &fingerprint_words, "out[l] += fingerprint digest lane l of 1-D int32 words, in place",
        py::arg("words"), py::arg("first_pos"), py::arg("out"));
}
