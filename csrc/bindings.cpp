// torch bindings of the vradix CUDA kernels (semantics: python/vradix/kernels/reference.py). Each function checks its
// tensors, then calls a launcher of csrc/vradix_kernels.cu on the current stream of the tensors' device:
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

#include "fingerprint_digest.h"
#include "vradix_kernels.h"

namespace {

void check_launch(cudaError_t err) { TORCH_CHECK(err == cudaSuccess, "vradix: kernel launch failed: ",
                                                 cudaGetErrorString(err)); }

void check_table(const torch::Tensor& page_epoch) {
  TORCH_CHECK(page_epoch.is_cuda() && page_epoch.scalar_type() == torch::kInt32 && page_epoch.is_contiguous(),
              "vradix: page_epoch must be a contiguous int32 CUDA tensor");
}

void check_index(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda() && (t.scalar_type() == torch::kInt32 || t.scalar_type() == torch::kInt64),
              "vradix: ", name, " must be an int32 or int64 CUDA tensor");
}

void stamp(torch::Tensor page_epoch, torch::Tensor loc, int64_t epoch, int64_t page_size) {
  check_table(page_epoch);
  check_index(loc, "loc");
  const int64_t n = loc.numel();
  if (n == 0) return;
  const c10::cuda::CUDAGuard guard(page_epoch.device());
  auto stream = at::cuda::getCurrentCUDAStream();
  auto l = loc.contiguous();
  AT_DISPATCH_INDEX_TYPES(l.scalar_type(), "vradix_stamp", [&] {
    check_launch(vradix_cuda::stamp<index_t>(page_epoch.data_ptr<int>(), l.data_ptr<index_t>(), n,
                                             static_cast<int>(epoch), page_size, stream));
  });
}

torch::Tensor verify(torch::Tensor page_epoch, torch::Tensor req_to_token, torch::Tensor rows,
                     torch::Tensor prefix_lens, torch::Tensor expected_epochs, int64_t page_size, int64_t width) {
  check_table(page_epoch);
  check_index(req_to_token, "req_to_token");
  TORCH_CHECK(req_to_token.dim() == 2 && req_to_token.stride(1) == 1, "vradix: req_to_token must be [rows, ctx]");
  const c10::cuda::CUDAGuard guard(page_epoch.device());
  auto opts = torch::TensorOptions().dtype(torch::kInt64).device(page_epoch.device());
  auto out = torch::tensor(std::vector<int64_t>{0, vradix_cuda::no_key()}, opts);
  const int64_t n = rows.numel();
  if (n > 0 && width > 0) {
    auto r = rows.to(opts).contiguous();
    auto pl = prefix_lens.to(opts).contiguous();
    auto ex = expected_epochs.to(page_epoch.device(), torch::kInt32).contiguous();
    auto stream = at::cuda::getCurrentCUDAStream();
    AT_DISPATCH_INDEX_TYPES(req_to_token.scalar_type(), "vradix_verify", [&] {
      check_launch(vradix_cuda::verify<index_t>(
          page_epoch.data_ptr<int>(), req_to_token.data_ptr<index_t>(), req_to_token.stride(0),
          r.data_ptr<int64_t>(), pl.data_ptr<int64_t>(), ex.data_ptr<int>(), out.data_ptr<int64_t>(), n,
          req_to_token.size(1), page_size, stream));
    });
  }
  auto key = out[1];
  auto found = key != vradix_cuda::no_key();
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
      check_launch(vradix_cuda::row_epochs<index_t>(page_epoch.data_ptr<int>(), r.data_ptr<index_t>(), length,
                                                    page_size, out.data_ptr<int>(), stream));
    });
  }
  return out;
}

torch::Tensor invalidate(torch::Tensor page_epoch, int64_t epoch, c10::optional<torch::Tensor> pinned_mask) {
  check_table(page_epoch);
  const c10::cuda::CUDAGuard guard(page_epoch.device());
  auto opts = torch::TensorOptions().dtype(torch::kInt64).device(page_epoch.device());
  const int64_t n = page_epoch.numel();
  const int64_t blocks = (n + vradix_cuda::tile() - 1) / vradix_cuda::tile();
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
  check_launch(vradix_cuda::count_stale(page_epoch.data_ptr<int>(), pinned_ptr, n, static_cast<int>(epoch),
                                        counts.data_ptr<int64_t>(), blocks, stream));
  auto ends = counts.cumsum(0);
  const int64_t total = ends[-1].item<int64_t>();
  auto out = torch::empty({total}, opts);
  if (total > 0)
    check_launch(vradix_cuda::scatter_stale(page_epoch.data_ptr<int>(), pinned_ptr, n, static_cast<int>(epoch),
                                            ends.data_ptr<int64_t>(), counts.data_ptr<int64_t>(),
                                            out.data_ptr<int64_t>(), blocks, stream));
  return out;
}

void fingerprint_words(torch::Tensor words, int64_t first_pos, torch::Tensor out) {
  TORCH_CHECK(words.is_cuda() && words.scalar_type() == torch::kInt32 && words.dim() == 1 && words.is_contiguous(),
              "vradix: words must be a contiguous 1-D int32 CUDA tensor");
  TORCH_CHECK(out.device() == words.device() && out.scalar_type() == torch::kInt64 &&
                  out.numel() == vradix_fp::kLanes && out.is_contiguous(),
              "vradix: out must be a contiguous int64 tensor of ", vradix_fp::kLanes, " lanes on the words' device");
  TORCH_CHECK(first_pos >= 0, "vradix: first_pos must be >= 0");
  const int64_t n = words.numel();
  if (n == 0) return;
  const c10::cuda::CUDAGuard guard(words.device());
  const int max_blocks = at::cuda::getCurrentDeviceProperties()->multiProcessorCount * 8;
  check_launch(vradix_cuda::fingerprint_words(reinterpret_cast<const uint32_t*>(words.data_ptr<int>()), n, first_pos,
                                              reinterpret_cast<unsigned long long*>(out.data_ptr<int64_t>()),
                                              max_blocks, at::cuda::getCurrentCUDAStream()));
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
