// Launchers of the CUDA kernels in csrc/vradix_kernels.cu: raw device pointers and a stream, no torch types, so the
// .cu file compiles without torch's headers. csrc/bindings.cpp validates the tensors and calls these. Each returns
// cudaGetLastError() after its launch(es). Index launchers are instantiated for int32_t and int64_t.
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

namespace vradix_cuda {

int tile();        // pages (or prefix positions) one block covers
int64_t no_key();  // verify's "no violation" sentinel in out[1]

template <typename T>
cudaError_t stamp(int* page_epoch, const T* loc, int64_t n, int epoch, int64_t page_size, cudaStream_t stream);

// out = [count, first key] (key = row * width + position), accumulated with atomics; out must hold {0, no_key()}.
template <typename T>
cudaError_t verify(const int* page_epoch, const T* req_to_token, int64_t stride, const int64_t* rows,
                   const int64_t* prefix_lens, const int* expected, int64_t* out, int64_t n, int64_t width,
                   int64_t page_size, cudaStream_t stream);

template <typename T>
cudaError_t row_epochs(const int* page_epoch, const T* row, int64_t length, int64_t page_size, int* out,
                       cudaStream_t stream);

// invalidate in two passes: per-block stale counts, then (with their inclusive cumsum) the ascending page ids.
cudaError_t count_stale(const int* page_epoch, const uint8_t* pinned, int64_t n, int epoch, int64_t* counts,
                        int64_t blocks, cudaStream_t stream);
cudaError_t scatter_stale(const int* page_epoch, const uint8_t* pinned, int64_t n, int epoch,
                          const int64_t* block_ends, const int64_t* counts, int64_t* out, int64_t blocks,
                          cudaStream_t stream);

cudaError_t fingerprint_words(const uint32_t* words, int64_t n, int64_t first_pos, unsigned long long* out,
                              int max_blocks, cudaStream_t stream);

}  // namespace vradix_cuda
